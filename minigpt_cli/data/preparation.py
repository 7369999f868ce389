"""Corpus -> token memmaps, streamed: :func:`prepare` and the one split it makes
(:class:`SplitPlan`).

Read twice (a survey, then the encoding) into temporary files renamed at the end, ``meta.json``
last.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from itertools import chain, takewhile
from pathlib import Path
from typing import IO, Callable, Iterator, Optional, Sequence

import numpy as np
from tqdm import tqdm

from ..config.special_tokens import END_OF_TEXT
from ..errors import MinigptError
from ..fileio import (
    STATE_BOUNDS,
    atomic_write_text,
    check_writable,
    chmod_quietly,
    errors_as,
    new_file_mode,
    os_error_message,
    read_json,
)
from ..tokenizer.kinds import Tokenizer
from .corpus import MANY_DOCUMENTS, Corpus, cut_pieces, documents, open_corpus, survey
from .download_files import sweep_partial_files

#: Characters of text encoded per batch (the library spreads a batch's pieces over the cores).
BATCH_CHARS = 1 << 20
#: The temporary token files' prefix: each is flock-ed by the process writing it, so one that is not
#: locked was left by a process that died (:func:`sweep_dead_temps`).
_TEMP_PREFIX = ".prep-"
#: The splits, by their index in a :data:`Unit`.
SPLITS = ("train", "val")
#: A corpus larger than this (bytes) is not encoded by a dry run when no prepared files give its
#: split.
PREVIEW_BYTES = 64 << 20


#: Fewest tokens a split can have: one (x, y) window with block_size 1.
MIN_SPLIT_TOKENS = 2


def _fraction_that_fits(val_fraction: float, total: int, need: int) -> Optional[float]:
    """A ``data.val_fraction`` leaving both sides about ``need`` of ``total`` tokens (0.1 if it
    does, else the nearest to ``val_fraction``, two digits), or None."""
    if total < 2 * need:
        return None
    lo, hi = need / total, 1 - need / total
    if lo >= hi:
        return None
    if lo <= 0.1 <= hi and val_fraction != 0.1:
        return 0.1
    fits = (
        math.ceil(lo * 100 + 1) / 100
        if val_fraction < lo or val_fraction == 0.1
        else math.floor(hi * 100 - 1) / 100
    )
    return fits if lo <= fits <= hi else round((lo + hi) / 2, 3)


def _fix(
    val_fraction: float, n_train: int, n_val: int, need: int, block_size: Optional[int]
) -> str:
    """What to change, for a split with a side under ``need`` tokens: a value then accepted, or more
    text."""
    total, smallest = n_train + n_val, min(n_train, n_val)
    fits = _fraction_that_fits(val_fraction, total, need)  # another split, this block size
    if (
        block_size is not None and smallest >= MIN_SPLIT_TOKENS
    ):  # this split holds a window of smallest - 1
        another = f"choose a data.val_fraction such as {fits:g}, " if fits is not None else ""
        return (
            f"{another}lower model.block_size (to at most {smallest - 1:,} with this split), "
            "or use more text"
        )
    if fits is not None:
        return f"choose a data.val_fraction such as {fits:g}, or use more text"
    fits = _fraction_that_fits(
        val_fraction, total, MIN_SPLIT_TOKENS
    )  # another split and a smaller block
    if fits is not None:
        return (
            f"choose a data.val_fraction such as {fits:g}, then a lower model.block_size (with "
            f"this split a side has under {MIN_SPLIT_TOKENS} tokens, which no block size fits), or "
            "use more text"
        )
    more = (
        math.ceil(need / min(val_fraction, 1 - val_fraction)) if 0 < val_fraction < 1 else 2 * need
    )
    return (
        f"the corpus is too small for any model.block_size ({total:,} tokens, and train and val "
        f"need {MIN_SPLIT_TOKENS} or more each); use more text: about {more:,} tokens give each "
        f"side {need:,} with this data.val_fraction"
    )


def check_split_counts(
    val_fraction: float, n_train: int, n_val: int, block_size: Optional[int] = None
) -> None:
    """Refuse a split with fewer than :data:`MIN_SPLIT_TOKENS` (or ``block_size + 1``) tokens on a
    side. Raises MinigptError: one line naming ``data.val_fraction``, the token counts and the
    fix."""
    need = max(block_size + 1, MIN_SPLIT_TOKENS) if block_size is not None else MIN_SPLIT_TOKENS
    if min(n_train, n_val) >= need:
        return
    small = " and ".join(name for name, n in (("train", n_train), ("val", n_val)) if n < need)
    need_s = (
        f"at least model.block_size+1 = {need:,} tokens each"
        if block_size is not None
        else f"at least {need} tokens each"
    )
    raise MinigptError(
        f"data.val_fraction={val_fraction:.12g} splits the corpus into {n_train:,} train and "
        f"{n_val:,} val tokens, too few for {small} (they need {need_s}); "
        f"{_fix(val_fraction, n_train, n_val, need, block_size)}"
    )


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab ≤ 65,536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def separator_ids(tok: Tokenizer) -> tuple[list[int], str]:
    """The ids put between two documents, and what they are: an end-of-text token, a blank line or
    nothing."""
    for s in getattr(tok, "special_tokens", ()):
        if s in END_OF_TEXT:
            return tok.encode(s), s
    try:
        return tok.encode("\n\n"), "blank line"
    except MinigptError:
        return [], "nothing"


@dataclass(frozen=True)
class SplitPlan:
    """Where validation starts: at document ``val_from_doc`` (by documents), or at character
    ``val_from_char`` of the documents' text (by the tail fraction)."""

    val_fraction: float
    n_documents: int
    val_from_doc: Optional[int] = None
    val_from_char: Optional[int] = None

    @classmethod
    def make(cls, n_documents: int, total_chars: int, val_fraction: float) -> "SplitPlan":
        if n_documents >= MANY_DOCUMENTS:
            k = min(max(1, round(n_documents * val_fraction)), n_documents - 1)
            return cls(val_fraction, n_documents, val_from_doc=n_documents - k)
        return cls(val_fraction, n_documents, val_from_char=int(total_chars * (1 - val_fraction)))

    @property
    def by_documents(self) -> bool:
        return self.val_from_doc is not None

    def describe(self) -> str:
        if self.by_documents:
            n_val = self.n_documents - self.val_from_doc
            return f"the last {n_val:,} of {self.n_documents:,} documents"
        return f"the last {self.val_fraction:.0%} of the text"


def _tail_cut(piece: str, k: int, special_tokens: Sequence[str]) -> int:
    """``k``, moved back to the start of a special token it falls inside (the token stays one
    id)."""
    moved = True
    while moved:
        moved = False
        for s in special_tokens:
            i = piece.find(s, max(0, k - len(s) + 1))
            if i != -1 and i < k:
                k, moved = i, True
    return k


def split_text(
    text: str, val_fraction: float = 0.1, keep_whole: Sequence[str] = ()
) -> tuple[str, str]:
    """(train, val): the first ``int(len·(1-val_fraction))`` characters and the rest (nanoGPT's
    split)."""
    n = _tail_cut(text, int(len(text) * (1 - val_fraction)), keep_whole)
    return text[:n], text[n:]


#: One unit of the stream: the split it belongs to (0 train, 1 val), its text (None: the separator), and the
#: corpus bytes read once it is taken.
Unit = tuple[int, Optional[str], int]


def units(corpus: Corpus, plan: SplitPlan, special_tokens: Sequence[str]) -> Iterator[Unit]:
    """The corpus as a stream of pieces and separators, each tagged with its split (see
    :class:`SplitPlan`)."""
    doc, chars = -1, 0
    for blocks, read_so_far in documents(corpus):
        for i, piece in enumerate(
            p for p in cut_pieces(blocks, special_tokens=special_tokens) if p
        ):
            if i == 0:
                doc += 1
                if (
                    0 < doc != plan.val_from_doc
                ):  # no separator where validation starts by documents
                    after = (
                        doc > plan.val_from_doc if plan.by_documents else chars > plan.val_from_char
                    )
                    yield int(after), None, read_so_far()
            if plan.by_documents:
                yield int(doc >= plan.val_from_doc), piece, read_so_far()
            else:
                start, end = chars, chars + len(piece)
                cut = plan.val_from_char
                if start < cut < end:
                    k = _tail_cut(piece, cut - start, special_tokens)
                    if k:
                        yield 0, piece[:k], read_so_far()
                    yield 1, piece[k:], read_so_far()
                else:
                    yield int(start >= cut), piece, read_so_far()
                chars = end


def _batches(stream: Iterator[Unit]) -> Iterator[list[Unit]]:
    batch: list[Unit] = []
    size = 0
    for unit in stream:
        batch.append(unit)
        size += len(unit[1] or "")
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encode(tok: Tokenizer, batch: list[Unit], sep: np.ndarray) -> list[tuple[int, np.ndarray]]:
    texts = [text for _, text, _ in batch if text is not None]
    if hasattr(tok, "encode_batch"):
        encoded = iter(tok.encode_batch(texts))
    else:  # a tokenizer of the earlier protocol: one call per text
        encoded = (np.asarray(tok.encode(t), dtype=np.int64) for t in texts)
    return [(split, sep if text is None else next(encoded)) for split, text, _ in batch]


def encoded(
    corpus: Corpus,
    tok: Tokenizer,
    plan: SplitPlan,
    progress: Optional[bool] = None,
    only: Optional[int] = None,
) -> Iterator[tuple[int, np.ndarray, int]]:
    """``(split, ids, chars)`` for each unit of :func:`units` (of split ``only``: 0 train, 1 val;
    None: both), a batch encoded while the next is read."""
    sep = np.asarray(separator_ids(tok)[0], dtype=np.int64)
    specials = list(getattr(tok, "special_tokens", ()))
    with ExitStack() as stack:
        bar = stack.enter_context(
            tqdm(
                total=corpus.size,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="prepare",
                leave=False,
                file=sys.stderr,
                disable=None if progress is None else not progress,
            )
        )
        pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="encode"))
        pending, done = None, 0  # the batch being encoded while the next one is read
        stream = (u for u in units(corpus, plan, specials) if only in (None, u[0]))
        for batch in chain(_batches(stream), [None]):
            job = None if batch is None else (batch, pool.submit(_encode, tok, batch, sep))
            if pending is not None:
                ready, future = pending
                for (split, ids), (_, text, _) in zip(future.result(), ready):
                    yield split, ids, len(text or "")
                bar.update(ready[-1][2] - done)
                done = ready[-1][2]
            pending = job


def write_token_files(
    corpus: Corpus,
    tok: Tokenizer,
    plan: SplitPlan,
    directory: Optional[Path],
    progress: Optional[bool] = None,
    block_size: Optional[int] = None,
) -> dict[str, int]:
    """Encode ``corpus`` into ``directory/{train,val}.bin`` (None: count only); return the token and
    character counts. Raises MinigptError: as :func:`encoded`, a split too small, a file that cannot
    be written; nothing that looks complete is left."""
    dtype = token_dtype(tok.vocab_size)
    created = (
        []
        if directory is None
        else list(
            takewhile(lambda d: not d.exists() and d != d.parent, [directory, *directory.parents])
        )
    )
    counts = {"train_tokens": 0, "val_tokens": 0, "train_chars": 0, "val_chars": 0}
    temps: list[tuple[Path, IO[bytes]]] = []
    target = directory
    # The corpus's read errors are MinigptErrors: an OSError is a token file's write.
    written = errors_as(
        {
            OSError: lambda exc: MinigptError(
                os_error_message(exc, None if exc.filename else target, "write")
            )
        }
    )
    try:
        with written, ExitStack() as stack:
            if directory is not None:
                directory.mkdir(parents=True, exist_ok=True)
                for split in SPLITS:
                    temps.append(_locked_temp(directory, split, stack))
            for split, ids, chars in encoded(corpus, tok, plan, progress):
                if temps:
                    target = directory / f"{SPLITS[split]}.bin"  # what a write that fails names
                    temps[split][1].write(ids.astype(dtype).tobytes())
                counts[f"{SPLITS[split]}_tokens"] += ids.size
                counts[f"{SPLITS[split]}_chars"] += chars
            check_split_counts(
                plan.val_fraction, counts["train_tokens"], counts["val_tokens"], block_size
            )
            for (path, f), split in zip(temps, SPLITS):
                target = directory / f"{split}.bin"
                f.flush()
                os.fsync(f.fileno())
                chmod_quietly(f.fileno(), new_file_mode())
            for (path, _), split in zip(temps, SPLITS):
                os.replace(path, directory / f"{split}.bin")
    finally:
        # Whatever is left of the temporary files, and the folders made here (deepest first, while
        # empty): a failure or a refusal leaves nothing behind.
        for path, _ in temps:
            path.unlink(missing_ok=True)
        with suppress(OSError):
            for d in created:
                d.rmdir()
    return counts


def _locked_temp(directory: Path, split: str, stack: ExitStack) -> tuple[Path, IO[bytes]]:
    """A new temporary token file in ``directory``, open for writing and flock-ed for as long as it
    is open (the kernel drops the lock when the process dies: the proof :func:`sweep_dead_temps`
    takes)."""
    while True:
        fd, name = tempfile.mkstemp(prefix=f"{_TEMP_PREFIX}{split}.", suffix=".bin", dir=directory)
        f = stack.enter_context(os.fdopen(fd, "wb"))
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Between mkstemp and flock another process's sweep may have taken it for a dead one's.
        with suppress(FileNotFoundError):
            if os.stat(name).st_ino == os.fstat(fd).st_ino:
                return Path(name), f


def sweep_dead_temps(directory: Path) -> list[Path]:
    """Remove (and return) the temporary token files in ``directory`` whose writers died (a SIGKILL,
    a power cut): those no process holds the flock of. A live writer's stay, however old."""
    return sweep_partial_files(directory, f"{_TEMP_PREFIX}*", stale_after=0)


@dataclass
class PreparedData:
    """Token memmaps of one corpus under one tokenizer (None: counted by a dry run, not written)."""

    directory: Path
    train: Optional[np.memmap]
    val: Optional[np.memmap]
    meta: dict

    @property
    def counts(self) -> tuple[int, int]:
        """(train, val) tokens."""
        return self.meta["train_tokens"], self.meta["val_tokens"]


def _wanted(corpus: Corpus, tok: Tokenizer, val_fraction: float) -> dict:
    """The ``meta.json`` fields that name what made a set of token files."""
    return {
        "tokenizer_kind": tok.kind,
        "tokenizer_fingerprint": tok.fingerprint(),
        "vocab_size": tok.vocab_size,
        "dtype": token_dtype(tok.vocab_size).name,
        "corpus_fingerprint": corpus.fingerprint,
        "val_fraction": val_fraction,
        "separator": separator_ids(tok)[1],
    }


def reusable_meta(directory: Path, want: dict) -> Optional[dict]:
    """``directory``'s ``meta.json`` when it names ``want`` and both token files have its sizes (a
    split too small is :func:`prepare`'s to refuse); else None."""
    try:  # missing, damaged or unreadable: prepared again (an unwritable folder is refused then)
        meta = read_json(directory / "meta.json", "data meta.json", STATE_BOUNDS)
    except MinigptError:
        return None
    itemsize = np.dtype(want["dtype"]).itemsize
    ok = (
        isinstance(meta, dict)
        and all(meta.get(k) == v for k, v in want.items())
        and all(
            (directory / f"{s}.bin").is_file()
            and (directory / f"{s}.bin").stat().st_size == meta.get(f"{s}_tokens", -1) * itemsize
            for s in ("train", "val")
        )
    )
    return meta if ok else None


def _out_of_range(directory: Path, dtype: np.dtype, vocab_size: int) -> tuple[Path, int] | None:
    """The first token file in ``directory`` holding an id ≥ ``vocab_size``, and its largest id; or
    None."""
    for split in ("train", "val"):
        path = directory / f"{split}.bin"
        if path.stat().st_size == 0:
            continue
        top = int(np.max(np.memmap(path, dtype=dtype, mode="r")))
        if top >= vocab_size:
            return path, top
    return None


def token_dir(root: Path, tok: Tokenizer) -> Path:
    """``<root>/<kind>-<fingerprint>/``: where ``tok``'s token files of the corpus in ``root``
    go."""
    return root / f"{tok.kind}-{tok.fingerprint()}"


def split_plan(corpus: Corpus, val_fraction: float) -> tuple[SplitPlan, int]:
    """The one split ``prepare``, ``train`` and ``train-tokenizer`` make, and the non-empty
    documents."""
    n_documents, total_chars = survey(corpus)
    return SplitPlan.make(n_documents, total_chars, val_fraction), n_documents


def prepare(
    corpus: Corpus | str | Path,
    tok: Tokenizer,
    root: Path,
    val_fraction: float = 0.1,
    log: Callable[[str], None] = print,
    progress: Optional[bool] = None,
    block_size: Optional[int] = None,
    write: bool = True,
) -> PreparedData:
    """Tokenize ``corpus`` into ``root/<kind>-<fingerprint>/{train,val}.bin``, or reuse files whose
    ``meta.json`` names the same tokenizer, corpus and split. ``write`` False (a dry run): only
    counted. Raises MinigptError: a corpus file unreadable or not UTF-8, a bad JSON line, text the
    tokenizer cannot encode, a folder that cannot be written, or a split too small."""
    corpus = corpus if isinstance(corpus, Corpus) else open_corpus(corpus)
    directory = token_dir(root, tok)
    sweep_dead_temps(
        directory
    )  # whatever this run goes on to do: a dead writer's files are garbage
    want = _wanted(corpus, tok, val_fraction)
    dtype = np.dtype(want["dtype"])
    meta = reusable_meta(directory, want)
    if meta is not None:
        bad = _out_of_range(directory, dtype, tok.vocab_size)
        if bad is not None:
            log(
                f"{bad[0]} holds token id {bad[1]:,}, beyond the tokenizer's {tok.vocab_size:,} "
                f"entries (a damaged file); preparing it again"
            )
            meta = None
        else:
            check_split_counts(val_fraction, meta["train_tokens"], meta["val_tokens"], block_size)
    if meta is None:
        check_writable(directory, folder=True)
        meta = _prepare_afresh(corpus, tok, directory, want, log, progress, block_size, write)
        if not write:
            return PreparedData(directory, None, None, meta)
    train = np.memmap(directory / "train.bin", dtype=dtype, mode="r")
    val = np.memmap(directory / "val.bin", dtype=dtype, mode="r")
    return PreparedData(directory, train, val, meta)


def _prepare_afresh(
    corpus: Corpus,
    tok: Tokenizer,
    directory: Path,
    want: dict,
    log: Callable[[str], None],
    progress: Optional[bool],
    block_size: Optional[int],
    write: bool,
) -> dict:
    if not write and corpus.size > PREVIEW_BYTES:
        return want  # a dry run does not encode a large corpus: its counts wait for train
    plan, n_documents = split_plan(corpus, want["val_fraction"])
    mb = corpus.size / 1e6
    if not write:  # counted, not written
        counts = write_token_files(corpus, tok, plan, None, False, block_size)
        return dict(
            want,
            **counts,
            documents=n_documents,
            split="documents" if plan.by_documents else "tail",
        )
    log(
        f"preparing token files in {directory} ({mb:,.1f} MB, {n_documents:,} document(s); validation: "
        f"{plan.describe()}) ..."
    )
    if directory.is_dir():
        (directory / "meta.json").unlink(missing_ok=True)
    t0 = time.perf_counter()
    counts = write_token_files(corpus, tok, plan, directory, progress, block_size)
    seconds = time.perf_counter() - t0
    meta = dict(
        want,
        **counts,
        documents=n_documents,
        split="documents" if plan.by_documents else "tail",
        corpus_files=corpus.records(),
        seconds=round(seconds, 3),
    )
    atomic_write_text(directory / "meta.json", json.dumps(meta, indent=1))
    share = counts["val_tokens"] / max(counts["train_tokens"] + counts["val_tokens"], 1)
    if plan.by_documents and not want["val_fraction"] / 3 <= share <= want["val_fraction"] * 3:
        log(
            f"note: the validation documents hold {share:.1%} of the tokens, not about data.val_fraction "
            f"{want['val_fraction']:g}: the last {plan.n_documents - plan.val_from_doc:,} document(s) are "
            f"{'long' if share > want['val_fraction'] else 'short'} ones; reorder the files, or choose another "
            "data.val_fraction"
        )
    if seconds > 5:
        n = counts["train_tokens"] + counts["val_tokens"]
        log(f"prepared {n:,} tokens in {seconds:.0f} s ({mb / seconds:.1f} MB/s)")
    return meta
