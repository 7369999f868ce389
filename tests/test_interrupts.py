"""Ctrl-C stops every long phase (issue 40): the first SIGINT ends the command within moments, exit
130, nothing half-written, even in a process started with SIGINT ignored (``minigpt ... &`` in a
script) and inside the tokenizers library's own training loop. Each test waits on an event (a file
the phase makes), never on the clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TINY

from minigpt_cli.tokenizer.library_worker import FED_HOOK


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, corpus_file) -> Path:
    """About 2 MB of JSONL: long enough that a BPE of 6,000 entries trains for many seconds."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    paragraphs = corpus_file.read_text(encoding="utf-8").split("\n\n")
    with open(path, "w", encoding="utf-8") as f:
        for copy in range(2):
            for i, p in enumerate(paragraphs):
                f.write(json.dumps({"text": f"{p} {copy * 7 + i}"}) + "\n")
    return path


def _gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (gone, or a zombie no one reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


#: (phase, the command's arguments, what it must not leave behind) in a folder holding corpus.jsonl.
PHASES = [
    (
        "train-tokenizer: the bpe library's loop",
        ["train-tokenizer", "--kind", "bpe", "--vocab-size", "6000", "--input", "corpus.jsonl"]
        + ["--output", "out/tok.json"],
    ),
    (
        "train-tokenizer: the unigram library's loop",
        ["train-tokenizer", "--kind", "unigram", "--vocab-size", "6000", "--input", "corpus.jsonl"]
        + ["--output", "out/tok.json"],
    ),
    (
        "prepare: training its bpe tokenizer",
        ["prepare", str(TINY), "--set", "data.path=corpus.jsonl", "--set", "data.data_dir=out"]
        + ["--set", "tokenizer.kind=bpe", "--set", "tokenizer.vocab_size=6000"],
    ),
]


@pytest.mark.parametrize("ignored", [False, True], ids=["sigint", "sigint-ignored-at-start"])
@pytest.mark.parametrize("args", [p[1] for p in PHASES], ids=[p[0] for p in PHASES])
def test_ctrl_c_stops_tokenizer_training_at_once(tmp_path, corpus, args, ignored):
    (tmp_path / "corpus.jsonl").symlink_to(corpus)
    (tmp_path / "out").mkdir()
    fed = tmp_path / "fed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "minigpt_cli", *args],
        cwd=tmp_path,
        env=dict(os.environ, **{FED_HOOK: str(fed)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a script's `minigpt ... &` starts it: Python then leaves SIGINT ignored unless minigpt
        # sets it.
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
    )
    try:
        while not fed.exists():  # the event: the library has read its input; its own loop runs now
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=600)  # a bound only against a hang, never met
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "stopped by Ctrl-C (no file left half-written)", err
    assert "Traceback" not in err
    assert list((tmp_path / "out").iterdir()) == []  # no tokenizer, no token file, no temporary
    worker = int(fed.read_text())
    assert _gone(worker)  # the library's process went with the command


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory, corpus_file) -> Path:
    """About 20 MB of text: its token files take seconds to write."""
    path = tmp_path_factory.mktemp("long") / "long.txt"
    text = corpus_file.read_text(encoding="utf-8")
    path.write_text("".join(f"{text}\n{copy}\n" for copy in range(18)), encoding="utf-8")
    return path


def test_ctrl_c_stops_the_writing_of_token_files_and_leaves_none(tmp_path, long_corpus):
    (tmp_path / "out").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "minigpt_cli", "prepare", str(TINY)]
        + ["--set", f"data.path={long_corpus}", "--set", "data.data_dir=out"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The event: tokens reach a temporary token file (written, then renamed, when complete).
        while not any(p.stat().st_size for p in (tmp_path / "out").rglob(".prep-*")):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=600)  # a bound only against a hang, never met
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "stopped by Ctrl-C (no file left half-written)", err
    left = [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert not [name for name in left if name.endswith(".bin") or name.startswith(".prep-")], left
