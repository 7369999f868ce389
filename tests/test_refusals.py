"""A refused command changes nothing: every check that can refuse runs before the first write into a
run folder, a data folder or an output (issue 40). Each case snapshots the folders the command could
touch (the sha256 of every file, every link and folder) around the refusal."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import TINY, assert_user_error, record_checksums, tiny, working_dir

from minigpt_cli.trainer import train


def snapshot(*folders: Path) -> dict[str, str]:
    """Every entry under ``folders``: a file's sha256, a link's target, a folder's name (links not
    followed)."""
    out = {}
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            for name in dirs + files:
                p = Path(root) / name
                out[str(p)] = (
                    f"-> {os.readlink(p)}"
                    if p.is_symlink()
                    else "folder"
                    if p.is_dir()
                    else hashlib.sha256(p.read_bytes()).hexdigest()
                )
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A finished tiny run (5 steps) and its data folder (``data``, relative), copied by each
    test."""
    work = tmp_path_factory.mktemp("trained")
    shutil.copytree(data_dir, work / "data")
    with working_dir(work):
        train(tiny("data", "train.max_iters=5"), run_name="r", echo=lambda m: None, progress=False)
    return work


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _reshaped_weights(run: Path) -> None:
    """A weights file whose checksum is right but whose tensors are not the run's model's."""
    from safetensors.torch import load_file, save_file

    last = run / "checkpoints" / "last"
    sd = load_file(last / "model.safetensors")
    key = next(k for k in sd if k.endswith("weight") and sd[k].dim() == 2)
    sd[key] = sd[key][:, :-1].contiguous()
    save_file(sd, last / "model.safetensors", metadata={"format": "pt"})
    record_checksums(last)


def _hold_lock(run: Path):
    lock = open(run / ".lock", "rb")  # noqa: SIM115 - closed by the test
    fcntl.flock(lock, fcntl.LOCK_EX)  # another open file description: as another process's lock
    return lock


def _damage_metrics(run: Path) -> None:
    with open(run / "metrics.jsonl", "a") as f:
        f.write("{not json\n")


#: (case, what to do to the run, --set values, words of the refusal)
RESUME_REFUSALS = [
    (
        "flipped weights byte",
        lambda run: _flip_byte(run / "checkpoints" / "last" / "model.safetensors"),
        [],
        "corrupt or truncated",
    ),
    (
        "truncated weights",
        lambda run: (run / "checkpoints" / "last" / "model.safetensors").write_bytes(b"\0" * 8),
        [],
        "corrupt or truncated",
    ),
    (
        "weights of another shape",
        _reshaped_weights,
        [],
        "do not fit the model of the run's config",
    ),
    (
        "flipped trainer state byte",
        lambda run: _flip_byte(run / "checkpoints" / "last" / "trainer_state.pt"),
        [],
        "trainer state",
    ),
    (
        "no trainer state",
        lambda run: (run / "checkpoints" / "last" / "trainer_state.pt").unlink(),
        [],
        "trainer_state.pt",
    ),
    (
        "edited checkpoint config",
        lambda run: (run / "checkpoints" / "last" / "config.yaml").write_text("name: x\n"),
        [],
        "the checkpoint's config is damaged",
    ),
    ("damaged metrics", _damage_metrics, [], "metrics.jsonl"),
    ("another model", lambda run: None, ["model.n_layer=3"], "model.n_layer is 3 here but 2"),
    (
        "another optimizer",
        lambda run: None,
        ["train.optimizer=muon"],
        "train.optimizer is muon here",
    ),
    ("run in use", _hold_lock, [], "is in use by another minigpt train"),
]


@pytest.mark.parametrize(
    ("damage", "sets", "words"),
    [case[1:] for case in RESUME_REFUSALS],
    ids=[case[0] for case in RESUME_REFUSALS],
)
def test_a_refused_resume_leaves_the_run_and_data_folders_as_they_were(
    cli, tmp_path, trained, damage, sets, words
):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    run, data = tmp_path / "runs" / "r", tmp_path / "data"
    held = damage(run)
    before = snapshot(run, data)
    with working_dir(tmp_path):
        res = cli(
            "train",
            TINY,
            "--resume",
            "runs/r",
            "--set",
            "data.data_dir=data",
            "--set",
            "train.max_iters=40",
            *[w for s in sets for w in ("--set", s)],
        )
    if hasattr(held, "close"):
        held.close()
    assert_user_error(res, words, notes_ok=True)
    assert snapshot(run, data) == before


#: (case, what to do first, export's options, words of the refusal)
EXPORT_REFUSALS = [
    (
        "flipped weights byte",
        lambda run, out: _flip_byte(run / "checkpoints" / "last" / "model.safetensors"),
        ["--checkpoint", "last"],
        "corrupt or truncated",
    ),
    (
        "output holds other files",
        lambda run, out: (out.mkdir(), (out / "notes.txt").write_text("mine")),
        ["--force"],
        "out",
    ),
    ("an architecture that cannot express it", lambda run, out: None, ["--arch", "llama"], "llama"),
    ("gguf of a char tokenizer", lambda run, out: None, ["--format", "gguf"], "tokenizer"),
    (
        "no such checkpoint",
        lambda run, out: None,
        ["--checkpoint", "step-7"],
        "kept no checkpoint at step 7",
    ),
]


@pytest.mark.parametrize(
    ("damage", "options", "words"),
    [case[1:] for case in EXPORT_REFUSALS],
    ids=[case[0] for case in EXPORT_REFUSALS],
)
def test_a_refused_export_leaves_the_run_and_the_output_as_they_were(
    cli, tmp_path, trained, damage, options, words
):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    run, out = tmp_path / "runs" / "r", tmp_path / "exports" / "out"
    out.parent.mkdir()
    damage(run, out)
    before = snapshot(run, out.parent)
    res = cli("export", run, "-o", out, *options)
    assert_user_error(res, words, notes_ok=True)
    assert snapshot(run, out.parent) == before


def _tokenizer_file(data: Path, text: str) -> Path:
    path = data / "mine.json"
    path.write_text(text)
    return path


def _corpus(data: Path, name: str, make: str) -> None:
    """A corpus beside the data folder: a 12-character file, or a folder of a FIFO and a
    self-link."""
    path = data.parent / name
    if make == "small":
        path.write_text("hello world\n")
        return
    path.mkdir()
    os.mkfifo(path / "pipe.txt")
    (path / "self.txt").symlink_to("self.txt")


#: (case, what to do to the data folder, --set values, words of the refusal)
PREPARE_REFUSALS = [
    (
        "a damaged tokenizer file",
        lambda data: _tokenizer_file(data, '{"model": '),
        ["tokenizer.kind=bpe", "tokenizer.path=data/mine.json"],
        "mine.json",
    ),
    ("no such corpus", lambda data: None, ["data.path=nothere.txt"], "nothere.txt"),
    (
        "a vocabulary too small",
        lambda data: None,
        ["tokenizer.kind=bpe", "tokenizer.vocab_size=3"],
        "vocabulary size 3",
    ),
    # A corpus the split refuses: the tokenizer is trained, but neither it nor its folder is saved.
    (
        "a corpus too small to split",
        lambda data: _corpus(data, "small.txt", "small"),
        ["data.path=small.txt"],
        "too few for train and val",
    ),
    (
        "a corpus too small to split (train)",
        lambda data: _corpus(data, "small.txt", "small"),
        ["data.path=small.txt", "train.out_dir=data/runs"],
        "too few for train and val",
    ),
    (
        "a corpus folder of no readable file",
        lambda data: _corpus(data, "cdir", "folder"),
        ["data.path=cdir"],
        "cdir",
    ),
]


@pytest.mark.parametrize(
    ("damage", "sets", "words"),
    [case[1:] for case in PREPARE_REFUSALS],
    ids=[case[0] for case in PREPARE_REFUSALS],
)
def test_a_refused_prepare_or_train_leaves_the_data_folder_as_it_was(
    cli, tmp_path, trained, damage, sets, words
):
    shutil.copytree(trained / "data", tmp_path / "data")
    data = tmp_path / "data"
    damage(data)
    before = snapshot(data)
    with working_dir(tmp_path):
        command = "train" if any(s.startswith("train.") for s in sets) else "prepare"
        res = cli(
            command, TINY, "--set", "data.data_dir=data", *[w for s in sets for w in ("--set", s)]
        )
    assert_user_error(res, words, notes_ok=True)
    assert snapshot(data) == before


#: (case, the sweep file's fields, sweep's options, words of the refusal)
SWEEP_REFUSALS = [
    ("a variant's bad config", {"grid": {"model.n_head": [5]}}, [], "n_head"),
    ("a bad --budget", {}, ["--budget", "steps=3"], "budget"),
    ("a bad --set", {}, ["--set", "train.max_iters=1:30"], "reads as 90 in YAML 1.1"),
    ("an unknown key", {"grid": {"train.nope": [1, 2]}}, [], "train.nope"),
]


@pytest.mark.parametrize(
    ("fields", "options", "words"),
    [case[1:] for case in SWEEP_REFUSALS],
    ids=[case[0] for case in SWEEP_REFUSALS],
)
def test_a_refused_sweep_leaves_its_folder_and_data_as_they_were(
    cli, tmp_path, trained, fields, options, words
):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    spec = {
        "name": "s",
        "base": str(TINY),
        "set": ["data.data_dir=data", "train.sample_tokens=0"],
        "grid": {"model.ffn": ["relu", "gelu"]},
        "seeds": 1,
        "budget": {"iters": 2},
        **fields,
    }
    (tmp_path / "s.yaml").write_text(json.dumps(spec))
    (tmp_path / "runs" / "s").mkdir()  # an earlier sweep's folder, as far as a refusal may know
    (tmp_path / "runs" / "s" / "sweep.json").write_text("{}\n")
    before = snapshot(tmp_path / "runs", tmp_path / "data")
    with working_dir(tmp_path):
        res = cli("sweep", "s.yaml", *options)
    assert_user_error(res, words, notes_ok=True)
    assert snapshot(tmp_path / "runs", tmp_path / "data") == before
