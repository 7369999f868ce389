"""Your own corpus (data.path): files, folders, globs and JSON Lines, read in a stream and prepared
in batches."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY, assert_user_error, records

from minigpt_cli.config.schema import Config
from minigpt_cli.data import corpus as C
from minigpt_cli.data import preparation as P
from minigpt_cli.tokenizer.kinds import CharTokenizer
from minigpt_cli.tokenizer.training import SPLIT_PATTERN, train_tokenizer

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def shakespeare(corpus_file) -> str:
    return corpus_file.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def bpe(shakespeare):
    """A small byte-level BPE with an end-of-text token, trained once."""
    return train_tokenizer("bpe", shakespeare[:200_000], 400, [EOT])


def write_docs(folder: Path, docs: list[str]) -> list[Path]:
    """One .txt file per document, every third in a subfolder; returned in reading order (sorted by
    path)."""
    paths = []
    for i, d in enumerate(docs):
        p = folder / ("sub" if i % 3 == 0 else "") / f"doc{i:02d}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(d, encoding="utf-8")
        paths.append(p)
    return sorted(paths)


def ids(path: Path, dtype=np.uint16) -> list[int]:
    return np.fromfile(path, dtype=dtype).tolist()


# ----------------------------------------------------------------------------- reading


def test_pieces_rejoin_exactly_and_cut_only_where_gpt2_splits(shakespeare):
    text = shakespeare[:50_000]
    pieces = list(C.cut_pieces([text[:7_000], text[7_000:31_000], text[31_000:]], size=500))
    assert "".join(pieces) == text and len(pieces) > 50
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    words = {
        end for _, (_, end) in split.pre_tokenize_str(text)
    }  # GPT-2's boundaries in the whole text
    cuts = np.cumsum([len(p) for p in pieces])[:-1]
    assert all(int(c) in words for c in cuts)
    # A special token holding a space is never cut, even where a safe cut would fall inside it.
    special = "<my end>"
    text2 = ("word " * 40 + special + " ") * 50
    pieces2 = list(C.cut_pieces([text2], size=30, special_tokens=[special]))
    assert "".join(pieces2) == text2
    assert all(p.count("<my") == p.count("end>") for p in pieces2)
    # A stretch with no whitespace at all is cut anyway, so a piece never grows without bound.
    blob = "x" * 100_000
    assert max(map(len, C.cut_pieces([blob], size=100))) <= 100 * C.HARD_CUT_FACTOR


def test_streamed_ids_equal_the_whole_texts_and_the_tail_split_is_nanogpts(
    tmp_path, shakespeare, bpe, monkeypatch, capsys
):
    """One file, many small pieces and batches: the ids are those of encoding each split's whole
    text."""
    monkeypatch.setattr(C, "PIECE_CHARS", 700)
    monkeypatch.setattr(C, "BLOCK", 4096)
    monkeypatch.setattr(P, "BATCH_CHARS", 20_000)
    text = shakespeare[:120_000]
    src = tmp_path / "plays.txt"
    src.write_text(text, encoding="utf-8")
    data = P.prepare(src, bpe, tmp_path / "out", 0.1, log=lambda m: None, progress=True)
    train_text, val_text = P.split_text(text, 0.1)
    assert data.train.tolist() == bpe.encode(train_text)
    assert data.val.tolist() == bpe.encode(val_text)
    assert data.meta["split"] == "tail" and data.meta["documents"] == 1
    assert "prepare" in capsys.readouterr().err  # the bar, in bytes
    # The same text as a char corpus: identical to the one-shot split nanoGPT makes (90/10 of the
    # characters).
    char = CharTokenizer.train(text)
    cdata = P.prepare(src, char, tmp_path / "out", 0.1, log=lambda m: None)
    assert len(cdata.train) == int(len(text) * 0.9) and len(cdata.val) == len(text) - int(
        len(text) * 0.9
    )


@pytest.mark.parametrize("special", [None, EOT])
def test_many_documents_are_split_by_whole_documents_and_joined(tmp_path, shakespeare, special):
    """12 documents: validation is the last round(12·0.1) = 1; train the other 11 joined by the
    separator."""
    docs = [shakespeare[i * 3000 : (i + 1) * 3000] for i in range(12)]
    paths = write_docs(tmp_path / "books", docs)
    in_order = [p.read_text() for p in paths]
    tok = CharTokenizer.train("".join(docs) + "\n", [special] if special else [])
    data = P.prepare(tmp_path / "books", tok, tmp_path / "out", 0.1, log=lambda m: None)
    sep = tok.encode(special) if special else tok.encode("\n\n")
    want_train = []
    for i, d in enumerate(in_order[:11]):
        want_train += (sep if i else []) + tok.encode(d)
    assert data.train.tolist() == want_train
    assert data.val.tolist() == tok.encode(in_order[11])
    assert data.meta["split"] == "documents" and data.meta["documents"] == 12
    assert data.meta["separator"] == (special or "blank line")
    assert [r["path"] for r in data.meta["corpus_files"]] == [str(p.resolve()) for p in paths]


def test_jsonl_glob_and_text_field(tmp_path, shakespeare):
    cuts = [0, 500, 1200, 1500, 2100]
    docs = [shakespeare[a:b] for a, b in zip(cuts, cuts[1:])]
    (tmp_path / "a.jsonl").write_text(
        "".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(docs[:2])) + "\n",
        encoding="utf-8",
    )  # a blank line is skipped
    (tmp_path / "b.jsonl").write_text(
        "".join(json.dumps({"body": d}) + "\n" for d in docs[2:]), encoding="utf-8"
    )
    corpus = C.open_corpus(str(tmp_path / "*.jsonl"), text_field="body")
    assert [f.path.name for f in corpus.files] == ["a.jsonl", "b.jsonl"]
    tok = CharTokenizer.train("\n".join(docs))
    data = P.prepare(corpus, tok, tmp_path / "out", 0.25, log=lambda m: None)
    joined = "\n\n".join(
        docs
    )  # 4 documents: the tail 25% of the text, 1,575 of 2,100 characters, in doc 4
    assert tok.decode(data.train.tolist() + data.val.tolist()) == joined
    assert tok.decode(data.train.tolist()) == joined[: 1575 + 3 * len("\n\n")]
    # Another field is another corpus: another fingerprint.
    assert (
        C.open_corpus(str(tmp_path / "*.jsonl"), text_field="id").fingerprint != corpus.fingerprint
    )


def test_preparation_streams_in_bounded_memory(tmp_path, shakespeare, monkeypatch):
    """A 4.5 MB file prepared in 64 KB blocks and 32 KB batches never holds more than a few
    batches."""
    monkeypatch.setattr(C, "BLOCK", 1 << 16)
    monkeypatch.setattr(C, "PIECE_CHARS", 1 << 13)
    monkeypatch.setattr(P, "BATCH_CHARS", 1 << 15)
    src = tmp_path / "big.txt"
    src.write_text(shakespeare * 4, encoding="utf-8")
    tok = CharTokenizer.train(shakespeare)
    # Once on a small file first: the modules preparation imports lazily are not the corpus's memory
    # (run alone, the test counted them and failed).
    (tmp_path / "small.txt").write_text(shakespeare[:10_000], encoding="utf-8")
    P.prepare(tmp_path / "small.txt", tok, tmp_path / "warm", 0.1, log=lambda m: None)
    tracemalloc.start()
    try:
        data = P.prepare(src, tok, tmp_path / "out", 0.1, log=lambda m: None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(data.train) + len(data.val) == 4 * len(shakespeare)
    assert peak < src.stat().st_size / 4, (
        f"peak {peak:,} bytes for a {src.stat().st_size:,}-byte corpus"
    )


def test_an_interrupted_preparation_leaves_nothing_that_looks_complete(
    tmp_path, shakespeare, monkeypatch
):
    monkeypatch.setattr(P, "BATCH_CHARS", 50_000)
    src = tmp_path / "plays.txt"
    src.write_text(shakespeare[:300_000], encoding="utf-8")
    tok = CharTokenizer.train(shakespeare)
    real, calls = P._encode, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(P, "_encode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        P.prepare(src, tok, tmp_path / "out", 0.1, log=lambda m: None)
    folder = P.token_dir(tmp_path / "out", tok)
    assert (
        not list(folder.glob("*")) if folder.exists() else True
    )  # no token files, no meta.json, no temps
    monkeypatch.setattr(P, "_encode", real)
    data = P.prepare(src, tok, tmp_path / "out", 0.1, log=lambda m: None)
    assert tok.decode(data.train.tolist() + data.val.tolist()) == shakespeare[:300_000]
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_editing_a_file_changes_the_fingerprint_and_prepares_again(tmp_path, shakespeare):
    paths = write_docs(
        tmp_path / "books", [shakespeare[i * 2000 : (i + 1) * 2000] for i in range(3)]
    )
    before = C.open_corpus(tmp_path / "books")
    paths[1].write_text(paths[1].read_text() + "More.", encoding="utf-8")
    after = C.open_corpus(tmp_path / "books")
    assert before.fingerprint != after.fingerprint and before.folder("data") != after.folder("data")
    assert C.changed_file(before.records(), after.records()) == (str(paths[1].resolve()), "changed")
    paths[2].unlink()
    assert C.changed_file(after.records(), C.open_corpus(tmp_path / "books").records()) == (
        str(paths[2].resolve()),
        "removed",
    )


def test_a_registry_entry_is_a_name_the_config_accepts(monkeypatch):
    """The config takes its dataset names from the registry (tests/test_download.py downloads such
    an entry); data.path and another dataset are one corpus too many."""
    from minigpt_cli import paths

    registry = dict(paths.dataset_registry())
    registry["bard"] = dict(registry["tinyshakespeare"])
    monkeypatch.setattr(paths, "dataset_registry", lambda: registry)
    assert Config(data={"dataset": "bard"}).data.dataset == "bard"
    with pytest.raises(ValueError, match="both name a corpus"):
        Config(data={"dataset": "bard", "path": "mine.txt"})
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*data.path"):
        Config(data={"dataset": "nope"})


# ----------------------------------------------------------------------------- through the CLI


def _bad_inputs(tmp: Path) -> dict[str, tuple[str, list[str]]]:
    (tmp / "empty.txt").write_text("")
    (tmp / "nodocs").mkdir()
    (tmp / "nodocs" / "notes.md").write_text("not a .txt")
    (tmp / "latin1.txt").write_bytes("Fa\u00e7ade\n".encode("latin-1"))
    (tmp / "broken.jsonl").write_text('{"text": "fine"}\n{"text": "cut\n', encoding="utf-8")
    (tmp / "nofield.jsonl").write_text(
        '{"text": "fine"}\n{"body": "elsewhere"}\n', encoding="utf-8"
    )
    (tmp / "short.txt").write_text("A short text of forty characters or so.\n" * 2)
    return {
        "missing": (str(tmp / "nope"), ["does not exist", "data.path"]),
        "empty file": (str(tmp / "empty.txt"), ["empty.txt", "is empty"]),
        "no text files": (str(tmp / "nodocs"), ["holds no .txt, .jsonl, .parquet or .arrow files"]),
        "not utf-8": (str(tmp / "latin1.txt"), ["latin1.txt", "not UTF-8", "at byte 2", "iconv"]),
        "bad json": (
            str(tmp / "broken.jsonl"),
            ["broken.jsonl:2:", "does not parse as JSON", "column"],
        ),
        "no field": (
            str(tmp / "nofield.jsonl"),
            ["nofield.jsonl:2:", "no text field 'text'", "data.text_field"],
        ),
        "too small": (
            str(tmp / "short.txt"),
            ["too few for val", "val tokens", "model.block_size"],
        ),
    }


@pytest.mark.parametrize("dry_run", [False, True])
def test_bad_corpora_get_one_line_and_leave_nothing_complete(cli, tmp_path, monkeypatch, dry_run):
    monkeypatch.chdir(tmp_path)
    for name, (path, fragments) in _bad_inputs(tmp_path).items():
        res = cli("train", TINY, "--set", f"data.path={path}", *(["--dry-run"] if dry_run else []))
        assert_user_error(res, *fragments, notes_ok=True)
        assert not list(tmp_path.glob("data/**/meta.json")) and not list(
            tmp_path.glob("data/**/*.bin")
        ), name
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), name


def test_train_on_a_folder_then_edit_a_file(cli, tmp_path, shakespeare, monkeypatch):
    """The whole story through the CLI: a folder trains; its fingerprint is recorded; an edit
    refuses
    --resume naming the file and prepares afresh for a new run; a prompt the corpus never had is
      refused."""
    monkeypatch.chdir(tmp_path)
    paths = write_docs(
        tmp_path / "books", [shakespeare[i * 4000 : (i + 1) * 4000] for i in range(12)]
    )
    args = [
        "train",
        TINY,
        "--set",
        "data.path=books",
        "--set",
        "train.max_iters=4",
        "--set",
        "train.eval_interval=4",
        "--set",
        "train.eval_iters=2",
        "--set",
        "train.sample_tokens=0",
    ]
    res = cli("prepare", TINY, "--set", "data.path=books")
    assert res.exit_code == 0, res
    assert (
        "12 file(s), 12 document(s)" in res.stdout and "validation: whole documents" in res.stdout
    )
    res = cli(*args)
    assert res.exit_code == 0, res
    assert "preparing token files" not in res.stderr  # prepare's files are train's
    run = next((tmp_path / "runs").iterdir())
    saved = (run / "config.yaml").read_text()
    corpus = C.open_corpus("books")
    assert f"fingerprint: {corpus.fingerprint}" in saved
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    assert (
        meta["corpus"]["fingerprint"] == corpus.fingerprint and len(meta["corpus"]["files"]) == 12
    )
    assert [r["event"] for r in records(run)].count("eval") == 2
    (tmp_path / "data").joinpath("marker").write_text("")
    paths[5].write_text(paths[5].read_text() + "\nAn edit.\n", encoding="utf-8")
    for dry in ([], ["--dry-run"]):  # the dry run refuses it with the same line
        res = cli(*args[:-2], "--set", "train.max_iters=8", "--resume", str(run), *dry)
        assert_user_error(
            res,
            f"corpus file {paths[5].resolve()} was changed",
            "--resume",
            "start a new run",
            notes_ok=True,
        )
    res = cli(*args)
    assert res.exit_code == 0, res
    assert "preparing token files" in res.stderr + res.stdout
    assert len([d for d in (tmp_path / "data").iterdir() if d.name.startswith("books-")]) == 2
    res = cli("generate", "--run", str(run), "--prompt", "\u00e9t\u00e9", "--max-new-tokens", "3")
    assert_user_error(res, "'\u00e9'", notes_ok=True)


def test_the_docs_document_the_split_and_the_sources():
    docs = Path(__file__).resolve().parent.parent / "docs"
    section = (docs / "own-text.md").read_text()
    training = (docs / "training.md").read_text()
    for fact in (
        "data.path",
        "data.text_field",
        ".jsonl",
        f"{C.MANY_DOCUMENTS} documents",
        "end-of-text",
        "blank line",
        "fingerprint",
        "--resume",
    ):
        assert fact in section, fact
    assert re.search(r"--nnodes", training) and "--node_rank" in training and "c10d" in training


def test_bench_prepare_compares_with_a_bare_encode_batch_loop(
    cli, tmp_path, shakespeare, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plays.txt").write_text(shakespeare[:100_000], encoding="utf-8")
    res = cli("bench", TINY, "--set", "data.path=plays.txt", "--prepare", "--json")
    assert res.exit_code == 0, res
    r = json.loads(res.stdout)
    assert (
        r["bare_tokens"] == r["prepared_tokens"] == 100_000
    )  # one char file: the same ids, no separators
    assert (
        r["bare_mb_s"] > 0
        and r["prepare_mb_s"] > 0
        and r["ratio"] == pytest.approx(r["prepare_mb_s"] / r["bare_mb_s"], rel=0.02)
    )
    assert not list(tmp_path.glob("data/**/*.bin"))  # measured in a temporary folder


def test_qa_cases_of_the_reading_kind(tmp_path):
    """A BOM in JSON Lines, a non-string field, hidden folders and a link to a file already read."""
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "with a BOM"}\n')
    assert C.corpus_text(C.open_corpus(tmp_path / "bom.jsonl")) == "with a BOM"
    (tmp_path / "num.jsonl").write_text('{"text": "a"}\n{"text": 12345}\n')
    with pytest.raises(C.MinigptError, match=r"num.jsonl:2: field 'text' holds int, not text"):
        C.survey(C.open_corpus(tmp_path / "num.jsonl"))
    (tmp_path / "arr.jsonl").write_text("[1, 2]\n")
    with pytest.raises(C.MinigptError, match=r"arr.jsonl:1: holds a JSON array, not an object"):
        C.survey(C.open_corpus(tmp_path / "arr.jsonl"))
    books = tmp_path / "books"
    (books / ".git").mkdir(parents=True)
    (books / ".git" / "notes.txt").write_text("not a book")
    (books / ".hidden.txt").write_text("not a book either")
    (books / "a.txt").write_text("a book")
    (books / "z.txt").symlink_to(books / "a.txt")
    assert [f.path.name for f in C.open_corpus(books).files] == ["a.txt"]
