"""Fine-tuning from a local transformers folder (``model.init_from``) and ``minigpt evaluate``.

The pretrained folders are made here: tiny random ``GPT2LMHeadModel`` and
``LlamaForCausalLM`` models with a small BPE tokenizer trained on the corpus,
saved by ``save_pretrained``. transformers itself is the oracle for the loss.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import assert_user_error, records, tiny  # noqa: E402

from minigpt_cli.config.schema import load_config  # noqa: E402
from minigpt_cli.data.pipeline import eval_offsets, eval_seed, windows  # noqa: E402
from minigpt_cli.errors import MinigptError  # noqa: E402
from minigpt_cli.eval.evaluate import evaluate, full_windows  # noqa: E402
from minigpt_cli.hf.finetune import resolve_init_from  # noqa: E402
from minigpt_cli.run import folder as runs  # noqa: E402
from minigpt_cli.trainer import train  # noqa: E402

transformers.logging.set_verbosity_error()
FINETUNE = Path(__file__).resolve().parent.parent / "configs" / "finetune-gpt2.yaml"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, corpus_file):
    """{"gpt2": folder, "llama": folder}: tiny random models with a 300-entry BPE tokenizer.json."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from minigpt_cli.tokenizer.training import train_tokenizer

    tok = train_tokenizer("bpe", corpus_file.read_text()[:100_000], 300, ["<|endoftext|>"])
    root = tmp_path_factory.mktemp("pretrained")
    made = {}
    for kind in ("gpt2", "llama"):
        torch.manual_seed(0)
        if kind == "gpt2":
            ref = GPT2LMHeadModel(
                GPT2Config(
                    n_layer=2,
                    n_head=2,
                    n_embd=32,
                    n_positions=48,
                    vocab_size=300,
                    bos_token_id=0,
                    eos_token_id=0,
                )
            )
        else:  # RoPE, RMSNorm, SwiGLU, grouped-query attention, an untied head
            ref = LlamaForCausalLM(
                LlamaConfig(
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    hidden_size=32,
                    intermediate_size=48,
                    vocab_size=300,
                    max_position_embeddings=64,
                    tie_word_embeddings=False,
                    bos_token_id=0,
                    eos_token_id=0,
                )
            )
        ref.save_pretrained(root / kind)
        tok.save(root / kind / "tokenizer.json")
        made[kind] = root / kind
    return made


def finetune_config(data_dir, folder, tmp_path, *extra):
    return load_config(
        FINETUNE,
        [
            f"model.init_from={folder}",
            f"data.data_dir={data_dir}",
            "device=cpu",
            f"train.out_dir={tmp_path}/runs",
            "model.block_size=32",
            "train.batch_size=4",
            "train.eval_iters=3",
            "train.sample_tokens=0",
            "train.log_interval=1",
            *extra,
        ],
    )


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_step_0_loss_is_transformers_loss_and_evaluate_gives_it_back(
    folders, data_dir, tmp_path, kind
):
    from transformers import AutoModelForCausalLM

    cfg = finetune_config(data_dir, folders[kind], tmp_path, "train.max_iters=0")
    result = train(cfg, "zero", echo=lambda m: None, progress=False)
    logged = result.val_loss
    saved = load_config(result.run_dir / runs.CONFIG)
    assert saved.tokenizer.kind == "hf" and saved.model.init_from == str(folders[kind])
    assert saved.model.pos_encoding == ("learned" if kind == "gpt2" else "rope")
    # transformers' own model on the windows the eval read (the same seed, split and step).
    from minigpt_cli.data.pipeline import prepare_configured

    val = prepare_configured(resolve_init_from(cfg), log=lambda m: None, progress=False)[3].val
    T, n = 32, 3 * 4
    offsets = torch.cat(list(eval_offsets(len(val), T, n, eval_seed(cfg.seed, "val", 0))))
    x, y = windows(val, offsets, T, torch.device("cpu"))
    ref = AutoModelForCausalLM.from_pretrained(folders[kind]).eval()
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(
            ref(x).logits.flatten(0, 1), y.flatten()
        ).item()
    assert abs(logged - expected) < 1e-4, (logged, expected)
    again = evaluate(result.run_dir)
    assert abs(again["loss"] - logged) < 1e-6 and again["logged_loss"] == logged
    assert again["tokens"] == n * T and again["perplexity"] == pytest.approx(math.exp(logged))


def test_twenty_steps_of_fine_tuning_then_generate_evaluate_resume_and_count(
    cli, folders, data_dir, tmp_path
):
    common = [
        f"data.data_dir={data_dir}",
        "device=cpu",
        f"train.out_dir={tmp_path}/runs",
        "model.block_size=32",
        "train.batch_size=4",
        "train.eval_iters=3",
        "train.sample_tokens=0",
        "train.learning_rate=3e-3",
        "train.eval_interval=10",
        "train.log_interval=5",
    ]
    sets = [w for s in common for w in ("--set", s)]
    res = cli(
        "train",
        FINETUNE,
        "--init-from",
        folders["llama"],
        *sets,
        "--set",
        "train.max_iters=20",
        "--run-name",
        "ft",
        "--no-progress",
    )
    assert res.exit_code == 0, res
    run = tmp_path / "runs" / "ft"
    evals = {r["step"]: r["val_loss"] for r in records(run) if r["event"] == "eval"}
    assert sorted(evals) == [0, 10, 20] and evals[20] < evals[0] - 0.1, evals  # it learns
    res = cli(
        "generate", "--run", run, "--prompt", "ROMEO:", "--max-new-tokens", "12", "--seed", "1"
    )
    assert (
        res.exit_code == 0 and res.stdout.startswith("ROMEO:") and len(res.stdout) > len("ROMEO:\n")
    ), res
    res = cli("evaluate", "--run", run, "--json")
    got = json.loads(res.stdout)
    assert got["step"] == 20 and abs(got["loss"] - evals[20]) < 1e-6, (got, evals)
    # Tiny Shakespeare is ASCII: a byte a character; a BPE token holds more than one of them.
    assert got["bits_per_byte"] == pytest.approx(got["bits_per_char"])
    assert got["bits_per_byte"] == pytest.approx(
        got["loss"] / math.log(2) * _tokens_per_byte(run), rel=1e-9
    )
    assert got["bits_per_byte"] < got["loss"] / math.log(2) / 1.2
    res = cli(
        "train",
        FINETUNE,
        "--init-from",
        folders["llama"],
        *sets,
        "--set",
        "train.max_iters=24",
        "--resume",
        run,
        "--no-progress",
    )
    assert res.exit_code == 0 and "step 24" in res.stderr + res.stdout, res
    res = cli("count-params", "--config", run / runs.CONFIG, "--json")
    assert res.exit_code == 0, res
    assert json.loads(res.stdout)["total"] == sum(
        p.numel()
        for p in transformers.AutoModelForCausalLM.from_pretrained(folders["llama"]).parameters()
    )


def test_a_fine_tuning_run_outlives_the_folder_it_started_from(cli, folders, data_dir, tmp_path):
    """Moved away, the pretrained folder is not needed: resume (with the run's config or the one it
    began with), generate, evaluate and count-params read the run's own tokenizer.json and
    checkpoint."""
    import shutil

    folder = tmp_path / "gpt2"
    shutil.copytree(folders["gpt2"], folder)
    common = [
        f"data.data_dir={data_dir}",
        "device=cpu",
        f"train.out_dir={tmp_path}/runs",
        "model.block_size=32",
        "train.batch_size=4",
        "train.eval_iters=2",
        "train.sample_tokens=0",
        "train.log_interval=2",
    ]
    sets = [w for s in common for w in ("--set", s)]
    res = cli(
        "train",
        FINETUNE,
        "--init-from",
        folder,
        *sets,
        "--set",
        "train.max_iters=2",
        "--run-name",
        "ft",
        "--no-progress",
    )
    assert res.exit_code == 0, res
    run = tmp_path / "runs" / "ft"
    folder.rename(tmp_path / "elsewhere")
    res = cli(
        "train", run / runs.CONFIG, "--set", "train.max_iters=4", "--resume", run, "--no-progress"
    )
    assert res.exit_code == 0 and "trained to step 4" in res.stdout, res
    res = cli(
        "train",
        FINETUNE,
        "--init-from",
        folder,
        *sets,
        "--set",
        "train.max_iters=6",
        "--resume",
        run,
        "--no-progress",
    )
    assert res.exit_code == 0 and "trained to step 6" in res.stdout, res
    saved = load_config(run / runs.CONFIG)
    assert saved.tokenizer.path == str(
        (run / runs.TOKENIZER).absolute()
    ) and saved.model.init_from == str(folder)
    res = cli(
        "generate", "--run", run, "--prompt", "ROMEO:", "--max-new-tokens", "4", "--seed", "1"
    )
    assert res.exit_code == 0 and res.stdout.startswith("ROMEO:"), res
    res = cli("evaluate", "--run", run, "--checkpoint", "last", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["step"] == 6, res
    res = cli("count-params", "--config", run / runs.CONFIG, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["total"] > 0, res
    # A model key the run did not have is still refused, naming it.
    assert_user_error(
        cli(
            "train",
            FINETUNE,
            "--init-from",
            folder,
            *sets,
            "--set",
            "model.n_layer=3",
            "--set",
            "train.max_iters=8",
            "--resume",
            run,
        ),
        "model.n_layer is 3 here but 2",
    )


def _tokens_per_byte(run) -> float:
    """The val split's tokens per UTF-8 byte of its text: what the training eval's bits per byte
    converts by."""
    from minigpt_cli.data.pipeline import prepare_configured

    cfg = load_config(run / runs.CONFIG)
    _, tok, _, data = prepare_configured(cfg, log=lambda m: None, progress=False)
    return len(data.val) / len(tok.decode(data.val.tolist()).encode("utf-8"))


@pytest.mark.parametrize(
    "n,block_size,stride",
    [(100, 16, 8), (100, 16, 16), (100, 16, 1), (17, 16, 4), (5, 16, 3), (2, 4, 2)],
)
def test_full_windows_score_every_token_once_with_enough_context(n, block_size, stride):
    scored = []
    for begin, end, count in full_windows(n, block_size, stride):
        assert end - begin - 1 <= block_size and 1 <= count <= end - begin - 1
        for j in range(end - count, end):  # targets scored: j, with context begin .. j-1
            scored.append(j)
            assert j - begin >= min(j, block_size - stride + 1) or begin == 0
    assert scored == list(range(1, n))


def test_full_scoring_is_the_transformers_documentation_loop(folders, data_dir, tmp_path):
    """--full against the sliding-window loop of transformers' "Perplexity of fixed-length models",
    run on transformers' own GPT-2: windows of max_length tokens predict max_length - 1, ours of
    block_size predict block_size, so ours with block_size = max_length - 1 scores the same
    (context, token) pairs."""
    from transformers import AutoModelForCausalLM

    from minigpt_cli.eval.evaluate import _score_full, full_windows
    from minigpt_cli.hf.finetune import load_pretrained
    from minigpt_cli.model.gpt import GPT

    text = (data_dir / "tinyshakespeare" / "input.txt").read_text()[:3000]
    cfg = resolve_init_from(
        finetune_config(data_dir, folders["gpt2"], tmp_path, "model.block_size=47")
    )
    from minigpt_cli.tokenizer.kinds import load_tokenizer

    ids = np.asarray(load_tokenizer(cfg.tokenizer.path, "hf").encode(text))
    ours = GPT(cfg.model)
    load_pretrained(ours, cfg)
    ours.eval()
    ref = AutoModelForCausalLM.from_pretrained(folders["gpt2"]).eval()
    max_length, stride = 48, 20
    enc = torch.from_numpy(ids)[None]
    nll_sum, n_tokens, prev_end = 0.0, 0, 0
    with torch.no_grad():
        for begin in range(
            0, enc.size(1), stride
        ):  # the documentation's loop, as it is written there
            end = min(begin + max_length, enc.size(1))
            trg_len = end - prev_end
            input_ids = enc[:, begin:end]
            target_ids = input_ids.clone()
            target_ids[:, :-trg_len] = -100
            loss = ref(input_ids, labels=target_ids).loss
            valid = (target_ids[:, 1:] != -100).sum().item()
            nll_sum += loss.item() * valid
            n_tokens += valid
            prev_end = end
            if end == enc.size(1):
                break
    assert n_tokens == len(ids) - 1
    spans = list(full_windows(len(ids), 47, stride))
    got = _score_full(ours, ids, spans, 3, torch.device("cpu"), progress=False)
    assert got == pytest.approx(nll_sum, rel=1e-5)


def test_bits_per_char_of_a_char_model_is_its_loss_in_bits(data_dir, tmp_path):
    result = train(
        tiny(data_dir, "train.max_iters=3", f"train.out_dir={tmp_path}"),
        "c",
        echo=lambda m: None,
        progress=False,
    )
    text = tmp_path / "t.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    got = evaluate(result.run_dir, text_file=text, stride=8)
    assert got["tokens"] == len(text.read_text()) - 1 and got["mode"] == "full"
    assert got["bits_per_char"] == pytest.approx(
        got["loss"] / math.log(2) * got["tokens"] / got["chars"]
    )
    assert got["bits_per_byte"] == pytest.approx(got["bits_per_char"])  # ASCII: a byte a character
    with pytest.raises(MinigptError, match="add --full"):
        evaluate(result.run_dir, stride=8)
    with pytest.raises(MinigptError, match="'☃'"):
        text.write_text("snow ☃ man")
        evaluate(result.run_dir, text_file=text)


def test_bad_pretrained_folders_and_conflicts_are_one_line(cli, folders, data_dir, tmp_path):
    import shutil

    def refused(folder, *fragments, extra=()):
        args = [
            "train",
            FINETUNE,
            "--init-from",
            folder,
            "--set",
            f"data.data_dir={data_dir}",
            "--set",
            f"train.out_dir={tmp_path}/runs",
            "--set",
            "model.block_size=32",
            "--dry-run",
            *extra,
        ]
        assert_user_error(cli(*args), *fragments)

    empty = tmp_path / "empty"
    empty.mkdir()
    refused(empty, "config.json not found")
    bad = tmp_path / "bad"
    shutil.copytree(folders["gpt2"], bad)
    (bad / "model.safetensors").unlink()
    refused(bad, "no model.safetensors")
    (bad / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    refused(bad, "model_type 'mistral'")
    shutil.rmtree(bad)
    shutil.copytree(folders["gpt2"], bad)
    hf_cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**hf_cfg, "n_inner": 64}))  # the weights hold 128
    res = cli(
        "train",
        FINETUNE,
        "--init-from",
        bad,
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"train.out_dir={tmp_path}/runs",
        "--set",
        "train.max_iters=1",
        "--set",
        "device=cpu",
        "--set",
        "model.block_size=32",
        "--set",
        "train.batch_size=2",
        "--set",
        "train.eval_iters=1",
    )
    assert_user_error(res, "mlp.c_fc", "shape", notes_ok=True)
    # An ordinary config's architecture and tokenizer give way to the folder's, with one note naming
    # them.
    replaced = cli(
        "train",
        FINETUNE,
        "--init-from",
        folders["gpt2"],
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"train.out_dir={tmp_path}/runs",
        "--set",
        "model.block_size=32",
        "--set",
        "model.n_layer=4",
        "--set",
        "tokenizer.kind=bpe",
        "--dry-run",
    )
    assert replaced.exit_code == 0, replaced
    notes = [line for line in replaced.stderr.splitlines() if "in place of the config's" in line]
    assert (
        len(notes) == 1
        and "model.n_layer 4 (the folder's: 2)" in notes[0]
        and "tokenizer.kind 'bpe'" in notes[0]
    )
    assert "n_layer: 2" in replaced.stdout and "kind: hf" in replaced.stdout
    refused(
        folders["gpt2"],
        "model.block_size (64)",
        "n_positions=48",
        extra=("--set", "model.block_size=64"),
    )
    # model.vocab_size: null, spelled out as in the shipped configs, means the tokenizer's size: no
    # conflict.
    spelled = cli(
        "train",
        FINETUNE,
        "--init-from",
        folders["gpt2"],
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"train.out_dir={tmp_path}/runs",
        "--set",
        "model.block_size=32",
        "--set",
        "model.vocab_size=null",
        "--dry-run",
    )
    assert spelled.exit_code == 0, spelled
    (bad / "tokenizer.json").unlink()
    refused(bad, "has no tokenizer.json")


@pytest.fixture(scope="module")
def wordlevel_run(tmp_path_factory, corpus_file, data_dir):
    """(pretrained folder, run folder): a tiny GPT-2 whose tokenizer.json is a WordLevel vocabulary
    of the corpus's characters without an unknown token (kind hf), fine-tuned for 0 steps."""
    from helpers import wordlevel_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    chars = sorted(set(corpus_file.read_text()))
    root = tmp_path_factory.mktemp("wordlevel")
    torch.manual_seed(0)
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=48, vocab_size=len(chars))
    ).save_pretrained(root / "hf")
    wordlevel_tokenizer(chars).save(str(root / "hf" / "tokenizer.json"))
    cfg = finetune_config(data_dir, root / "hf", root, "train.max_iters=0", "train.eval_iters=1")
    return root / "hf", train(cfg, "wl", echo=lambda m: None, progress=False).run_dir


def test_a_wordlevel_run_refuses_characters_outside_its_vocabulary_in_one_line(
    cli, wordlevel_run, tmp_path
):
    """The library's "Missing [UNK] token" becomes the char kind's message, naming the characters,
    for a prompt, a text file, inspect's prompt and text, and a corpus; text it knows still
    works."""
    folder, run = wordlevel_run
    lacks = "has characters the tokenizer's vocabulary lacks"
    assert_user_error(
        cli("generate", "--run", run, "--prompt", "é€", "--max-new-tokens", "1"),
        f"the prompt {lacks}: 'é', '€'; remove or replace them",
        notes_ok=True,
    )
    text = tmp_path / "f.txt"
    text.write_text("héllo wörld\n", encoding="utf-8")
    assert_user_error(
        cli("evaluate", "--run", run, "--text-file", text),
        f"{text} {lacks}: 'é', 'ö'",
        notes_ok=True,
    )
    assert_user_error(
        cli("inspect", "attention", "--run", run, "--prompt", "é", "--output", tmp_path),
        f"the prompt {lacks}: 'é'",
        notes_ok=True,
    )
    assert_user_error(
        cli("inspect", "tokenize", "--run", run, "--text", "café", "--output", tmp_path),
        f"text {lacks}: 'é'",
    )
    corpus = tmp_path / "uc.txt"
    corpus.write_text(
        "A café, said ROMEO, and more words to fill a window.\n" * 200, encoding="utf-8"
    )
    res = cli(
        "train",
        FINETUNE,
        "--init-from",
        folder,
        "--set",
        f"data.path={corpus}",
        "--set",
        f"train.out_dir={tmp_path}/runs",
        "--set",
        "model.block_size=32",
        "--dry-run",
    )
    assert_user_error(res, f"text {lacks}: 'é'", notes_ok=True)
    res = cli(
        "generate", "--run", run, "--prompt", "ROMEO:", "--max-new-tokens", "3", "--seed", "1"
    )
    assert res.exit_code == 0 and res.stdout.startswith("ROMEO:"), res


def test_inspect_tokenize_reads_a_runs_hf_tokenizer(cli, wordlevel_run, tmp_path):
    """The run's config says its tokenizer.json is kind hf (a pretrained folder's, as it is):
    inspect reads it as generate does, instead of advising to delete a file the run needs."""
    _, run = wordlevel_run
    res = cli(
        "inspect", "tokenize", "--run", run, "--text", "ROMEO", "--json", "--output", tmp_path
    )
    assert res.exit_code == 0, res
    got = json.loads(res.stdout)
    assert (got["kind"], got["model"], got["pieces"]) == ("hf", "WordLevel", list("ROMEO"))
    res = cli("inspect", "tokenize", "--run", run, "--text", "ROMEO", "--output", tmp_path)
    assert (
        res.exit_code == 0 and "hf tokenizer" in res.stdout and "a WordLevel model" in res.stdout
    ), res
    assert (run / "tokenizer.json").is_file()


def test_a_shorter_block_size_than_the_folders_context_is_said_at_train_time_with_the_sizes(
    cli, folders, data_dir, tmp_path
):
    """Fine-tuning GPT-2 (48 positions) at block_size 32 trains a 32-token model: train says so,
    with both sizes, before anything is trained; at the folder's own 48 it says nothing of the
    kind."""

    def dry_run(block_size):
        res = cli(
            "train",
            FINETUNE,
            "--init-from",
            folders["gpt2"],
            "--set",
            f"data.data_dir={data_dir}",
            "--set",
            f"train.out_dir={tmp_path}/runs",
            "--set",
            f"model.block_size={block_size}",
            "--dry-run",
        )
        assert res.exit_code == 0, res
        return [line for line in res.stderr.splitlines() if "shorter than" in line]

    (note,) = dry_run(32)
    assert "model.block_size 32" in note and "context of 48 tokens" in note, note
    assert "position table cut from 48 rows to 32" in note and "model.block_size: 48" in note, note
    assert dry_run(48) == []
