"""The README's "Your own text" example as written: a BPE tokenizer trained for a folder of text,
then ``train --set data.path=...``, trains a BPE model, and says that it does."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

CPU = Path(__file__).resolve().parent.parent / "configs" / "shakespeare-cpu.yaml"


def test_the_own_text_bpe_example_trains_a_bpe_model(cli, corpus_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = corpus_file.read_text()
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text(text[:150_000])
    (tmp_path / "books" / "b.txt").write_text(text[-100_000:])
    made = cli("train-tokenizer", "--input", "books/", "--kind", "bpe", "--vocab-size", "400")
    assert made.exit_code == 0, made
    quick = ["--set", "train.max_iters=2", "--set", "train.eval_iters=1", "--set", "device=cpu"]
    quick += ["--set", "train.sample_tokens=0", "--set", "train.batch_size=2"]
    res = cli(
        "train", CPU, "--set", "data.path=books/", *quick, "--run-name", "own", "--no-progress"
    )
    assert res.exit_code == 0, res
    (note,) = [line for line in res.stderr.splitlines() if "train-tokenizer made for" in line]
    assert "400-entry bpe tokenizer" in note and "in place of the config's char" in note, note
    run = tmp_path / "runs" / "own"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["tokenizer"]["kind"] == "bpe" and saved["model"]["vocab_size"] == 400
    assert json.loads((run / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    # The way back to the config's tokenizer, as the note gives it, is a char model.
    keep = note.split("add --set ", 1)[1]
    dry = cli("train", CPU, "--set", "data.path=books/", "--set", keep, "--dry-run")
    assert dry.exit_code == 0 and "train-tokenizer made for" not in dry.stderr, dry
    assert "kind: char" in dry.stdout, dry
