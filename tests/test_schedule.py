"""The learning-rate schedule, the eval points, and what --dry-run prints."""

from __future__ import annotations

import importlib.util
import shutil

import pytest
from helpers import TINY, assert_user_error

import minigpt_cli.data.preparation
from minigpt_cli.config.schema import TrainConfig, load_config
from minigpt_cli.model.gpt import GPT
from minigpt_cli.trainer import lr_at, should_eval


def test_cosine_schedule_with_warmup():
    tc = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, max_iters=2000)
    assert lr_at(0, tc) > 0  # the very first step already learns
    assert lr_at(0, tc) == pytest.approx(1e-3 / 101)
    assert lr_at(99, tc) == pytest.approx(1e-3 * 100 / 101)
    assert lr_at(100, tc) == pytest.approx(1e-3)
    mid = 100 + (2000 - 100) // 2
    assert lr_at(mid, tc) == pytest.approx((1e-3 + 1e-4) / 2)
    assert lr_at(2000, tc) == pytest.approx(1e-4)
    steps = [lr_at(s, tc) for s in range(100, 2001)]
    assert all(a >= b for a, b in zip(steps, steps[1:]))


def test_other_schedules():
    lin = TrainConfig(
        learning_rate=1.0, min_lr=0.0, warmup_iters=0, max_iters=100, lr_schedule="linear"
    )
    assert lr_at(50, lin) == pytest.approx(0.5)
    const = TrainConfig(
        learning_rate=0.3, min_lr=0.0, warmup_iters=10, max_iters=100, lr_schedule="constant"
    )
    assert lr_at(60, const) == pytest.approx(0.3)
    # The original Transformer (Vaswani et al. 2017 eq. 3): d^-0.5 · min(s^-0.5, s·w^-1.5), peak at
    # s = w.
    inv = TrainConfig(
        learning_rate=1.0,
        min_lr=0.0,
        warmup_iters=4000,
        max_iters=10**6,
        lr_schedule="inverse_sqrt",
    )
    assert lr_at(3999, inv, n_embd=512) == pytest.approx(512**-0.5 * 4000**-0.5)
    assert lr_at(15999, inv, n_embd=512) == pytest.approx(512**-0.5 * 16000**-0.5)


def test_eval_points():
    tc = TrainConfig(eval_interval=10, max_iters=25)
    assert [s for s in range(26) if should_eval(s, tc)] == [0, 10, 20, 25]


def test_dry_run_prints_config_and_schedule(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY, "--dry-run", "--set", "train.lr_schedule=linear")
    assert res.exit_code == 0, res
    assert "lr_schedule: linear" in res.stdout and "step       0: 5.000e-04" in res.stdout
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
    # The null keys, resolved: no tokenizer yet, so the vocabulary waits for it.
    assert (
        "model.vocab_size      from the tokenizer, trained into data/tinyshakespeare/tokenizer-char.json"
        in res.stdout
    )
    assert "model.d_ff            128\n" in res.stdout and "model.n_kv_head       2\n" in res.stdout
    assert "sample.window_stride  8\n" in res.stdout and "parameters" not in res.stdout
    assert '  prompt: "\\n"\n' in res.stdout  # one line, as typed in a config
    # Once the tokenizer exists: its size, the parameter count and the memory estimate.
    from minigpt_cli.tokenizer.kinds import CharTokenizer

    path = tmp_path / "data" / "tinyshakespeare" / "tokenizer-char.json"
    CharTokenizer.train("ab\ncd").save(path)
    res = cli("train", TINY, "--dry-run", "--set", "model.d_ff=100")
    assert f"model.vocab_size      5 (from {path.relative_to(tmp_path)})" in res.stdout, res.stdout
    assert "model.d_ff            100 (set)" in res.stdout
    n = GPT(load_config(TINY, ["model.vocab_size=5", "model.d_ff=100"]).model).num_params()
    assert (
        f"parameters            {n:,}\n" in res.stdout
        and "memory to train       about " in res.stdout
    )


# ----------------------------------------------------------------------------- --dry-run refuses
# what train refuses


@pytest.fixture
def own_data(tmp_path, corpus_file):
    """A data folder of this test's own holding the corpus (train writes token files into it)."""
    root = tmp_path / "own-data"
    (root / "tinyshakespeare").mkdir(parents=True)
    shutil.copyfile(corpus_file, root / "tinyshakespeare" / "input.txt")
    return root


def _error_line(res) -> str:
    return [line for line in res.stderr.splitlines() if line.startswith("error: ")][-1]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


#: --set values train refuses before step 0, and a fragment of the one line it refuses them with;
#: the fields in braces are figures of the corpus in use (:func:`figures`).
REFUSED = [
    (
        ["data.val_fraction=0.99999"],
        "11 train and {val_after_11:,} val tokens, too few for train (they need at least "
        "model.block_size+1 = 33 tokens each)",
    ),
    (["data.val_fraction=0.00001"], "too few for val (they need at least model.block_size+1 = 33"),
    (["data.val_fraction=0.9999999"], "data.val_fraction=0.9999999 splits the corpus into 0 train"),
    (
        ["model.block_size=200000", "model.n_embd=8"],
        "lower model.block_size (to at most {longest_block:,} with this split)",
    ),
    (
        ["model.vocab_size=10"],
        "model.vocab_size (10) is smaller than the tokenizer's {vocab} entries",
    ),
    (["train.batch_size=100000000"], "this model needs about"),
    (["device=cuda:99"], "device: cuda:99 was asked for"),
    (["tokenizer.kind=bpe"], "a bpe tokenizer needs a vocabulary size"),
    (
        ["tokenizer.kind=unigram", "tokenizer.vocab_size=5"],
        "vocabulary size 5 is below the unigram base alphabet of {vocab_unk}",
    ),
]


def figures(corpus) -> dict[str, int]:
    """The corpus's figures the refusals quote (the genuine corpus's in comments): its characters
    are its tokens (it is ASCII), split as nanoGPT does."""
    n = corpus.size
    return {
        "val_after_11": n - int(n * (1 - 0.99999)),  # 1,115,383 (11 train tokens)
        "longest_block": n - int(n * 0.9) - 1,  # 111,539: the val split at 0.1, less one
        "vocab": len(corpus.chars),  # 65
        "vocab_unk": len(corpus.chars) + 1,  # 66: and <unk>
    }


@pytest.mark.parametrize("overrides, fragment", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_dry_run_refuses_what_train_refuses_with_the_same_line(
    cli, own_data, tmp_path, overrides, fragment, corpus_in_use
):
    fragment = fragment.format(**figures(corpus_in_use))
    sets = [
        w
        for o in [f"data.data_dir={own_data}", f"train.out_dir={tmp_path / 'runs'}", *overrides]
        for w in ("--set", o)
    ]
    dry = cli("train", TINY, "--dry-run", *sets)
    assert_user_error(dry, fragment)
    assert dry.stdout == ""
    assert not list((own_data / "tinyshakespeare").glob("*-*")), "a dry run writes nothing"
    real = cli("train", TINY, *sets)
    assert_user_error(real, fragment, notes_ok=True)
    # The same line (the free memory, measured anew, may differ by a few bytes).
    assert _error_line(real).split(" but ")[0] == _error_line(dry).split(" but ")[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_dry_run_refuses_float16_where_auto_finds_a_cpu(cli, tmp_path, monkeypatch):
    if _cuda():
        pytest.skip("device: auto finds a GPU here")
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY, "--dry-run", "--set", "device=auto", "--set", "dtype=float16")
    assert_user_error(res, "dtype: float16 needs a GPU")


def test_dry_run_refuses_tensorboard_without_the_package(cli, tmp_path, monkeypatch):
    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY, "--dry-run", "--set", "train.tensorboard=true")
    assert_user_error(res, "train.tensorboard: true needs the tensorboard package")


def test_dry_run_refuses_a_tokenizer_file_that_disagrees(cli, tmp_path, monkeypatch):
    from minigpt_cli.tokenizer.kinds import CharTokenizer

    monkeypatch.chdir(tmp_path)
    CharTokenizer.train("ab\ncd").save(tmp_path / "tok.json")
    res = cli(
        "train",
        TINY,
        "--dry-run",
        "--set",
        "tokenizer.path=tok.json",
        "--set",
        "tokenizer.kind=bpe",
        "--set",
        "tokenizer.vocab_size=300",
    )
    assert_user_error(res, "holds a char tokenizer but tokenizer.kind is bpe")


def test_dry_run_says_what_it_cannot_know_yet(cli, own_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # No corpus: the split waits for the download; a too-small val_fraction passes, said in one
    # line.
    res = cli("train", TINY, "--dry-run", "--set", "data.val_fraction=0.99999")
    assert res.exit_code == 0, res
    assert (
        "  train/val tokens      not known yet: data/tinyshakespeare/input.txt is not downloaded (or fails its "
        "checksum); train downloads it first, then checks the split\n"
    ) in res.stdout
    assert (
        "memory to train       about " in res.stdout
        and "counted with 65 entries, as count-params counts, until the tokenizer is trained"
        in res.stdout
    )
    # A trained kind not trained yet: its size is tokenizer.vocab_size; the split waits for the
    # training. (In a data folder of its own: other tests train this tokenizer into the shared one.)
    res = cli(
        "train",
        TINY,
        "--dry-run",
        "--set",
        f"data.data_dir={own_data}",
        "--set",
        "tokenizer.kind=bpe",
        "--set",
        "tokenizer.vocab_size=300",
    )
    path = own_data / "tinyshakespeare" / "tokenizer-bpe-300.json"
    assert res.exit_code == 0, res
    assert not path.exists()
    assert (
        f"  model.vocab_size      300 (tokenizer.vocab_size; trained into {path} at the first run)\n"
        in res.stdout
    )
    assert (
        f"not known yet: the bpe tokenizer is not trained yet; train trains it into {path} first"
        in res.stdout
    )
    assert "  parameters            " in res.stdout


def test_dry_run_counts_the_split_from_the_corpus_or_the_prepared_files(
    cli, own_data, tmp_path, monkeypatch, corpus_in_use
):
    from minigpt_cli.config.schema import load_config
    from minigpt_cli.data.pipeline import ensure_tokenizer
    from minigpt_cli.data.preparation import prepare

    sets = ["--set", f"data.data_dir={own_data}", "--set", "data.val_fraction=0.25"]
    res = cli("train", TINY, "--dry-run", *sets)
    assert res.exit_code == 0, res
    n = corpus_in_use.size  # characters (the genuine corpus: 836,545 / 278,849 tokens)
    n_train, vocab = int(n * 0.75), len(corpus_in_use.chars)  # vocab: 65
    line = (
        f"  train/val tokens      {n_train:,} / {n - n_train:,} (data.val_fraction 0.25; each "
        "needs model.block_size+1 = 33)\n"
    )
    assert line in res.stdout
    assert f"  model.vocab_size      {vocab} (the corpus's characters; trained into" in res.stdout
    assert (
        not list((own_data / "tinyshakespeare").glob("*-*"))
        and not (own_data / "tinyshakespeare" / "tokenizer-char.json").exists()
    )
    # Once train has prepared the token files, their meta.json gives the counts: the corpus is not
    # encoded again.
    cfg = load_config(TINY, [f"data.data_dir={own_data}", "data.val_fraction=0.25"])
    corpus = own_data / "tinyshakespeare" / "input.txt"
    tok, path = ensure_tokenizer(cfg, corpus, lambda m: None)
    data = prepare(corpus, tok, corpus.parent, 0.25, log=lambda m: None)
    assert (len(data.train), len(data.val)) == (n_train, n - n_train)
    monkeypatch.setattr(
        minigpt_cli.data.preparation, "_encode", lambda *a: pytest.fail("encoded the corpus again")
    )
    res = cli("train", TINY, "--dry-run", *sets)
    assert line in res.stdout and f"  model.vocab_size      {vocab} (from {path})\n" in res.stdout


# ----------------------------------------------------------------------------- notes in --dry-run


def test_dry_run_prints_the_notes_last(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli(
        "train",
        TINY,
        "--dry-run",
        "--set",
        "model.pos_encoding=sinusoidal",
        "--set",
        "train.max_iters=3",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "data.url=file:///home/me/my.txt",
    )
    assert res.exit_code == 0, res
    tail = res.stdout.rstrip("\n").split("\n\n")[-1].splitlines()
    assert [line.split(":")[1].split()[0] for line in tail] == [
        "data.url",
        "train.max_iters",
        "model.pos_encoding",
    ]
    assert all(line.startswith("note: ") for line in tail)
    assert "data.url is not fetched" in tail[0] and "set data.path" in tail[0]
    res = cli("train", TINY, "--dry-run")
    assert "note: " not in res.stdout
