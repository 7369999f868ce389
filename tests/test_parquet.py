"""Parquet shards and ``datasets.save_to_disk`` folders as corpora: read a row group at a time,
fingerprinted, split and resumed as JSON Lines are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TINY, assert_user_error

from minigpt_cli.data import corpus as C
from minigpt_cli.data import preparation as P
from minigpt_cli.tokenizer.kinds import CharTokenizer

pa = pytest.importorskip(
    "pyarrow", reason="pyarrow is not installed (pip install minigpt-cli[parquet])"
)
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def shakespeare(corpus_file) -> str:
    return corpus_file.read_text(encoding="utf-8")


def write_shards(folder: Path, docs: list[str], per_shard: int, column: str = "text") -> list[Path]:
    """``docs`` as Parquet shards of ``per_shard`` rows, two rows a row group, and an id column."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, start in enumerate(range(0, len(docs), per_shard)):
        rows = docs[start : start + per_shard]
        table = pa.table({"id": list(range(start, start + len(rows))), column: rows})
        paths.append(folder / f"train-{n:05d}-of-{len(docs) // per_shard:05d}.parquet")
        pq.write_table(table, paths[-1], row_group_size=2)
    return paths


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


def test_shards_prepare_to_the_tokens_of_the_same_documents_as_json_lines(tmp_path, shakespeare):
    docs = [shakespeare[i * 700 : (i + 1) * 700] for i in range(12)]
    shards = write_shards(tmp_path / "shards", docs, per_shard=5)
    corpus = C.open_corpus(tmp_path / "shards")
    assert [f.kind for f in corpus.files] == ["parquet"] * 3 and len(shards) == 3
    tok = CharTokenizer.train(shakespeare[:20_000])
    from_parquet = P.prepare(corpus, tok, tmp_path / "a", 0.25, log=lambda m: None)
    jsonl = C.open_corpus(write_jsonl(tmp_path / "docs.jsonl", docs))
    from_jsonl = P.prepare(jsonl, tok, tmp_path / "b", 0.25, log=lambda m: None)
    assert from_parquet.train.tolist() == from_jsonl.train.tolist()
    assert from_parquet.val.tolist() == from_jsonl.val.tolist()
    assert from_parquet.meta["split"] == "documents" and from_parquet.meta["documents"] == 12
    # The column read is part of the fingerprint, as a JSON field is.
    both = tmp_path / "both.parquet"
    pq.write_table(pa.table({"text": docs, "title": [d[:20] for d in docs]}), both)
    assert C.open_corpus(both).fingerprint != C.open_corpus(both, text_field="title").fingerprint


def test_a_shard_is_read_a_row_group_at_a_time(tmp_path, shakespeare):
    """A 4.8 MB shard of 48 row groups: Arrow never holds more than a few row groups at once."""
    docs = [shakespeare[i * 50_000 : (i + 1) * 50_000] for i in range(20)] * 5
    write_shards(tmp_path / "big", docs[:96], per_shard=96)
    corpus = C.open_corpus(tmp_path / "big")
    before, peak, n = pa.total_allocated_bytes(), 0, 0
    for blocks, _ in C.documents(corpus):
        n += sum(map(len, blocks))
        peak = max(peak, pa.total_allocated_bytes() - before)
    assert n == sum(map(len, docs[:96])) and n > 4_000_000
    assert peak < n / 8, f"Arrow held {peak:,} bytes for {n:,} characters"


def test_a_folder_of_shards_trains_resumes_and_refuses_a_changed_shard(
    cli, tmp_path, shakespeare, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    docs = [shakespeare[i * 4000 : (i + 1) * 4000] for i in range(12)]
    shards = write_shards(tmp_path / "shards", docs, per_shard=4)
    args = ["train", TINY, "--set", "data.path=shards", "--set", "train.eval_iters=2"]
    args += ["--set", "train.eval_interval=4", "--set", "train.sample_tokens=0"]
    res = cli("prepare", TINY, "--set", "data.path=shards")
    assert res.exit_code == 0, res
    assert "3 file(s), 12 document(s)" in res.stdout, res
    res = cli(*args, "--set", "train.max_iters=4")
    assert res.exit_code == 0, res
    run = next((tmp_path / "runs").iterdir())
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    corpus = C.open_corpus("shards")
    assert meta["corpus"]["fingerprint"] == corpus.fingerprint
    assert [r["name"] for r in meta["corpus"]["files"]] == [p.name for p in shards]
    res = cli(*args, "--set", "train.max_iters=8", "--resume", str(run))
    assert res.exit_code == 0, res
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    assert meta["step"] == 8
    # One document of the middle shard changed: the resume is refused, naming the shard.
    docs[5] = docs[5].upper()
    write_shards(tmp_path / "shards", docs, per_shard=4)
    for dry in ([], ["--dry-run"]):
        res = cli(*args, "--set", "train.max_iters=12", "--resume", str(run), *dry)
        assert_user_error(
            res, f"corpus file {shards[1].resolve()} was changed", "--resume", notes_ok=True
        )
    out = tmp_path / "bpe.json"
    res = cli(
        "train-tokenizer",
        TINY,
        "--input",
        "shards",
        "--kind",
        "bpe",
        "--vocab-size",
        "300",
        "--output",
        out,
    )
    assert res.exit_code == 0, res
    assert "shards" in res.stdout and out.is_file()


def _corrupt_row_group(path: Path, group: int) -> None:
    """Overwrite the page header of row group ``group``'s first column chunk with garbage."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(0)
    data = bytearray(path.read_bytes())
    at = chunk.data_page_offset
    data[at : at + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))


def test_bad_shards_get_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = [f"Document {i}: " + "some words of text. " * 30 for i in range(12)]
    write_shards(tmp_path / "nocolumn", docs, per_shard=12, column="content")
    (tmp_path / "numbers").mkdir()
    pq.write_table(pa.table({"text": list(range(12))}), tmp_path / "numbers" / "n.parquet")
    (tmp_path / "broken").mkdir()
    pq.write_table(
        pa.table({"text": docs}),
        tmp_path / "broken" / "b.parquet",
        row_group_size=4,
        compression="none",
    )
    _corrupt_row_group(tmp_path / "broken" / "b.parquet", 1)
    (tmp_path / "notparquet").mkdir()
    (tmp_path / "notparquet" / "x.parquet").write_text("not parquet at all\n" * 20)
    cases = {
        "nocolumn": ["no column 'text'", "'id', 'content'", "data.text_field"],
        "numbers": ["column 'text' holds int64, not text", "data.text_field"],
        "broken": ["b.parquet", "at row group 1"],
        "notparquet": ["x.parquet", "cannot read Parquet file"],
    }
    for folder, fragments in cases.items():
        res = cli("train", TINY, "--set", f"data.path={folder}", "--set", "train.max_iters=1")
        assert_user_error(res, *fragments, notes_ok=True)
        assert not list(tmp_path.glob("data/**/meta.json")), folder
    # The column key of JSON Lines names the column.
    res = cli("prepare", TINY, "--set", "data.path=nocolumn", "--set", "data.text_field=content")
    assert res.exit_code == 0, res


def test_without_pyarrow_the_refusal_names_the_extra(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_shards(tmp_path / "shards", ["a document. " * 50] * 12, per_shard=12)
    monkeypatch.setitem(__import__("sys").modules, "pyarrow.parquet", None)  # import fails
    res = cli("prepare", TINY, "--set", "data.path=shards")
    assert_user_error(res, "pip install 'minigpt-cli[parquet]'", notes_ok=True)


def test_a_saved_dataset_folder_is_a_corpus(tmp_path, shakespeare):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    docs = [shakespeare[i * 700 : (i + 1) * 700] for i in range(12)]
    datasets.Dataset.from_dict({"text": docs, "n": list(range(12))}).save_to_disk(
        str(tmp_path / "saved"), num_shards=2
    )
    corpus = C.open_corpus(tmp_path / "saved")
    assert [f.kind for f in corpus.files] == ["arrow", "arrow"]
    tok = CharTokenizer.train(shakespeare[:20_000])
    saved = P.prepare(corpus, tok, tmp_path / "a", 0.25, log=lambda m: None)
    jsonl = P.prepare(write_jsonl(tmp_path / "d.jsonl", docs), tok, tmp_path / "b", 0.25, log=print)
    assert saved.train.tolist() == jsonl.train.tolist() and saved.val.tolist() == jsonl.val.tolist()
