"""A corpus: the text files ``data.path`` names (or a named download), read as documents, in a
stream.

:func:`cut_pieces` cuts only where GPT-2's pre-tokenizer cuts, so encoding the pieces one by one
gives the ids of the whole document.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

from ..errors import MinigptError
from ..fileio import JSON_BOUNDS, check_regular, depth, errors_as, open_regular, read_problem

#: Files a folder contributes, by kind; anything else in it is left out. Parquet and Arrow files
#: (Hugging Face datasets' shards, ``datasets.save_to_disk``'s ``data-*.arrow``) hold one document a
#: row, as JSON Lines a line.
SUFFIXES = {".txt": "text", ".jsonl": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
#: Bytes read from a file at a time.
BLOCK = 1 << 22
#: Documents are handed on in pieces of about this many characters.
PIECE_CHARS = 1 << 11
#: A stretch this many times :data:`PIECE_CHARS` with no place where GPT-2's split cuts is cut
#: anyway.
HARD_CUT_FACTOR = 64
#: With at least this many documents the validation split is the last whole documents, else the
#: text's tail.
MANY_DOCUMENTS = 10
#: Rows of a Parquet row group decoded at a time (a row group can be large; a batch of rows is not).
PARQUET_BATCH_ROWS = 1024


def _error(what: str) -> MinigptError:
    # ``{key}`` in ``what`` is data.path, or --input as train-tokenizer and prepare spell it.
    return MinigptError(what, key="data.path")


@dataclass(frozen=True)
class CorpusFile:
    """One input file: resolved path, size in bytes, sha256, kind (a :data:`SUFFIXES` value), name
    (relative to the folder holding all the corpus's files)."""

    path: Path
    size: int
    sha256: str
    kind: str = "text"
    name: str = ""

    @property
    def by_documents(self) -> bool:
        """Whether the file holds documents one by one (a line, a row), not one running text."""
        return self.kind != "text"

    def record(self) -> dict:
        """The file as ``meta.json`` and the run's records keep it."""
        return {
            "path": str(self.path),
            "name": self.name or self.path.name,
            "size": self.size,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class Corpus:
    """The files of one corpus, in reading order, and how to read them.

    ``text_field``: the JSON field or the Parquet/Arrow column holding each document's text."""

    source: str
    name: str
    files: tuple[CorpusFile, ...]
    text_field: str = "text"

    @property
    def size(self) -> int:
        """Bytes in all."""
        return sum(f.size for f in self.files)

    @property
    def fingerprint(self) -> str:
        """sha256 of every file's (name, size, sha256), in order, and of the column read: 64 hex."""
        return self._digest([{k: r[k] for k in ("name", "size", "sha256")} for r in self.records()])

    @property
    def legacy_fingerprint(self) -> str:
        """The fingerprint of before 2026-12 (of each file's absolute path), which older runs
        carry."""
        return self._digest([{k: r[k] for k in ("path", "size", "sha256")} for r in self.records()])

    def _digest(self, files: list[dict]) -> str:
        obj: dict = {"files": files}
        if any(f.by_documents for f in self.files):
            obj["text_field"] = self.text_field
        return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()

    def matches(self, fingerprint: str) -> bool:
        """Whether ``fingerprint`` (a config's ``data.fingerprint``) names this corpus, in either
        form."""
        return fingerprint in (self.fingerprint, self.legacy_fingerprint)

    def records(self) -> list[dict]:
        """Every file as :meth:`CorpusFile.record` gives it."""
        return [f.record() for f in self.files]

    def folder(self, data_dir: str | Path) -> Path:
        """``<data_dir>/<name>-<fingerprint[:12]>/``: this corpus's tokenizers and token files."""
        return Path(data_dir) / f"{self.name}-{self.fingerprint[:12]}"


def changed_file(before: Sequence[dict], after: Sequence[dict]) -> Optional[tuple[str, str]]:
    """The first file that differs between two :meth:`Corpus.records` lists, and how: ``(path,
    what)``."""
    key = "name" if all("name" in r for r in [*before, *after]) else "path"
    old = {r[key]: r for r in before}
    new = {r[key]: r for r in after}
    for r in before:
        if r[key] not in new:
            return r["path"], "removed"
        if (new[r[key]]["size"], new[r[key]]["sha256"]) != (r["size"], r["sha256"]):
            return new[r[key]]["path"], "changed"
    for r in after:
        if r[key] not in old:
            return r["path"], "added"
    if [r[key] for r in before] != [r[key] for r in after]:
        return after[0]["path"], "reordered"
    return None


def _is_input(p: Path, root: Path) -> bool:
    """A corpus file (:data:`SUFFIXES`) under ``root``, neither hidden nor in a hidden folder."""
    return (
        p.is_file()
        and p.suffix.lower() in SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def _once(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without a second name for a file seen already (a symbolic link to it, ...), in
    order."""
    first: dict[Path, Path] = {}
    for p in paths:
        first.setdefault(p.resolve(), p)
    return list(first.values())


def matching(source: str | Path) -> tuple[list[Path], str]:
    """The files ``source`` names, in reading order, and why there are none, when so.

    A file; a folder's :data:`SUFFIXES` files, recursive, sorted, hidden ones left out; a glob's
    files, sorted; each once."""
    text = str(source)
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():  # a FIFO or a device too: its read names what it is
        return [p], ""
    if p.is_dir():
        return _once(sorted(q for q in p.rglob("*") if _is_input(q, p))), (
            f"folder {text!r} holds no .txt, .jsonl, .parquet or .arrow files (searched "
            "recursively); add some, or point {key} at a file"
        )
    if glob.has_magic(text):
        return _once(
            sorted(Path(q) for q in glob.glob(str(p), recursive=True) if Path(q).is_file())
        ), (
            f"{{key}} {text!r} matches no file; check the pattern (quote it in the shell so that "
            "minigpt expands it)"
        )
    return [], (
        f"{{key}} {text!r} does not exist; point {{key}} at a text file, a folder of "
        ".txt/.jsonl/.parquet files or a glob"
    )


#: What a JSON line nested past :data:`~minigpt_cli.fileio.JSON_BOUNDS` is.
_DEEP = f"nested more than {JSON_BOUNDS.max_depth} levels deep, the limit"


class _Reading(errors_as):
    """The reads of ``path`` in a ``with`` block: an OSError, a byte that is not UTF-8 or a line
    that is not JSON becomes the one line for that file; the block keeps ``offset`` (of the bytes
    being decoded) and ``line`` (JSON Lines) up to date for it."""

    def __init__(self, path: Path):
        self.offset = self.line = 0
        super().__init__(
            {
                UnicodeDecodeError: lambda e: _error(
                    f"corpus file {str(path)!r} is not UTF-8 text ({e.reason} at byte "
                    f"{self.offset + e.start:,}); "
                    "convert it to UTF-8 (e.g. with iconv) or remove it from {key}",
                ),
                json.JSONDecodeError: lambda e: _error(
                    f"{path}:{self.line}: does not parse as JSON ({e.msg} at column {e.colno}); "
                    "fix the line, or remove the file from {key}",
                ),
                RecursionError: lambda e: _error(
                    f"{path}:{self.line}: does not parse as JSON ({_DEEP}); "
                    "fix the line, or remove the file from {key}",
                ),
                OSError: lambda e: read_problem(e, path, "corpus file"),
            }
        )


def _sha256(path: Path, on_bytes: Callable[[int], None]) -> str:
    h = hashlib.sha256()
    with _Reading(path), open_regular(path) as f:
        while block := f.read(BLOCK):
            h.update(block)
            on_bytes(len(block))
    return h.hexdigest()


def _stem(source: str, files: Sequence[Path]) -> str:
    """A readable folder name: the file's stem, the folder's name, or ``corpus`` for a glob."""
    p = Path(source).expanduser()
    name = p.stem if p.is_file() else p.name if p.is_dir() else "corpus"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:40] or "corpus"


def open_corpus(
    source: str | Path,
    text_field: str = "text",
    on_bytes: Callable[[int], None] = lambda n: None,
    name: Optional[str] = None,
) -> Corpus:
    """The corpus ``source`` names, its files hashed (``on_bytes`` hears each block's size).

    ``name``: its stem. Raises MinigptError: nothing there (or no file, for a folder or a glob); a
    single empty file, an unreadable one; a Parquet/Arrow file without a text column
    ``text_field``, or pyarrow missing for one."""
    found, why = matching(source)
    if not found and Path(source).expanduser().is_symlink():  # a dangling link: named as one
        raise read_problem(FileNotFoundError(), Path(source).expanduser(), "corpus")
    sizes = []
    for p in found:
        with _Reading(p):
            check_regular(p)  # a FIFO's size is 0: it is no empty file, and reading it would wait
            sizes.append(p.stat().st_size)
    if not found:
        raise _error(why)
    if sizes == [0]:
        raise _error(
            f"corpus file {str(found[0])!r} is empty; give it some text, or remove it from {{key}}"
        )
    kinds = [SUFFIXES.get(p.suffix.lower(), "text") for p in found]
    for p, kind in zip(found, kinds):
        if kind in ("parquet", "arrow"):
            _check_column(
                p, kind, text_field
            )  # before hashing: a wrong column is found in a moment
    # Names are relative to the folder holding every file (a single file's: its own folder), as the
    # user named them (before symbolic links are followed).
    root = Path(os.path.commonpath([os.path.abspath(p.parent) for p in found]))
    files = [
        CorpusFile(
            p.resolve(),
            size,
            _sha256(p, on_bytes),
            kind,
            Path(os.path.abspath(p)).relative_to(root).as_posix(),
        )
        for p, size, kind in zip(found, sizes, kinds)
    ]
    return Corpus(str(source), name or _stem(str(source), found), tuple(files), text_field)


# ----------------------------------------------------------------------------- Parquet and Arrow


def _pyarrow():
    """The pyarrow module, imported here: only Parquet and Arrow corpora need it.

    Raises MinigptError: it is not installed."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise _error(
            "{key} names Parquet or Arrow files, which need pyarrow; "
            "pip install 'minigpt-cli[parquet]'"
        ) from None
    return pyarrow


class _Table(errors_as):
    """The reads of a Parquet or Arrow file in a ``with`` block, their failures one line each.

    pyarrow's errors and OSErrors become the one line for that file, naming the row group (Parquet)
    or record batch (Arrow) ``part`` when one is being read."""

    def __init__(self, path: Path, kind: str):
        pa = _pyarrow()
        self.part: Optional[int] = None
        unit = "row group" if kind == "parquet" else "record batch"
        super().__init__(
            {
                (pa.ArrowException, OSError): lambda e: _error(
                    f"cannot read {kind.capitalize()} file {str(path)!r}"
                    + (f" at {unit} {self.part}" if self.part is not None else "")
                    + f" ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                    "check the file (download it again), or remove it from {key}"
                ),
            }
        )


def _schema(path: Path, kind: str):
    """The Arrow schema of a Parquet file (its footer) or an Arrow stream (its first message)."""
    pa = _pyarrow()
    if kind == "parquet":
        return pa.parquet.read_schema(path)
    with pa.ipc.open_stream(path) as reader:
        return reader.schema


def _check_column(path: Path, kind: str, column: str) -> None:
    """Refuse a Parquet or Arrow file whose ``column`` is missing or not text (MinigptError)."""
    pa = _pyarrow()
    with _Table(path, kind):
        schema = _schema(path, kind)
    if column not in schema.names:
        names = ", ".join(map(repr, schema.names[:8])) + (", ..." if len(schema.names) > 8 else "")
        raise _error(
            f"{path}: no column {column!r} (it has {names or 'no columns'}); "
            "set data.text_field to the column holding the text"
        )
    kind_of = schema.field(column).type
    is_view = getattr(pa.types, "is_string_view", lambda t: False)  # pyarrow 16 and later
    if not (pa.types.is_string(kind_of) or pa.types.is_large_string(kind_of) or is_view(kind_of)):
        raise _error(
            f"{path}: column {column!r} holds {kind_of}, not text; "
            "set data.text_field to the column holding the text"
        )


def _table_documents(path: Path, kind: str, column: str, size: int) -> Iterator[tuple[str, int]]:
    """The documents of a Parquet file or an Arrow stream, each with its share of the file's bytes.

    A Parquet file is read a row group at a time, in batches of :data:`PARQUET_BATCH_ROWS` rows; an
    Arrow stream a record batch at a time: never the whole file. A null is an empty document, as a
    blank line of JSON Lines is."""
    pa = _pyarrow()
    with _Table(path, kind) as at:
        if kind == "parquet":
            pf = pa.parquet.ParquetFile(path)
            n_rows = pf.metadata.num_rows

            def batches():
                for at.part in range(pf.num_row_groups):
                    yield from pf.iter_batches(
                        batch_size=PARQUET_BATCH_ROWS, row_groups=[at.part], columns=[column]
                    )

        else:
            stream = pa.ipc.open_stream(path)
            n_rows = None  # a stream does not say; the bytes read are counted at its end

            def batches():
                for at.part, batch in enumerate(stream):
                    yield batch.select([column])

        row = given = 0
        for batch in batches():
            for text in batch.column(0).to_pylist():
                row += 1
                share = size * row // n_rows if n_rows else 0
                yield text or "", share - given
                given = share
        if given < size:
            yield "", size - given  # the bytes not yet counted (an empty document is left out)


# ----------------------------------------------------------------------------- reading


def _text_blocks(path: Path) -> Iterator[tuple[str, int]]:
    """The text of a UTF-8 file in blocks, each with the byte count it took; a leading BOM
    dropped."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, first = 0, True
    with _Reading(path) as at, open_regular(path) as f:
        while True:
            block = f.read(BLOCK)
            at.offset = offset - len(
                decoder.getstate()[0]
            )  # the decoder still holds the last block's tail
            text = decoder.decode(block, final=not block)
            if first and text.startswith("\ufeff"):
                text = text[1:]
            first = False
            offset += len(block)
            if text or block:
                yield text, len(block)
            if not block:
                return


def _jsonl_documents(path: Path, field: str) -> Iterator[tuple[str, int]]:
    """The documents of a JSON Lines file, each with the byte count of its line; blank lines
    empty."""
    with _Reading(path) as at, open_regular(path) as f:
        for number, raw in enumerate(f, 1):
            at.line = number
            line = raw.decode("utf-8")
            at.offset += len(raw)
            if not line.strip():
                yield "", len(raw)
                continue
            if number == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark, as Windows tools write one
            obj = json.loads(line)
            if depth(obj) > JSON_BOUNDS.max_depth:
                raise RecursionError  # a document is a flat object; far deeper is no text's
            text = obj.get(field) if isinstance(obj, dict) else None
            if not isinstance(text, str):
                raise _not_text(obj, field, path, number)
            yield text, len(raw)


def _not_text(obj: object, field: str, path: Path, line: int) -> MinigptError:
    """What is wrong with a JSON line ``obj`` that holds no text in ``field``."""
    if not isinstance(obj, dict):
        kind = {list: "array", str: "string", type(None): "null", bool: "boolean"}.get(
            type(obj), "number"
        )
        return _error(
            f"{path}:{line}: holds a JSON {kind}, not an object with a text field; fix the line, "
            "or remove the file from {key}"
        )
    if field not in obj:
        keys = ", ".join(map(repr, list(obj)[:8])) or "no fields"
        return _error(
            f"{path}:{line}: the object has no text field {field!r} (it has {keys}); set "
            "data.text_field to the field holding the text"
        )
    return _error(
        f"{path}:{line}: field {field!r} holds {type(obj[field]).__name__}, not text; set "
        "data.text_field to the field holding the text"
    )


#: Where GPT-2's split (``tokenizer_training.SPLIT_PATTERN``) cuts anyway: after a single newline between two
#: non-spaces, or before a single space between two non-spaces.
SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")


def _inside_special(text: str, pos: int, special_tokens: Sequence[str]) -> bool:
    """Whether an occurrence of a special token in ``text`` spans position ``pos`` (cutting there
    would break it)."""
    for s in special_tokens:
        lo = max(0, pos - len(s) + 1)
        i = text.find(s, lo)
        while i != -1 and i < pos:
            if i + len(s) > pos:
                return True
            i = text.find(s, i + 1)
    return False


def cut_pieces(
    chunks: Iterable[str], size: Optional[int] = None, special_tokens: Sequence[str] = ()
) -> Iterator[str]:
    """One document's text (``chunks``, in order) in pieces of about ``size`` (:data:`PIECE_CHARS`)
    characters."""
    size = size or PIECE_CHARS
    risky = [
        s for s in special_tokens if any(ch.isspace() for ch in s)
    ]  # others never span a safe cut
    longest = max(map(len, special_tokens), default=1)
    buf = ""
    for chunk in chunks:
        buf += chunk
        start = 0
        while len(buf) - start > size:
            m = SAFE_CUT.search(buf, start + size)
            while m is not None and risky and _inside_special(buf, m.start(), risky):
                m = SAFE_CUT.search(buf, m.start() + 1)
            if m is None:
                if len(buf) - start < HARD_CUT_FACTOR * size:
                    break
                cut = start + size
                while cut > start + 1 and _inside_special(buf, cut, special_tokens):
                    cut -= 1
                cut = cut if cut > start + 1 else start + size + longest
            else:
                cut = m.start()
            yield buf[start:cut]
            start = cut
        buf = buf[start:]
    if buf:
        yield buf


def documents(corpus: Corpus) -> Iterator[tuple[Iterator[str], Callable[[], int]]]:
    """Each document of ``corpus`` as an iterator of its text (to be read before the next), with the
    bytes read. Raises MinigptError: a file unreadable, not UTF-8, a bad JSON line, a Parquet row
    group unreadable."""
    done = [0]

    def read_so_far() -> int:
        return done[0]

    def counted(blocks: Iterator[tuple[str, int]]) -> Iterator[str]:
        for text, n in blocks:
            done[0] += n
            yield text

    for f in corpus.files:
        if f.by_documents:
            rows = (
                _jsonl_documents(f.path, corpus.text_field)
                if f.kind == "jsonl"
                else _table_documents(f.path, f.kind, corpus.text_field, f.size)
            )
            for text, n in rows:
                done[0] += n
                yield iter((text,)), read_so_far
        else:
            yield counted(_text_blocks(f.path)), read_so_far


def survey(corpus: Corpus) -> tuple[int, int]:
    """Read ``corpus`` once, checking every file: its non-empty documents and their characters.
    Raises MinigptError: as :func:`documents`, or no text at all."""
    lengths = [sum(map(len, blocks)) for blocks, _ in documents(corpus)]
    if not sum(lengths):
        raise _error(
            f"{{key}} {corpus.source!r} holds no text: every document is empty; give it some text"
        )
    return sum(n > 0 for n in lengths), sum(lengths)


def corpus_text(corpus: Corpus, limit_chars: Optional[int] = None, separator: str = "\n\n") -> str:
    """The documents joined by ``separator``, stopping after about ``limit_chars`` characters (a
    piece's end)."""
    parts: list[str] = []
    n = 0
    for blocks, _ in documents(corpus):
        first = True
        for piece in cut_pieces(blocks):
            if not piece:
                continue
            if first and parts:
                parts.append(separator)
            first = False
            parts.append(piece)
            n += len(piece)
            if limit_chars is not None and n >= limit_chars:
                return "".join(parts)
    return "".join(parts)
