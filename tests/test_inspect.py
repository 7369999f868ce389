"""``minigpt inspect``: every figure the course notes state, as assertions, and each topic's PNG,
JSON and bad input.

The notes' figures: for d = 128, p0·pk first rises at k = 12, rises 492 times in 0..1024 and reaches
-8.36 within 4096; for d = 64 the longest wavelength is about 47,117 and p_t·p_(t+3) = 25.587;
  GELU's tanh form is off by at most 4.73e-4 and GELU(-1) = -0.159; Llama-7B's SwiGLU width is
  11008; on the toy corpus BPE merges u+g first (count 20) and WordPiece g+s (score 0.050 against
  0.028 for u+g), and Unigram's Viterbi keeps hugs whole. Oracles: torch.nn.TransformerEncoderLayer
  for the block, the attention layer's own output for the recomputed weights, the model's MLP for
  the hand computation, exhaustive enumeration for Viterbi.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import assert_user_error, tiny

from minigpt_cli.inspection.figures import to_json

PNG = b"\x89PNG\r\n\x1a\n"


def assert_png(path) -> None:
    from pathlib import Path

    data = Path(path).read_bytes()
    assert data.startswith(PNG) and len(data) > 5_000, path


def assert_keys(result: dict, keys: set) -> None:
    parsed = json.loads(to_json(result))
    assert keys <= set(parsed), keys - set(parsed)


# ----------------------------------------------------------------------------- positions


def test_positions_gives_the_notes_figures(tmp_path):
    from minigpt_cli.inspection.positions import format_positions, positions

    r = positions(dim=128, max_len=4096, output=tmp_path)
    assert r["first_rise"] == 12
    assert (r["rising_steps"], r["rise_window"]) == (492, 1024)
    assert round(r["minimum"], 2) == -8.36 and 0 < r["minimum_at"] < 4096
    assert r["curve"][0] == pytest.approx(64.0)
    assert r["rotation"]["max_error"] < 1e-11 and r["rotation"]["offsets"] == [1, 7, 100]
    # q·k at equal offsets: constant for raw positions and for RoPE, not after projecting additive
    # positions.
    assert r["sinusoidal_identity"]["spread"] < 1e-10
    assert r["sinusoidal_projected"]["spread"] > 1.0
    assert r["rope"]["spread"] < 1e-5
    assert (
        r["rope_float32"]["spread"] < 1e-3
    )  # the model's own float32 angles, positions up to 1003
    assert_png(r["png"])
    assert_keys(
        r,
        {
            "dim",
            "max_len",
            "base",
            "curve",
            "first_rise",
            "rising_steps",
            "rise_window",
            "minimum",
            "minimum_at",
            "longest_wavelength",
            "shortest_wavelength",
            "rotation",
            "pairs",
            "sinusoidal_identity",
            "sinusoidal_projected",
            "rope",
            "rope_float32",
            "png",
        },
    )
    text = format_positions(r)
    assert (
        "first rise at k = 12" in text and "492 rising steps in 0..1024" in text and "-8.36" in text
    )


def test_positions_at_d64_and_the_models_table():
    from minigpt_cli.inspection.positions import positions, sinusoidal_table64
    from minigpt_cli.model.gpt import sinusoidal_table

    r = positions(dim=64, max_len=256)
    assert r["longest_wavelength"] == pytest.approx(47117, abs=1)
    assert r["sinusoidal_identity"]["scores"][0] == pytest.approx(25.587, abs=1e-3)
    assert torch.allclose(sinusoidal_table64(300, 64).float(), sinusoidal_table(300, 64), atol=1e-6)


# ----------------------------------------------------------------------------- block


def test_block_matches_torch_and_traces_shapes(tmp_path):
    from minigpt_cli.inspection.block import block, format_block

    r = block(with_trace=True, output=tmp_path)
    for key in ("pre", "post"):
        assert r[key]["max_error"] < 1e-5, r[key]
        assert r[key]["max_error_without_mask"] > 0.1  # the check can fail: the mask matters
    t = r["trace"]
    assert t["config"] == {
        "n_layer": 2,
        "batch": 2,
        "seq_len": 4,
        "n_embd": 64,
        "n_head": 4,
        "d_ff": 256,
        "vocab_size": 65,
    }
    shapes = {s["name"]: s["shape"] for s in t["steps"]}
    assert shapes["h.1 x + mlp (block output)"] == [2, 4, 64]
    assert shapes["h.0 attn scores q·kᵀ/√hs (causal)"] == [2, 4, 4, 4]
    assert shapes["h.0 mlp c_fc"] == [2, 4, 256] and shapes["lm_head"] == [2, 4, 65]
    assert t["dtype_kept"] and {s["dtype"] for s in t["steps"]} == {"float32"}
    assert len(t["grad_norms"]) == 28 and all(0 < g < math.inf for g in t["grad_norms"].values())
    assert_png(r["png"])
    assert_keys(r, {"config", "pre", "post", "trace", "png"})
    assert "norm_first=True" in format_block(r)


def test_block_trace_keeps_bfloat16():
    from minigpt_cli.inspection.block import trace

    t = trace(dtype="bfloat16")
    assert t["dtype_kept"] and {s["dtype"] for s in t["steps"]} == {"bfloat16"}


# ----------------------------------------------------------------------------- residual


def test_residual_grows_like_sqrt_depth_unless_scaled(tmp_path):
    from minigpt_cli.inspection.residual import format_residual, residual

    r = residual(depths=(4, 16), seeds=2, output=tmp_path)
    shallow, deep = r["depths"]
    assert len(shallow["unscaled"]["mean"]) == 5 and len(deep["scaled"]["mean"]) == 17
    assert 1.7 < r["growth"][0]["ratio"] < 2.4  # the notes: about x2 for 4x the depth (sqrt(4) = 2)
    assert deep["scaled"]["mean"][-1] == pytest.approx(shallow["scaled"]["mean"][-1], rel=0.1)
    assert deep["scaled"]["mean"][-1] < deep["unscaled"]["mean"][-1] / 3
    assert_png(r["png"])
    assert_keys(r, {"config", "depths", "growth", "png"})
    assert "with 1/√(2L)" in format_residual(r)


# ----------------------------------------------------------------------------- a tiny trained run


@pytest.fixture(scope="module")
def gqa_run(tmp_path_factory, data_dir):
    """tiny.yaml with RoPE and 4 query heads sharing 2 key/value heads, 8 steps (the maps need a
    checkpoint, not a good model)."""
    from minigpt_cli import train

    out = tmp_path_factory.mktemp("inspect-runs")
    cfg = tiny(
        data_dir,
        "train.max_iters=8",
        "train.eval_interval=8",
        "train.eval_iters=2",
        "model.pos_encoding=rope",
        "model.n_head=4",
        "model.n_kv_head=2",
        f"train.out_dir={out}",
        "train.eval_at_start=false",
    )
    return train(cfg).run_dir


def test_attention_maps_of_a_gqa_rope_run(gqa_run, tmp_path):
    from minigpt_cli.inspection.attention import attention, format_attention

    r = attention(gqa_run, "ROMEO: thou", output=tmp_path)
    assert (r["n_layer"], r["n_head"], r["n_kv_head"], r["pos_encoding"]) == (2, 4, 2, "rope")
    assert r["tokens"] == list("ROMEO: thou") and len(r["heads"]) == 8
    assert [h["kv_head"] for h in r["heads"][:4]] == [0, 0, 1, 1]
    w = torch.tensor(r["weights"])  # (layer, head, query, key)
    assert w.shape == (2, 4, 11, 11)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 11), atol=1e-5)
    assert float(w.triu(diagonal=1).abs().max()) == 0.0  # causal: no weight on later keys
    assert r["max_check_error"] < 1e-5  # weights·v through c_proj = the layer's own output
    assert all(0 <= h["mean_entropy"] <= r["uniform_entropy"] + 1e-6 for h in r["heads"])
    assert_png(r["png"])
    assert_keys(
        r,
        {
            "run",
            "checkpoint",
            "n_layer",
            "n_head",
            "n_kv_head",
            "pos_encoding",
            "tokens",
            "ids",
            "heads",
            "uniform_entropy",
            "weights",
            "max_check_error",
            "png",
        },
    )
    assert "(kv1)" in format_attention(r)


@pytest.mark.parametrize(
    "prompt", ["ROMEO: thou", "ROMEO: thou art a villain, sir"], ids=["labelled", "unlabelled"]
)  # tick labels up to LABELLED (24) tokens
def test_the_attention_figure_of_two_heads_holds_its_title_and_labels(
    tmp_path, data_dir, monkeypatch, prompt
):
    """A 2 x 2 grid is the narrowest figure: its title and every label stay inside it (the title was
    clipped)."""
    from minigpt_cli import train
    from minigpt_cli.inspection import attention as topic

    figures = []
    save_png = topic.save_png

    def keep(fig, folder, name):
        figures.append(fig)
        return save_png(fig, folder, name)

    monkeypatch.setattr(topic, "save_png", keep)
    run = train(
        tiny(
            data_dir, "train.max_iters=2", "train.eval_at_start=false", f"train.out_dir={tmp_path}"
        ),
        echo=lambda m: None,
        progress=False,
    ).run_dir
    r = topic.attention(run, prompt, output=tmp_path)
    assert (r["n_layer"], r["n_head"]) == (2, 2)
    assert_png(r["png"])
    fig = figures[0]
    drawn = fig.get_tightbbox(
        fig.canvas.get_renderer()
    )  # inches, every artist: title, ticks, colour bar
    width, height = fig.get_size_inches()
    assert drawn.x0 >= 0 and drawn.y0 >= 0 and drawn.x1 <= width and drawn.y1 <= height, (
        drawn,
        width,
        height,
    )


def test_residual_of_a_trained_run(gqa_run, cli, tmp_path):
    res = cli(
        "inspect", "residual", "--run", gqa_run, "--windows", "2", "--json", "--output", tmp_path
    )
    assert res.exit_code == 0, res
    r = json.loads(res.stdout)
    assert len(r["trained"]) == len(r["init"]) == 3 and all(v > 0 for v in r["trained"] + r["init"])
    assert r["scale_residual_init"] is True and r["windows"] == 2
    assert_png(tmp_path / "residual.png")


def test_attention_refuses_a_prompt_past_block_size(gqa_run, cli, tmp_path):
    res = cli("inspect", "attention", "--run", gqa_run, "--prompt", "a" * 33, "--output", tmp_path)
    assert_user_error(res, "33 tokens", "block_size 32")
    assert not (tmp_path / "attention.png").exists()


@pytest.mark.parametrize("topic", [["attention", "--prompt", "hi"], ["residual"]])
def test_a_run_without_a_checkpoint_is_refused(cli, tmp_path, topic):
    empty = tmp_path / "runs" / "empty"
    empty.mkdir(parents=True)
    res = cli("inspect", *topic, "--run", empty, "--output", tmp_path)
    assert_user_error(res, "no checkpoint at", "train first")


# ----------------------------------------------------------------------------- activations, ffn


def test_activations_give_the_gelu_tanh_error(tmp_path):
    from minigpt_cli.inspection.activations import activations, format_activations

    r = activations(output=tmp_path)
    assert r["gelu_tanh_max_error"] == pytest.approx(4.73e-4, abs=5e-7)
    assert r["gelu_tanh_max_error_at"] == pytest.approx(2.70, abs=0.01)
    at = r["table"]["x"].index(-1.0)
    assert round(r["table"]["gelu"][at], 3) == -0.159 and r["table"]["relu"][at] == 0.0
    assert r["table"]["silu"][at] == pytest.approx(-1 / (1 + math.e))
    assert_png(r["png"])
    assert_keys(r, {"range", "table", "gelu_tanh_max_error", "gelu_tanh_max_error_at", "png"})
    assert "4.732e-04" in format_activations(r)


def test_ffn_by_hand_and_the_swiglu_width(cli, tmp_path):
    from minigpt_cli.inspection.ffn import ffn, format_ffn, swiglu_width

    res = cli(
        "inspect", "ffn", "--json", "--output", tmp_path
    )  # the notes' x = [1, 2] and its variant [2, -1]
    assert res.exit_code == 0, res
    r = json.loads(res.stdout)
    first, variant = r["steps"]
    assert (first["z"], first["h"], first["y"], first["x_plus_y"]) == (
        [2, 1, -1.5],
        [2, 1, 0],
        [2, 1],
        [3, 3],
    )
    assert (variant["h"], variant["off"], variant["y"]) == ([1.5, 0, 2], [1], [3.5, -2])
    assert first["model_max_error"] < 1e-6 and variant["model_max_error"] < 1e-6
    assert r["swiglu"]["d_ff"] == 11008 and r["swiglu"]["two_thirds"] == pytest.approx(
        10922.67, abs=0.01
    )
    assert (
        swiglu_width(64, 1)["d_ff"] == 170
    )  # 2/3·256 = 170.67, floored as Llama's int() does, no rounding up
    assert r["png"] == str(tmp_path / "ffn.png")
    assert_png(r["png"])
    assert {
        "activation",
        "d_model",
        "d_ff",
        "W1",
        "b1",
        "W2",
        "b2",
        "steps",
        "swiglu",
        "png",
    } <= set(r)
    assert "z3 = 1·0.5 + 2·(-1) = -1.5" in format_ffn(ffn())
    glu = ffn(
        {
            "activation": "swiglu",
            "W1": [[1, 0], [0, 1]],
            "V": [[1, 1], [1, -1]],
            "W2": [[1, 0], [0, 1]],
        },
        xs=[(1.0, 2.0)],
    )
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    assert glu["steps"][0]["h"] == pytest.approx([silu(1) * 3, silu(2) * -1])
    assert glu["steps"][0]["model_max_error"] < 1e-6


def test_ffn_refuses_weights_of_the_wrong_shape(cli, tmp_path):
    bad = tmp_path / "w.json"
    bad.write_text(json.dumps({"W1": [[1, 0, 1], [0, 1, 1]], "W2": [[1, 0], [0, 1]]}))
    assert_user_error(
        cli("inspect", "ffn", "--weights", bad, "--output", tmp_path), "W2 has shape 2 x 2", "3 x 2"
    )
    assert_user_error(cli("inspect", "ffn", "--x", "1,2,3", "--output", tmp_path), "d_model = 2")
    # Weights that do not fit each other are blamed before --x, which W1 alone sets the width of.
    bad.write_text(json.dumps({"W1": [[1, 2]], "W2": [[1], [2], [3]]}))
    for x in ([], ["--x", "1"]):
        assert_user_error(
            cli("inspect", "ffn", "--weights", bad, *x, "--output", tmp_path),
            "W2 has shape 3 x 1, but 2 x 1 is needed",
            "fix the weights file",
        )


# ----------------------------------------------------------------------------- tokenize


def test_tokenize_toy_corpus(tmp_path):
    from minigpt_cli.inspection.tokenize import format_tokenize, tokenize

    r = tokenize(output=tmp_path)
    assert r["bpe"][0] == {"a": "u", "b": "g", "count": 20}
    assert (r["wordpiece"][0]["a"], r["wordpiece"][0]["b"]) == ("##g", "##s")
    assert r["wordpiece"][0]["score"] == pytest.approx(0.050)
    first = {(m["a"], m["b"]): m["score"] for m in r["wordpiece_first"]}
    assert first[("##u", "##g")] == pytest.approx(20 / (36 * 20))  # 0.028: u is everywhere
    assert r["bpe_pieces"] == ["hugs", "b", "ug", "s"] and r["wordpiece_pieces"] == [
        "hugs",
        "bu",
        "##gs",
    ]
    hugs = r["unigram"]["words"][0]
    assert (
        hugs["word"] == "hugs"
        and hugs["count"] == 8
        and hugs["viterbi"] == ["hugs"]
        and hugs["viterbi_is_best"]
    )
    logp = {" + ".join(s["pieces"]): s["log_prob"] for s in hugs["segmentations"]}
    assert logp["hugs"] == pytest.approx(math.log(5 / 236)) and logp["hug + s"] < logp["hugs"]
    assert r["unigram"]["words"][1]["viterbi_is_best"]
    assert_png(r["png"])
    assert_keys(
        r,
        {
            "mode",
            "words",
            "text",
            "bpe",
            "bpe_first",
            "bpe_pieces",
            "wordpiece",
            "wordpiece_first",
            "wordpiece_pieces",
            "unigram",
            "png",
        },
    )
    assert "1. u + g -> ug   count 20" in format_tokenize(r)


@pytest.fixture(scope="module")
def small_tokenizers(tmp_path_factory, corpus_file):
    """A 300-entry tokenizer of each trained kind on the corpus's first 20,000 characters, and that
    text."""
    from minigpt_cli.tokenizer.training import train_tokenizer

    folder = tmp_path_factory.mktemp("inspect-tokenizers")
    text = corpus_file.read_text(encoding="utf-8")[:20_000]
    # Its first speaker, a name the text repeats (the genuine corpus: "First Citizen").
    speaker = next(line[:-1] for line in text.splitlines() if line.endswith(":"))
    (folder / "speaker.txt").write_text(speaker, encoding="utf-8")
    (folder / "train.txt").write_text(text, encoding="utf-8")
    for kind in ("bpe", "wordpiece", "unigram"):
        train_tokenizer(kind, text, 300).save(folder / f"{kind}.json")
    return folder


def test_tokenize_trained_tokenizers(small_tokenizers, tmp_path):
    from minigpt_cli.inspection.tokenize import format_tokenize, tokenize

    speaker = (small_tokenizers / "speaker.txt").read_text(encoding="utf-8")
    uni = tokenize(
        tokenizer=small_tokenizers / "unigram.json",
        text=f"{speaker}: hugs",
        all_segmentations=True,
        output=tmp_path,
    )
    assert uni["kind"] == "unigram" and "".join(uni["pieces"]) == f"{speaker}: hugs"
    assert all(d["log_prob"] < 0 for d in uni["details"])
    assert uni["unigram_words"] and all(
        w["viterbi_is_best"] for w in uni["unigram_words"] if w["segmentations"]
    )
    assert_png(uni["png"])
    assert "segmentations; Viterbi (*) = the best listed" in format_tokenize(uni)
    bpe = tokenize(tokenizer=small_tokenizers / "bpe.json", text="the king")
    assert any(d["merge_rank"] is not None for d in bpe["details"])
    wp = tokenize(
        tokenizer=small_tokenizers / "wordpiece.json",
        text=speaker,
        corpus=small_tokenizers / "train.txt",
    )
    merged = [d for d in wp["details"] if d["merge_rank"] is not None]
    assert merged and all(
        d["corpus_rank"] == d["merge_rank"] and 0 < d["score"] <= 1 for d in merged
    )


def test_tokenize_refusals(small_tokenizers, cli, tmp_path):
    res = cli(
        "inspect",
        "tokenize",
        "--tokenizer",
        small_tokenizers / "bpe.json",
        "--all-segmentations",
        "--output",
        tmp_path,
    )
    assert_user_error(res, "Unigram", "bpe")
    assert_user_error(
        cli("inspect", "tokenize", "--words", "hug=ten", "--output", tmp_path), "--words"
    )


def test_tokenize_reads_any_tokenizer_json_and_never_says_to_delete_a_users_file(cli, tmp_path):
    """--tokenizer names the user's file: a tokenizers tokenizer.json of any model (here WordLevel,
    an export's) is read as kind hf; a file that is no tokenizer is said to be none, with what is
    accepted."""
    from helpers import wordlevel_tokenizer

    wordlevel_tokenizer("ROME: ").save(str(tmp_path / "tokenizer.json"))
    res = cli(
        "inspect",
        "tokenize",
        "--tokenizer",
        tmp_path / "tokenizer.json",
        "--text",
        "ROME",
        "--json",
        "--output",
        tmp_path,
    )
    assert res.exit_code == 0, res
    got = json.loads(res.stdout)
    assert (got["kind"], got["model"], got["ids"]) == ("hf", "WordLevel", [0, 1, 2, 3])
    (tmp_path / "some.yaml").write_text("name: mine\n")
    (tmp_path / "other.json").write_text('{"name": "mine"}')
    (tmp_path / "chars.json").write_text('{"format": "minigpt-char-tokenizer", "chars": 5}')
    for name in ("some.yaml", "other.json", "chars.json"):
        res = cli("inspect", "tokenize", "--tokenizer", tmp_path / name, "--output", tmp_path)
        assert_user_error(
            res,
            name,
            "pass a tokenizer file: minigpt's char tokenizer or a tokenizers tokenizer.json",
        )
        assert "delete" not in res.stderr, res
        assert (tmp_path / name).is_file()


# ----------------------------------------------------------------------------- the command group


def test_unknown_topic_lists_the_topics(cli):
    res = cli("inspect", "colours")
    assert_user_error(
        res,
        "unknown topic 'colours'",
        "positions, block, residual, attention, activations, ffn, tokenize",
    )


def test_odd_dim_is_refused(cli, tmp_path):
    assert_user_error(
        cli("inspect", "positions", "--dim", "63", "--output", tmp_path), "--dim 63", "even"
    )


def test_help_says_where_pictures_go_and_that_long_prompts_are_refused(cli):
    assert "default: inspect/" in cli("inspect", "positions", "--help").stdout
    text = " ".join(cli("inspect", "attention", "--help").stdout.split())
    assert "is refused (exit 2), not cropped" in text
