"""Char tokenizer and data preparation on the real corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from minigpt_cli.data import BatchSampler, prepare, split_text, token_dtype
from minigpt_cli.errors import MinigptError
from minigpt_cli.tokenizer import CharTokenizer, load_tokenizer


def test_char_tokenizer_round_trip_and_json(tmp_path, corpus_file):
    text = corpus_file.read_text(encoding="utf-8")
    tok = CharTokenizer.train(text)
    assert tok.vocab_size == 65  # nanoGPT's shakespeare_char alphabet
    assert tok.chars == sorted(set(text))
    assert tok.decode(tok.encode(text)) == text
    path = tmp_path / "tok.json"
    tok.save(path)
    obj = json.loads(path.read_text())  # JSON, not pickle
    assert obj["kind"] == "char" and obj["chars"] == tok.chars
    again = load_tokenizer(path)
    assert again.encode("ROMEO: O, she doth teach!") == tok.encode("ROMEO: O, she doth teach!")
    assert again.fingerprint() == tok.fingerprint()


def test_unknown_characters_are_listed_once():
    tok = CharTokenizer.train("abc \n")
    with pytest.raises(MinigptError) as e:
        tok.encode("abzzc é z")
    msg = str(e.value)
    assert "'z'" in msg and "'é'" in msg
    assert msg.count("'z'") == 1
    assert tok.unknown("abzzc é z") == ["z", "é"]


def test_damaged_tokenizer_file_is_refused(tmp_path):
    p = tmp_path / "tok.json"
    p.write_text("{not json")
    with pytest.raises(MinigptError, match="not valid JSON"):
        load_tokenizer(p)
    with pytest.raises(MinigptError, match="not found"):
        load_tokenizer(tmp_path / "missing.json")


def test_split_is_nanogpts_90_10():
    train, val = split_text("x" * 1_115_394)
    assert (len(train), len(val)) == (1_003_854, 111_540)


def test_prepare_writes_memmaps_with_a_sidecar(tmp_path, corpus_file):
    text = corpus_file.read_text(encoding="utf-8")
    tok = CharTokenizer.train(text)
    logs = []
    data = prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
    assert len(data.train) == 1_003_854 and len(data.val) == 111_540
    assert data.train.dtype == np.uint16
    meta = json.loads((data.directory / "meta.json").read_text())
    assert meta["tokenizer_kind"] == "char" and meta["tokenizer_fingerprint"] == tok.fingerprint()
    assert meta["train_tokens"] == 1_003_854 and meta["val_tokens"] == 111_540
    assert tok.decode(data.train[:20]) == text[:20]
    assert tok.decode(data.val[:20]) == text[1_003_854:1_003_874]
    # A second call reuses the files.
    mtime = (data.directory / "train.bin").stat().st_mtime_ns
    prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
    assert (data.directory / "train.bin").stat().st_mtime_ns == mtime
    assert len(logs) == 1
    # A truncated token file is noticed and rebuilt.
    with open(data.directory / "train.bin", "r+b") as f:
        f.truncate(100)
    again = prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
    assert len(again.train) == 1_003_854 and len(logs) == 2


def test_token_dtype_widens_past_uint16():
    assert token_dtype(65) == np.uint16
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


def test_batches_are_shifted_windows():
    tokens = np.arange(1000, dtype=np.uint16)
    s = BatchSampler(tokens, block_size=8, batch_size=4, seed=0, device=torch.device("cpu"))
    x, y = s.next()
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.long
    assert torch.equal(y, x + 1)  # consecutive ids: y is x shifted by one position
    state = s.state()
    a = s.next()[0]
    s.set_state(state)
    assert torch.equal(s.next()[0], a)


def test_too_short_split_is_a_clear_error():
    with pytest.raises(MinigptError, match="block_size"):
        BatchSampler(np.arange(5, dtype=np.uint16), 8, 2, 0, torch.device("cpu"))
