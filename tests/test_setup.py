"""One set-up: ``train --dry-run`` runs train's own set-up (trainer.setup.plan), stopped before its
first write, so it refuses what train refuses with the same line, names what it cannot check yet,
and reports the figures train and the other commands use (memory, split); each corpus file is hashed
once per process."""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter

import pytest
from helpers import TINY, assert_user_error, tiny, working_dir
from test_corpus import shakespeare, write_docs  # noqa: F401 (a fixture)
from test_schedule import own_data  # noqa: F401 (a fixture)

import minigpt_cli.data.corpus as C
import minigpt_cli.data.download as D
from minigpt_cli.trainer import train

REPO_CONFIGS = TINY.parent


def _error(res) -> str:
    return [line for line in res.stderr.splitlines() if line.startswith("error: ")][-1]


def test_a_check_the_dry_run_cannot_make_yet_is_named_with_its_reason(cli, tmp_path, monkeypatch):
    """No corpus on disk: the vocabulary is unknown, so model.vocab_size=10 cannot be checked; it is
    named."""
    monkeypatch.chdir(tmp_path)
    res = cli("train", "shakespeare-cpu", "--set", "model.vocab_size=10", "--dry-run")
    assert res.exit_code == 0, res
    line = next(
        line for line in res.stdout.splitlines() if "not checked: model.vocab_size 10" in line
    )
    assert "input.txt is not downloaded" in line, line
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing downloaded


# count-params counts Tiny Shakespeare's 65 characters where model.vocab_size is null
@pytest.mark.genuine_corpus
def test_dry_run_and_count_params_print_one_memory_figure(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = REPO_CONFIGS / "shakespeare-cpu.yaml"
    dry = cli("train", config, "--dry-run", "--set", f"data.data_dir={data_dir}")
    counted = cli("count-params", "--config", config)
    assert dry.exit_code == 0 and counted.exit_code == 0, (dry, counted)
    figure = re.search(r"memory to train +about ([\d.]+ [KMG]iB)", dry.stdout).group(1)
    total = next(line for line in counted.stdout.splitlines() if line.startswith("total, estimate"))
    assert total.split()[-2:] == figure.split(), (figure, total)


def test_train_tokenizer_prepare_and_train_report_one_split_of_a_folder_of_documents(
    cli, tmp_path, shakespeare, monkeypatch
):
    """15 documents of different lengths: validation is the last 2 whole documents for all three
    commands."""
    monkeypatch.chdir(tmp_path)
    paths = write_docs(
        tmp_path / "books", [shakespeare[i * 3000 : i * 3000 + 1000 + 300 * i] for i in range(15)]
    )
    tok = cli("train-tokenizer", TINY, "--input", "books", "--kind", "char")
    assert tok.exit_code == 0, tok
    val_tokens = int(re.search(r"val split tokens +([\d,]+)", tok.stdout).group(1).replace(",", ""))
    dry = cli("train", TINY, "--set", "data.path=books", "--dry-run")
    assert dry.exit_code == 0, dry
    dry_val = int(
        re.search(r"train/val tokens +[\d,]+ / ([\d,]+)", dry.stdout).group(1).replace(",", "")
    )
    prep = cli("prepare", TINY, "--set", "data.path=books")
    assert prep.exit_code == 0, prep
    prep_val = int(re.search(r"([\d,]+) val tokens", prep.stdout).group(1).replace(",", ""))
    last_two = sum(len(p.read_text()) for p in paths[-2:])
    assert (
        val_tokens == dry_val == prep_val == last_two + 2
    )  # two documents and the blank line between them


LONG_NAME = "x" * 300


def _block_token_dir(data, tmp_path, cli):
    """Prepare the data, then put a file where its token folder goes."""
    assert cli("prepare", TINY, "--set", f"data.data_dir={data}").exit_code == 0
    folder = next((data / "tinyshakespeare").glob("char-*"))
    shutil.rmtree(folder)
    folder.write_text("in the way\n")
    return f"cannot write {folder}: File exists"


def _unreadable_train_bin(data, tmp_path, cli):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root reads files whatever their permissions")
    assert cli("prepare", TINY, "--set", f"data.data_dir={data}").exit_code == 0
    train_bin = next((data / "tinyshakespeare").glob("char-*")) / "train.bin"
    train_bin.chmod(0)
    return str(train_bin)


@pytest.mark.parametrize("case", ["name", "token folder", "train.bin"])
def test_dry_run_refuses_what_train_refuses_issue_27(cli, own_data, tmp_path, case):
    """--dry-run passed and train then failed for these; now both refuse, with the same line."""
    sets = [f"data.data_dir={own_data}", "train.max_iters=2", "train.eval_interval=2"]
    with working_dir(tmp_path):
        if case == "name":
            sets.append(f"name={LONG_NAME}")
            fragment = "name: string should have at most 200 characters"  # the schema refuses it before either route
        elif case == "token folder":
            fragment = _block_token_dir(own_data, tmp_path, cli)
        else:
            fragment = _unreadable_train_bin(own_data, tmp_path, cli)
        args = ["train", TINY, "--no-progress", *[w for s in sets for w in ("--set", s)]]
        dry, real = cli(*args, "--dry-run"), cli(*args)
    assert_user_error(dry, fragment)
    assert_user_error(real, fragment, notes_ok=True)
    stamp = re.compile(r"-\d{8}-\d{6}")  # a new run's folder is named by the second it starts
    assert stamp.sub("-STAMP", _error(dry)) == stamp.sub("-STAMP", _error(real))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_train_hashes_each_corpus_file_once(data_dir, tmp_path, shakespeare, monkeypatch):
    """The corpus fingerprint is found once per process: one sha256 pass per file, named dataset or
    folder."""
    monkeypatch.chdir(tmp_path)
    hashed: Counter = Counter()
    real_sha, real_ok = C._sha256, D.file_ok

    def counted_sha(path, on_bytes):
        hashed[os.path.realpath(path)] += 1
        return real_sha(path, on_bytes)

    def counted_ok(path, *args, **kwargs):
        hashed[os.path.realpath(path)] += 1
        return real_ok(path, *args, **kwargs)

    monkeypatch.setattr(C, "_sha256", counted_sha)
    monkeypatch.setattr(D, "file_ok", counted_ok)
    train(tiny(data_dir, "train.max_iters=2"), echo=lambda m: None, progress=False)
    assert hashed == Counter({os.path.realpath(data_dir / "tinyshakespeare" / "input.txt"): 1})
    hashed.clear()
    paths = write_docs(
        tmp_path / "books", [shakespeare[i * 2000 : (i + 1) * 2000] for i in range(3)]
    )
    train(
        tiny(data_dir, "train.max_iters=2", f"data.path={tmp_path / 'books'}"),
        echo=lambda m: None,
        progress=False,
    )
    assert hashed == Counter({os.path.realpath(p): 1 for p in paths})


@pytest.mark.parametrize("damage", ["weights", "metrics"])
def test_dry_run_resume_refuses_damaged_files_as_train_does(cli, own_data, tmp_path, damage):
    """A bit flipped in the last checkpoint's weights, or a line that is not an event in
    metrics.jsonl: train
    --resume refused them and --dry-run --resume passed (QA); now both refuse, with the same
      line."""
    sets = [f"data.data_dir={own_data}", "train.eval_interval=2", "train.eval_iters=1"]
    with working_dir(tmp_path):
        train(
            tiny(own_data, "train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1"),
            run_name="r",
            echo=lambda m: None,
            progress=False,
        )
        run = tmp_path / "runs" / "r"
        if damage == "weights":
            weights = run / "checkpoints" / "last" / "model.safetensors"
            data = bytearray(weights.read_bytes())
            data[-100] ^= 0x40
            weights.write_bytes(bytes(data))
            fragment = "are corrupt or truncated"
        else:
            with open(run / "metrics.jsonl", "a") as f:
                f.write("[1, 2, 3]\n{}\n")
            fragment = "is not a metrics event"
        args = [
            "train",
            TINY,
            "--resume",
            str(run),
            "--no-progress",
            "--set",
            "train.max_iters=4",
            *[w for s in sets for w in ("--set", s)],
        ]
        dry, real = cli(*args, "--dry-run"), cli(*args)
    assert_user_error(dry, fragment)
    assert_user_error(real, fragment, notes_ok=True)
    assert _error(dry) == _error(real)


def test_a_tokenizer_path_of_the_users_is_never_advised_deleted(cli, own_data, tmp_path):
    with working_dir(tmp_path):
        (tmp_path / "mytok.json").write_text('{"x": 1}')
        res = cli(
            "train",
            TINY,
            "--dry-run",
            "--set",
            f"data.data_dir={own_data}",
            "--set",
            "tokenizer.path=mytok.json",
        )
    assert_user_error(res, "'mytok.json' is not a minigpt tokenizer", "pass a tokenizer file")
    assert "delete" not in res.stderr and (tmp_path / "mytok.json").read_text() == '{"x": 1}'
