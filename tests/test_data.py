"""Char tokenizer and data preparation on the real corpus."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY, assert_user_error

from minigpt_cli.config.schema import load_config
from minigpt_cli.data.pipeline import BatchSampler, with_vocab
from minigpt_cli.data.preparation import check_split_counts, prepare, split_text, token_dtype
from minigpt_cli.errors import MinigptError
from minigpt_cli.tokenizer.kinds import CharTokenizer, load_tokenizer


def split_sizes(corpus) -> tuple[int, int]:
    """nanoGPT's 90/10 split of the corpus in use, in characters: ``int(n * 0.9)`` and the rest
    (the genuine corpus: 1,003,854 and 111,540)."""
    n = len(corpus.data.decode("utf-8"))
    return int(n * 0.9), n - int(n * 0.9)


@pytest.mark.genuine_corpus
def test_the_genuine_corpus_has_nanogpts_figures(corpus_in_use):
    """The figures the docs quote for Tiny Shakespeare: its bytes, nanoGPT's shakespeare_char
    alphabet of 65 characters, and its 90/10 split."""
    assert corpus_in_use.size == 1_115_394 and len(corpus_in_use.chars) == 65
    assert split_sizes(corpus_in_use) == (1_003_854, 111_540)


def test_char_tokenizer_round_trip_and_json(tmp_path, corpus_file, corpus_in_use):
    text = corpus_file.read_text(encoding="utf-8")
    tok = CharTokenizer.train(text)
    assert tok.vocab_size == len(corpus_in_use.chars)  # the genuine corpus: 65
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
    with pytest.raises(MinigptError, match=r"is damaged \(.*\); delete it and train it again"):
        load_tokenizer(p)
    with pytest.raises(MinigptError, match="not found"):
        load_tokenizer(tmp_path / "missing.json")


def test_split_is_nanogpts_90_10():
    train, val = split_text("x" * 1_115_394)
    assert (len(train), len(val)) == (1_003_854, 111_540)


def test_prepare_writes_memmaps_with_a_sidecar(tmp_path, corpus_file, corpus_in_use):
    n_train, n_val = split_sizes(corpus_in_use)
    text = corpus_file.read_text(encoding="utf-8")
    tok = CharTokenizer.train(text)
    logs = []
    data = prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
    assert len(data.train) == n_train and len(data.val) == n_val
    assert data.train.dtype == np.uint16
    meta = json.loads((data.directory / "meta.json").read_text())
    assert meta["tokenizer_kind"] == "char" and meta["tokenizer_fingerprint"] == tok.fingerprint()
    assert meta["train_tokens"] == n_train and meta["val_tokens"] == n_val
    assert tok.decode(data.train[:20]) == text[:20]
    assert tok.decode(data.val[:20]) == text[n_train : n_train + 20]
    # A second call reuses the files.
    mtime = (data.directory / "train.bin").stat().st_mtime_ns
    prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
    assert (data.directory / "train.bin").stat().st_mtime_ns == mtime
    assert len(logs) == 1
    # A truncated token file is noticed and rebuilt.
    with open(data.directory / "train.bin", "r+b") as f:
        f.truncate(100)
    again = prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
    assert len(again.train) == n_train and len(logs) == 2


@pytest.mark.parametrize("fraction, small", [(0.99999999, "train"), (1e-7, "val")])
def test_prepare_refuses_an_empty_split_before_writing(
    tmp_path, corpus_file, corpus_in_use, fraction, small
):
    """A val_fraction that leaves a split (nearly) empty: one line naming it, and nothing on
    disk."""
    tok = CharTokenizer.train(corpus_file.read_text(encoding="utf-8"))
    with pytest.raises(MinigptError) as e:
        prepare(corpus_file, tok, tmp_path / "out", fraction, log=lambda m: None)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"data.val_fraction={fraction:.12g} splits" in msg and f"too few for {small} " in msg, (
        msg
    )
    n = corpus_in_use.size  # characters: the corpus is ASCII
    n_train = 0 if small == "train" else n - 1
    assert f"{n_train:,} train and {n - n_train:,} val tokens" in msg, msg
    assert not (tmp_path / "out").exists()


def test_a_full_disk_while_writing_token_files_names_the_file_issue_27(
    tmp_path, corpus_file, monkeypatch
):
    """ENOSPC on a token file's write (injected): one line naming the file, and no temporary file
    left."""
    import errno
    import io
    import os

    from minigpt_cli.data import preparation

    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    tok = CharTokenizer.train(corpus_file.read_text(encoding="utf-8"))
    monkeypatch.setattr(preparation.os, "fdopen", lambda fd, mode: FullDisk(fd, mode))
    with pytest.raises(MinigptError) as e:
        prepare(corpus_file, tok, tmp_path / "out", 0.1, log=lambda m: None)
    folder = tmp_path / "out" / f"char-{tok.fingerprint()}"
    assert str(e.value) == (
        f"cannot write {folder / 'train.bin'}: No space left on device; "
        "free some disk space or choose another location"
    )
    assert not (tmp_path / "out").exists()  # no temporary token file, no folder made for them


def test_prepare_refuses_an_empty_split_left_by_an_earlier_run(tmp_path, corpus_file):
    """A 0-byte train.bin with its meta.json (what the crash used to leave) is not memmapped."""
    tok = CharTokenizer.train(corpus_file.read_text(encoding="utf-8"))
    data = prepare(corpus_file, tok, tmp_path, 0.5, log=lambda m: None)
    meta = json.loads((data.directory / "meta.json").read_text())
    meta.update(val_fraction=0.99999999, train_tokens=0, val_tokens=1_115_394)
    (data.directory / "meta.json").write_text(json.dumps(meta))
    (data.directory / "train.bin").write_bytes(b"")
    with pytest.raises(MinigptError, match="data.val_fraction"):
        prepare(corpus_file, tok, tmp_path, 0.99999999, log=lambda m: None)


def test_a_split_too_small_for_the_block_size_is_refused_naming_it(tmp_path, corpus_file):
    tok = CharTokenizer.train(corpus_file.read_text(encoding="utf-8"))
    data = prepare(corpus_file, tok, tmp_path, 0.9999, log=lambda m: None)
    n_train, n_val = len(data.train), len(data.val)
    assert n_train == 111
    prepare(
        corpus_file, tok, tmp_path, 0.9999, log=lambda m: None, block_size=110
    )  # one window of 110 + 1
    with pytest.raises(MinigptError) as e:
        prepare(
            corpus_file, tok, tmp_path, 0.9999, log=lambda m: None, block_size=111
        )  # the files reused
    msg = str(e.value)
    assert "data.val_fraction=0.9999" in msg and f"{n_train:,} train and {n_val:,} val" in msg, msg
    assert "too few for train " in msg and "model.block_size+1 = 112" in msg, msg
    assert (
        "choose a data.val_fraction such as 0.1" in msg and "to at most 110 with this split" in msg
    )
    # A block the whole corpus cannot hold twice: another split would not help, so it is not
    # suggested.
    with pytest.raises(MinigptError) as e:
        prepare(corpus_file, tok, tmp_path, 0.1, log=lambda m: None, block_size=1_000_000)
    assert "val_fraction such as" not in str(e.value) and "lower model.block_size" in str(e.value)


def test_prepare_redoes_token_files_with_ids_beyond_the_vocabulary(tmp_path, corpus_file):
    """A damaged train.bin (right size, an id ≥ vocab_size) is noticed and prepared again."""
    tok = CharTokenizer.train(corpus_file.read_text(encoding="utf-8"))
    logs = []
    data = prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
    good = np.array(data.train[:10])
    del data
    for split in ("train", "val"):
        damaged = np.memmap(
            tmp_path / f"char-{tok.fingerprint()}" / f"{split}.bin", dtype=np.uint16, mode="r+"
        )
        damaged[5] = 65_535
        damaged.flush()
        del damaged
        again = prepare(corpus_file, tok, tmp_path, 0.1, log=logs.append)
        assert int(np.max(again.train)) < tok.vocab_size and int(np.max(again.val)) < tok.vocab_size
        assert np.array_equal(np.array(again.train[:10]), good)
        beyond = f"beyond the tokenizer's {tok.vocab_size} entries"  # the genuine corpus: 65
        assert f"{split}.bin holds token id 65,535, {beyond}" in logs[-2], logs
        assert logs[-1].startswith("preparing token files in")
        del again


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


def test_the_refused_fraction_is_written_as_given():
    """0.9999999 is not rounded to 1 (a value the schema refuses) in the message."""
    with pytest.raises(
        MinigptError, match=r"data.val_fraction=0.9999999 splits the corpus into 0 train"
    ):
        check_split_counts(0.9999999, 0, 1_115_394, 32)


def test_check_split_counts_names_what_is_needed_and_a_fraction_that_fits():
    check_split_counts(0.5, 33, 33, 32)  # one window each
    with pytest.raises(
        MinigptError, match=r"too few for val \(they need at least model.block_size\+1 = 33"
    ):
        check_split_counts(0.5, 33, 32, 32)
    # A (nearly) empty side: with a block size, the message says what the block needs, not just "2
    # tokens".
    with pytest.raises(
        MinigptError, match=r"too few for train \(they need at least model.block_size\+1 = 33"
    ):
        check_split_counts(0.5, 1, 40, 32)
    with pytest.raises(
        MinigptError, match=r"too few for train \(they need at least 2 tokens each\)"
    ):
        check_split_counts(0.5, 1, 40)  # no block size: only the emptiness check
    check_split_counts(0.5, 2, 2)
    # The fraction suggested is never the one in use, and leaves both sides enough (90 + 10 tokens,
    # need 33).
    with pytest.raises(MinigptError) as e:
        check_split_counts(0.1, 90, 10, 32)
    suggested = float(re.search(r"such as ([0-9.]+),", str(e.value)).group(1))
    assert suggested != 0.1 and 33 <= 100 * suggested <= 100 - 33


def test_a_split_refusal_gives_a_block_size_then_accepted_or_says_the_corpus_is_too_small():
    """ "to at most M" is a block size the same split accepts; when this split holds no window of any
    block size, no bound is given: another fraction when the corpus allows one, else the corpus is
    too small."""
    for n_train in range(0, 12):
        for n_val in range(0, 12):
            for block in (1, 2, 5, 64):
                try:
                    check_split_counts(0.1, n_train, n_val, block)
                    continue
                except MinigptError as exc:
                    msg = str(exc)
                most = re.search(r"to at most (\d+) with this split", msg)
                if most:
                    check_split_counts(0.1, n_train, n_val, int(most.group(1)))  # accepted
                else:
                    assert min(n_train, n_val) < 2 and "lower model.block_size (to" not in msg, msg
                    assert ("data.val_fraction such as" in msg) != (
                        "the corpus is too small" in msg
                    ), msg
    # The QA case: 3 characters, 2 train and 1 val token; block_size 1 would still leave val 1 token
    # short.
    for block in (64, 1):
        with pytest.raises(MinigptError) as e:
            check_split_counts(0.1, 2, 1, block)
        assert "the corpus is too small for any model.block_size (3 tokens" in str(e.value)
        assert f"about {(block + 1) * 10} tokens give each side {block + 1}" in str(e.value)


def test_a_three_character_corpus_is_too_small_through_the_cli(cli, tmp_path):
    (tmp_path / "three.txt").write_text("abc")
    res = cli(
        "train",
        TINY,
        "--set",
        f"data.path={tmp_path / 'three.txt'}",
        "--set",
        f"data.data_dir={tmp_path}",
        "--set",
        "sample.prompt=a",
        "--dry-run",
    )
    assert_user_error(
        res, "2 train and 1 val tokens", "the corpus is too small for any model.block_size"
    )
    assert "lower model.block_size" not in res.stderr


def test_a_dry_prepare_counts_what_prepare_writes(tmp_path, corpus_file):
    tok = CharTokenizer.train(corpus_file.read_text(encoding="utf-8"))
    counts = prepare(corpus_file, tok, tmp_path, 0.3, write=False).counts
    assert not list(tmp_path.iterdir())  # nothing written
    data = prepare(corpus_file, tok, tmp_path, 0.3, log=lambda m: None)
    assert (
        counts
        == (len(data.train), len(data.val))
        == prepare(corpus_file, tok, tmp_path, 0.3, write=False).counts
    )
    with pytest.raises(MinigptError, match="too few for val"):
        prepare(corpus_file, tok, tmp_path, 1e-7, write=False)


def test_with_vocab_fills_a_null_size_and_refuses_a_smaller_one():
    tiny = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
    assert with_vocab(load_config(tiny), 65).model.vocab_size == 65
    assert with_vocab(load_config(tiny, ["model.vocab_size=128"]), 65).model.vocab_size == 128
    with pytest.raises(MinigptError) as e:
        with_vocab(load_config(tiny, ["model.vocab_size=64"]), 65)
    assert str(e.value) == (
        "model.vocab_size (64) is smaller than the tokenizer's 65 entries; set "
        "model.vocab_size: null to take it from the tokenizer"
    )


def test_a_failed_download_from_data_url_says_it_must_be_a_mirror(tmp_path, corpus_server):
    from minigpt_cli.data.pipeline import ensure_corpus

    tiny = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
    cfg = load_config(
        tiny, [f"data.data_dir={tmp_path}", f"data.url={corpus_server.url('/missing.txt')}"]
    )
    with pytest.raises(MinigptError) as e:
        ensure_corpus(cfg, log=lambda m: None, progress=False)
    assert "fix data.url in the config" in str(e.value)
    assert "a mirror of the tinyshakespeare corpus itself, not another text" in str(e.value)
