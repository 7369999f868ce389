"""``minigpt export --format hf``: transformers reads the folder and computes what minigpt
computes."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import assert_user_error, tiny  # noqa: E402

from minigpt_cli.config.schema import ModelConfig  # noqa: E402
from minigpt_cli.errors import MinigptError  # noqa: E402
from minigpt_cli.hf.export import hf_state_dict, hf_target  # noqa: E402
from minigpt_cli.hf.load import load_hf_folder  # noqa: E402
from minigpt_cli.run import folder as runs  # noqa: E402
from minigpt_cli.run.checkpoint import load_model  # noqa: E402
from minigpt_cli.tokenizer.kinds import load_tokenizer  # noqa: E402
from minigpt_cli.trainer import train  # noqa: E402

transformers.logging.set_verbosity_error()

#: A GPT-2-style run with the char tokenizer (learned positions, LayerNorm, GELU, tied, no biases) and a
#: Llama-style one with a BPE tokenizer (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied).
STYLES = {
    "gpt2-char": [],
    "llama-bpe": [
        "model.pos_encoding=rope",
        "model.norm=rmsnorm",
        "model.ffn=swiglu",
        "model.n_kv_head=1",
        "model.tie_weights=false",
        "model.d_ff=48",
        "tokenizer.kind=bpe",
        "tokenizer.vocab_size=300",
        "tokenizer.special_tokens=[<|endoftext|>]",
    ],
}


@pytest.fixture(scope="module", params=list(STYLES))
def exported(request, tmp_path_factory, data_dir):
    """(run folder, export folder) of a 3-step run of each style."""
    root = tmp_path_factory.mktemp(request.param)
    cfg = tiny(data_dir, "train.max_iters=3", f"train.out_dir={root}/runs", *STYLES[request.param])
    run = train(cfg, "r", echo=lambda m: None, progress=False).run_dir
    from minigpt_cli.hf.export import export_run

    return run, export_run(run, root / "hf")


def test_an_export_has_the_modes_of_any_new_folder_and_file(exported):
    """mkdtemp makes its folder 0700 and safetensors its file 0600: the renamed export kept them, so
    other users (a shared model folder, a server's account) could not read it."""
    from minigpt_cli.fileio import dir_mode, new_file_mode

    _, out = exported
    assert out.stat().st_mode & 0o777 == dir_mode()
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        name: new_file_mode() for name in (p.name for p in out.iterdir())
    }


def test_transformers_gives_the_same_logits_and_token_ids(exported, corpus_file):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, out = exported
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    ours, cfg = load_model(runs.checkpoint_dir(run, runs.BEST))
    tok = load_tokenizer(run / runs.TOKENIZER, cfg.tokenizer.kind)
    passage = corpus_file.read_text()[-2000:]  # from the validation text
    ids = tok.encode(passage)
    hf_tok = AutoTokenizer.from_pretrained(out)
    assert hf_tok(passage, add_special_tokens=False)["input_ids"] == ids
    assert hf_tok.decode(ids) == tok.decode(ids)
    ref = AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.tensor([ids[:32], ids[100:132]])
    with torch.no_grad():
        diff = (ref(x).logits - ours.eval()(x)[0]).abs().max().item()
    assert diff < 1e-5, diff


def test_the_export_imports_back_to_the_same_weights_byte_for_byte(exported, tmp_path):
    from safetensors.torch import save_file

    run, out = exported
    ours, _ = load_model(runs.checkpoint_dir(run, runs.BEST))
    back = load_hf_folder(out)
    skip = {
        "init_std",
        "scale_residual_init",
        "multiple_of",
        "init_from",
        "d_ff",
        "bias",
    }  # d_ff: as ffn_hidden
    assert back.config.model_dump(exclude=skip) == ours.config.model_dump(exclude=skip)
    assert back.config.ffn_hidden == ours.config.ffn_hidden
    mine, theirs = ours.state_dict(), back.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    extra = set(theirs) - set(
        mine
    )  # GPT-2 always has biases: ours, when bias is false, come back as zeros
    assert all(k.endswith(".bias") and not theirs[k].any() for k in extra)
    assert bool(extra) == (back.config.pos_encoding == "learned" and not ours.config.bias)
    save_file(
        hf_state_dict(back, back.config),
        str(tmp_path / "again.safetensors"),
        metadata={"format": "pt"},
    )
    assert (tmp_path / "again.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


@pytest.mark.parametrize("exported", ["gpt2-char"], indirect=True)
def test_an_exported_char_tokenizer_removes_characters_outside_its_alphabet(
    exported, cli, tmp_path, corpus_in_use
):
    """A model with no row to spare has no id for an unknown character: transformers gets the text
    without them, instead of failing with "Missing [UNK] token"; the export says so."""
    from transformers import AutoTokenizer

    run, out = exported
    tok = load_tokenizer(run / runs.TOKENIZER, "char")
    hf_tok = AutoTokenizer.from_pretrained(out)
    text = "«héllo» 😀 [$3.?-&]^\\"  # '$', '.', '?', '-' are in the alphabet, read as regex operators elsewhere
    kept = "".join(
        c for c in text if c in corpus_in_use.chars
    )  # the genuine corpus: "hllo  $3.?-&"
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == tok.encode(kept)
    assert hf_tok.unk_token is None
    res = cli("export", run, "--output", tmp_path / "again")
    alphabet = f"its {len(corpus_in_use.chars)}-character alphabet"  # the genuine corpus: 65
    assert res.exit_code == 0 and f"removes characters outside {alphabet}" in res.stderr, res


def test_an_exported_char_tokenizer_maps_unknown_characters_to_a_spare_row(
    tmp_path, data_dir, corpus_in_use
):
    """With model.vocab_size above the tokenizer's, the first spare id is the unknown token; the ids
    of the characters and of the special token stay the run's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minigpt_cli.hf.export import export_run

    vocab = len(corpus_in_use.chars) + 7  # rows to spare (the genuine corpus: 72)
    cfg = tiny(
        data_dir,
        "train.max_iters=1",
        f"model.vocab_size={vocab}",
        "tokenizer.special_tokens=[<|endoftext|>]",
        f"train.out_dir={tmp_path}/runs",
    )
    run = train(cfg, "r", echo=lambda m: None, progress=False).run_dir
    out = export_run(run, tmp_path / "hf")
    tok = load_tokenizer(run / runs.TOKENIZER, "char")
    hf_tok = AutoTokenizer.from_pretrained(out)
    unk = tok.vocab_size  # the first id after the characters' and <|endoftext|>'s
    ids = hf_tok("héllo<|endoftext|>€", add_special_tokens=False)["input_ids"]
    assert ids == [*tok.encode("h"), unk, *tok.encode("llo<|endoftext|>"), unk]
    assert hf_tok.unk_token == "\ufffd" and hf_tok.unk_token_id == unk
    assert hf_tok.decode(ids) == "h\ufffdllo<|endoftext|>\ufffd"
    model = AutoModelForCausalLM.from_pretrained(out)  # the model has a row for the unknown id
    assert model(torch.tensor([ids])).logits.shape == (1, len(ids), vocab)


@pytest.mark.parametrize(
    "change,key,fix",
    [
        (
            {"pos_encoding": "sinusoidal"},
            "model.pos_encoding='sinusoidal'",
            "model.pos_encoding=learned",
        ),
        ({"pos_encoding": "none"}, "model.pos_encoding='none'", "model.pos_encoding=learned"),
        ({"norm_position": "post"}, "model.norm_position='post'", "model.norm_position=pre"),
        ({"emb_scale": True}, "model.emb_scale=true", "model.emb_scale=false"),
        ({"norm": "rmsnorm"}, "model.norm='rmsnorm'", "model.norm=layernorm exports as GPT-2"),
        ({"ffn": "swiglu"}, "model.ffn='swiglu'", "model.ffn=gelu_tanh exports as GPT-2"),
        ({"n_kv_head": 2}, "model.n_kv_head=2", "model.n_kv_head=null exports as GPT-2"),
        (
            {"pos_encoding": "rope", "norm": "rmsnorm", "ffn": "gelu"},
            "model.ffn='gelu'",
            "model.ffn=swiglu exports as Llama",
        ),
        (
            {"pos_encoding": "rope", "ffn": "swiglu", "n_kv_head": 2},
            "model.norm='layernorm'",
            "model.norm=rmsnorm exports as Llama",
        ),
        (
            {"pos_encoding": "rope", "emb_scale": True, "norm_position": "post"},
            "model.norm_position='post'",
            "model.norm_position=pre, model.emb_scale=false exports as GPT-NeoX",
        ),
    ],
)
def test_a_model_transformers_cannot_express_is_refused_naming_the_key_and_the_fix(
    change, key, fix
):
    """The nearest target (the fewest keys to change, ties in the table's order) names what would
    export."""
    with pytest.raises(MinigptError, match="cannot be exported") as e:
        hf_target(ModelConfig(n_head=4, n_embd=32, **change))
    assert key in str(e.value) and fix in str(e.value), str(e.value)


NAMES = {"gpt2": "GPT-2", "llama": "Llama", "gpt_neox": "GPT-NeoX"}


@pytest.mark.parametrize(
    "change,target",
    [
        ({}, "gpt2"),
        ({"ffn": "relu", "bias": False}, "gpt2"),
        ({"pos_encoding": "rope", "norm": "rmsnorm", "ffn": "swiglu", "n_kv_head": 2}, "llama"),
        (
            {"pos_encoding": "rope", "ffn": "relu", "tie_weights": False, "rope_base": 500.0},
            "gpt_neox",
        ),
        ({"pos_encoding": "rope", "ffn": "gelu_tanh", "bias": False}, "gpt_neox"),
    ],
)
def test_each_model_a_target_expresses_is_picked_and_others_are_refused_by_arch(change, target):
    mc = ModelConfig(n_head=4, n_embd=32, **change)
    assert hf_target(mc) == hf_target(mc, target) == target
    for other in {"gpt2", "llama", "gpt_neox"} - {target}:
        with pytest.raises(MinigptError, match=f"--arch {other}: .* cannot express model[.]") as e:
            hf_target(mc, other)
        assert str(e.value).endswith(f"drop --arch: the run exports as {NAMES[target]}")


def test_a_model_switch_the_table_does_not_list_is_refused_unless_at_its_default():
    """A key added to the schema (here a stand-in for ``model.qk_norm``) exports only at its
    default, with no edit to the export: every target refuses it, naming it, until its entry in
    TARGETS lists it."""
    from pydantic import Field

    class WithQKNorm(ModelConfig):
        qk_norm: bool = Field(False)

    assert hf_target(WithQKNorm(pos_encoding="rope", ffn="relu")) == "gpt_neox"
    with pytest.raises(MinigptError, match="model.qk_norm=true has no equivalent") as e:
        hf_target(WithQKNorm(pos_encoding="rope", ffn="relu", qk_norm=True))
    assert "model.qk_norm=false exports as GPT-NeoX" in str(e.value)
    with pytest.raises(
        MinigptError, match="--arch llama: Llama cannot express model.norm='layernorm'"
    ):
        hf_target(WithQKNorm(pos_encoding="rope", ffn="relu", qk_norm=True), "llama")


@pytest.mark.parametrize("exported", ["gpt2-char"], indirect=True)
def test_an_arch_that_cannot_express_the_run_is_one_line(cli, exported, tmp_path):
    run, _ = exported
    res = cli("export", run, "--output", tmp_path / "x", "--arch", "gpt_neox")
    assert_user_error(
        res,
        "--arch gpt_neox: GPT-NeoX cannot express model.pos_encoding='learned' (it takes rope)",
        "drop --arch: the run exports as GPT-2",
    )
    assert not (tmp_path / "x").exists()
    res = cli("export", run, "--output", tmp_path / "x", "--arch", "gpt2")
    assert res.exit_code == 0 and "as a transformers GPT2LMHeadModel" in res.stderr, res


def test_export_refuses_a_non_empty_folder_unless_forced(cli, exported, tmp_path):
    run, _ = exported
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert_user_error(cli("export", run, "--output", out), "not empty", "--force")
    assert_user_error(
        cli("export", run, "--output", out, "--force"), "notes.txt", "only an earlier export"
    )
    assert (out / "notes.txt").read_text() == "mine"  # nothing lost
    assert_user_error(cli("export", run, "--output", out, "--format", "onnx"), "--format 'onnx'")
    for where in (
        run,
        run.parent,
        run.parent.parent,
    ):  # the run, the folder of runs: never replaced
        assert_user_error(cli("export", run, "--output", where, "--force"), "is or holds the run")
        res = cli(
            "export", run, "--output", where
        )  # nor advised to pass --force, which would not do
        assert_user_error(res, "is or holds the run")
        assert "--force" not in res.stderr, res
    assert (run / "checkpoints").is_dir()
    assert_user_error(
        cli("export", run, "--output", run / "hf"), "is inside the run folder", "outside it"
    )
    assert not (run / "hf").exists()
    (out / "notes.txt").unlink()
    assert cli("export", run, "--output", out).exit_code == 0
    res = cli("export", run, "--output", out, "--force")  # an earlier export is replaced
    assert res.exit_code == 0, res
    assert (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left beside it


def test_export_into_the_current_folder_or_above_is_refused_without_advising_force(
    cli, exported, tmp_path, monkeypatch
):
    run, _ = exported
    here = tmp_path / "work" / "here"  # neither it nor the folder above holds the run
    here.mkdir(parents=True)
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    for where in (".", ".."):
        res = cli("export", run, "--output", where)
        assert_user_error(res, f"--output {where} is or holds the current folder")
        assert "--force" not in res.stderr, res


@pytest.mark.parametrize("exported", ["gpt2-char"], indirect=True)
def test_an_output_that_cannot_be_written_is_named_as_given(cli, exported, tmp_path, monkeypatch):
    """Not the temporary folder the export writes first: a read-only file system (stood in for, as
    root writes anywhere a mode forbids), and a file where a folder must be."""
    import errno
    import os

    import minigpt_cli.hf.export as hf_export

    run, _ = exported
    (tmp_path / "afile").write_text("")
    res = cli("export", run, "--output", tmp_path / "afile" / "hf")
    assert_user_error(res, f"cannot write {tmp_path / 'afile' / 'hf'}: ")

    def read_only(prefix, dir):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, prefix + "dz52rdg_"))

    monkeypatch.setattr(hf_export.tempfile, "mkdtemp", read_only)
    res = cli("export", run, "--output", tmp_path / "ro" / "hf")
    assert_user_error(res, f"cannot write {tmp_path / 'ro' / 'hf'}: Read-only file system; ")
    assert ".hf." not in res.stderr, res


def test_an_exported_char_tokenizer_reads_the_text_unk_as_characters(tmp_path):
    """With U+FFFD in the alphabet the unknown token is another single character: transformers reads
    the literal text ``<unk>`` as five characters, as minigpt does, and still maps an unknown
    character to it."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from minigpt_cli.hf.export import tokenizer_files
    from minigpt_cli.tokenizer.kinds import CharTokenizer

    tok = CharTokenizer(sorted("ab<unk>\ufffd"), ["<|endoftext|>"])
    cfg = SimpleNamespace(model=SimpleNamespace(vocab_size=tok.vocab_size + 4, block_size=16))
    for name, text in tokenizer_files(tok, tmp_path, cfg).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    hf_tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = hf_tok("a<unk>b\ufffd<|endoftext|>", add_special_tokens=False)["input_ids"]
    assert ids == tok.encode("a<unk>b\ufffd<|endoftext|>")
    unk = tok.vocab_size
    assert (
        hf_tok.unk_token_id == unk
        and len(hf_tok.unk_token) == 1
        and hf_tok.unk_token not in tok.stoi
    )
    assert hf_tok("a€b", add_special_tokens=False)["input_ids"] == [
        tok.stoi["a"],
        unk,
        tok.stoi["b"],
    ]


def test_a_fine_tuned_export_says_its_position_table_was_cut(cli, corpus_file, data_dir, tmp_path):
    """Fine-tuning at block_size 16 keeps 16 of a 48-position GPT-2's rows (hf/finetune.py): the
    export's n_positions is 16, and it says so in one line, also once the folder it started from is
    gone."""
    from helpers import wordlevel_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    from minigpt_cli.config.schema import load_config

    chars = sorted(set(corpus_file.read_text()))
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=48, vocab_size=len(chars))
    ).save_pretrained(tmp_path / "gpt2")
    wordlevel_tokenizer(chars).save(str(tmp_path / "gpt2" / "tokenizer.json"))
    cfg = load_config(
        "finetune-gpt2",
        [
            f"model.init_from={tmp_path / 'gpt2'}",
            "model.block_size=16",
            "device=cpu",
            f"data.data_dir={data_dir}",
            f"train.out_dir={tmp_path}/runs",
            "train.max_iters=0",
            "train.eval_iters=1",
            "train.batch_size=2",
        ],
    )
    run = train(cfg, "ft", echo=lambda m: None, progress=False).run_dir
    res = cli("export", run, "--output", tmp_path / "hf")
    assert res.exit_code == 0, res
    cut = [line for line in res.stderr.splitlines() if "position table" in line]
    assert cut == [
        f"note: the position table has model.block_size=16 rows: fine-tuning cut {tmp_path / 'gpt2'}'s "
        "48 to that; fine-tune with a larger model.block_size to keep more"
    ], res
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["n_positions"] == 16
    (tmp_path / "gpt2").rename(tmp_path / "moved")
    res = cli("export", run, "--output", tmp_path / "hf", "--force")
    assert (
        res.exit_code == 0
        and "cut" in res.stderr
        and "length unknown now: the folder is gone" in res.stderr
    ), res
