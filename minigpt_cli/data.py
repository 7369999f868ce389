"""Corpus -> token memmaps -> batches.

Prepared data lives in ``data/<dataset>/<kind>-<tokenizer fingerprint>/``:
``train.bin`` and ``val.bin`` (token ids as a flat ``np.memmap``, uint16 below
65,536 vocabulary entries, uint32 above) and ``meta.json`` naming the tokenizer
and the corpus that made them. The first ``1 - val_fraction`` of the text (90%
by default, nanoGPT's split) is for training, the rest for validation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from .errors import MinigptError
from .config import Config
from .paths import corpus_path, default_tokenizer_path
from .fileio import atomic_write_bytes, atomic_write_text
from .tokenizer import Tokenizer, load_tokenizer
from .tokenizer_training import train_tokenizer


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab ≤ 65,536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def split_text(text: str, val_fraction: float = 0.1, keep_whole: Sequence[str] = ()) -> tuple[str, str]:
    """(train, val): the first ``int(len·(1-val_fraction))`` characters, and the rest.

    A split point inside one of ``keep_whole`` (the tokenizer's special
    tokens) moves back to that token's start, so the token stays one id.
    """
    n = int(len(text) * (1 - val_fraction))
    moved = True
    while moved:
        moved = False
        for s in keep_whole:
            i = text.find(s, max(0, n - len(s) + 1))
            if i != -1 and i < n:
                n, moved = i, True
    return text[:n], text[n:]


#: The download errors' fix when the config names a mirror (the url must serve the checksummed corpus itself).
_URL_HINT = ("fix data.url in the config (it overrides the environment): it must name a mirror of the "
             "{dataset} corpus itself, not another text (training on your own text is not supported yet)")


def ensure_corpus(cfg: Config, log: Callable[[str], None], progress: Optional[bool] = None) -> Path:
    """The corpus file, downloaded first (saying so) if it is not there or fails its checksum.

    ``progress``: the download's bar; None shows it only when stderr is a terminal.

    Raises:
        MinigptError: the download failed (:func:`~minigpt_cli.download.download`); with ``data.url``
            set, the fix says it must be a mirror of the named corpus.
    """
    from .download import download_tinyshakespeare, file_ok

    path = corpus_path(cfg.data.data_dir, cfg.data.dataset)
    if not file_ok(path):
        log(f"{path} not found or incomplete; downloading it first")
        hint = _URL_HINT.format(dataset=cfg.data.dataset) if cfg.data.url else None
        path, _ = download_tinyshakespeare(cfg.data.data_dir, url=cfg.data.url, progress=progress, mirror_hint=hint)
    return path


def tokenizer_path(cfg: Config) -> Path:
    """The configured tokenizer file: ``tokenizer.path``, else
    ``data/<dataset>/tokenizer-<kind>[-<vocab_size>][-special-<hash>].json``
    (:func:`~minigpt_cli.paths.default_tokenizer_path`)."""
    tc = cfg.tokenizer
    if tc.path:
        return Path(tc.path)
    return default_tokenizer_path(cfg.data.data_dir, cfg.data.dataset, tc.kind, tc.vocab_size, tc.special_tokens)


def load_configured_tokenizer(cfg: Config, path: Path) -> Tokenizer:
    """Load the tokenizer file ``path`` and check that it agrees with the config.

    It must be of ``tokenizer.kind``, hold the configured special tokens, and
    (for trained kinds, when ``tokenizer.vocab_size`` is set) have that size.

    Raises:
        MinigptError: an unreadable file, or one that disagrees with the config.
    """
    tc = cfg.tokenizer
    tok = load_tokenizer(path)
    if tok.kind != tc.kind:
        raise MinigptError(
            f"tokenizer file {str(path)!r} holds a {tok.kind} tokenizer but tokenizer.kind is {tc.kind}; "
            "fix tokenizer.path or tokenizer.kind"
        )
    missing = [s for s in tc.special_tokens if s not in tok.special_tokens]
    if missing:
        raise MinigptError(
            f"tokenizer file {str(path)!r} lacks the special tokens {', '.join(map(repr, missing))} "
            "that tokenizer.special_tokens names; delete the file to train it again, or fix the config"
        )
    if tc.kind != "char" and tc.vocab_size is not None and tok.vocab_size != tc.vocab_size:
        raise MinigptError(
            f"tokenizer file {str(path)!r} has {tok.vocab_size:,} entries but tokenizer.vocab_size is "
            f"{tc.vocab_size:,}; delete the file to train it again, or set tokenizer.vocab_size: {tok.vocab_size}"
        )
    return tok


def read_corpus(corpus: Path) -> str:
    """The corpus as text.

    Raises:
        MinigptError: unreadable, or not UTF-8.
    """
    try:
        return corpus.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MinigptError(f"cannot read corpus {str(corpus)!r} as UTF-8 text ({exc})") from None


def ensure_tokenizer(cfg: Config, corpus: Path, log: Callable[[str], None]) -> tuple[Tokenizer, Path]:
    """Load the configured tokenizer (:func:`tokenizer_path`), training (and saving) it first if its file is missing.

    An existing file must agree with the config (:func:`load_configured_tokenizer`).

    Raises:
        MinigptError: a file that disagrees with the config, or training that
            fails (empty corpus, impossible vocabulary size); nothing is written then.
    """
    tc = cfg.tokenizer
    path = tokenizer_path(cfg)
    if path.is_file():
        return load_configured_tokenizer(cfg, path), path
    size = f" with {tc.vocab_size:,} entries" if tc.kind != "char" and tc.vocab_size else ""
    log(f"tokenizer {path} not found; training a {tc.kind} tokenizer{size} on {corpus} first")
    tok = train_tokenizer(tc.kind, read_corpus(corpus), tc.vocab_size, tc.special_tokens)
    tok.save(path)
    return tok, path


def with_vocab(cfg: Config, vocab_size: int) -> Config:
    """``cfg`` with ``model.vocab_size`` taken from the tokenizer's ``vocab_size`` when null.

    Raises:
        MinigptError: a ``model.vocab_size`` smaller than the tokenizer's (its ids would not fit).
    """
    mc = cfg.model
    if mc.vocab_size is None:
        mc = mc.model_copy(update={"vocab_size": vocab_size})
    elif mc.vocab_size < vocab_size:
        raise MinigptError(
            f"model.vocab_size ({mc.vocab_size}) is smaller than the tokenizer's {vocab_size} entries; "
            "set model.vocab_size: null to take it from the tokenizer"
        )
    return cfg.model_copy(update={"model": mc})


#: Fewest tokens a split can have: one (x, y) window with block_size 1.
MIN_SPLIT_TOKENS = 2


def _split_error(val_fraction: float, n_train: int, n_val: int, need: int, block_size: int | None = None) -> MinigptError:
    """The one-line refusal of a train/val split that leaves a side too small."""
    small = " and ".join(name for name, n in (("train", n_train), ("val", n_val)) if n < need)
    # Another split helps only if the two sides together are enough for both.
    split_fix = "choose a data.val_fraction such as 0.1, " if n_train + n_val >= 2 * need else ""
    if block_size is None:
        need_s = f"at least {need} tokens each"
        fix = f"{split_fix}use more text"
    else:
        need_s = f"at least model.block_size+1 = {need:,} tokens each"
        most = max(min(n_train, n_val) - 1, 1)
        fix = f"{split_fix}lower model.block_size (to at most {most:,} with this split), or use more text"
    return MinigptError(
        f"data.val_fraction={val_fraction:.12g} splits the corpus into {n_train:,} train and {n_val:,} val "
        f"tokens, too few for {small} (they need {need_s}); {fix}"
    )


def check_split_counts(val_fraction: float, n_train: int, n_val: int, block_size: Optional[int] = None) -> None:
    """Refuse a split with fewer than :data:`MIN_SPLIT_TOKENS` tokens on a side (:func:`prepare`'s
    refusal), then, given ``block_size``, one with fewer than ``block_size + 1`` (:func:`check_split_sizes`).

    Raises:
        MinigptError: one line naming ``data.val_fraction``, the token counts and the fix.
    """
    if min(n_train, n_val) < MIN_SPLIT_TOKENS:
        raise _split_error(val_fraction, n_train, n_val, MIN_SPLIT_TOKENS)
    if block_size is not None and min(n_train, n_val) < block_size + 1:
        raise _split_error(val_fraction, n_train, n_val, block_size + 1, block_size)


def check_split_sizes(data: "PreparedData", block_size: int) -> None:
    """Refuse prepared data whose train or val split is shorter than ``block_size + 1`` tokens.

    Call it before training starts, so the run stops with one line naming
    ``data.val_fraction``, the token counts and ``model.block_size`` instead of
    failing on the first batch.

    Raises:
        MinigptError: a split with fewer than ``block_size + 1`` tokens.
    """
    check_split_counts(data.meta.get("val_fraction", float("nan")), len(data.train), len(data.val), block_size)


def _out_of_range(directory: Path, dtype: np.dtype, vocab_size: int) -> tuple[Path, int] | None:
    """The first token file in ``directory`` holding an id ≥ ``vocab_size``, and its largest id; or None."""
    for split in ("train", "val"):
        path = directory / f"{split}.bin"
        if path.stat().st_size == 0:
            continue
        top = int(np.max(np.memmap(path, dtype=dtype, mode="r")))
        if top >= vocab_size:
            return path, top
    return None


@dataclass
class PreparedData:
    """Token memmaps of one corpus under one tokenizer."""

    directory: Path
    train: np.memmap
    val: np.memmap
    meta: dict


def _target(corpus: Path, tokenizer: Tokenizer, out_root: Path, val_fraction: float) -> tuple[bytes, Path, dict]:
    """The corpus bytes, the folder its token files go to, and the ``meta.json`` fields naming what made them.

    Raises:
        MinigptError: an unreadable corpus.
    """
    try:
        raw = corpus.read_bytes()
    except OSError as exc:
        raise MinigptError(f"cannot read corpus {str(corpus)!r}: {exc}") from None
    fp = tokenizer.fingerprint()
    want = {
        "tokenizer_kind": tokenizer.kind,
        "tokenizer_fingerprint": fp,
        "vocab_size": tokenizer.vocab_size,
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "corpus": corpus.name,
        "corpus_sha256": hashlib.sha256(raw).hexdigest(),
        "val_fraction": val_fraction,
    }
    return raw, out_root / f"{tokenizer.kind}-{fp}", want


def _reusable_meta(directory: Path, want: dict) -> Optional[dict]:
    """``directory``'s ``meta.json`` when it names ``want`` and both token files have its sizes; else None."""
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    itemsize = np.dtype(want["dtype"]).itemsize
    ok = isinstance(meta, dict) and all(meta.get(k) == v for k, v in want.items()) and all(
        (directory / f"{s}.bin").is_file()
        and (directory / f"{s}.bin").stat().st_size == meta.get(f"{s}_tokens", -1) * itemsize
        and meta.get(f"{s}_tokens", -1) >= MIN_SPLIT_TOKENS
        for s in ("train", "val")
    )
    return meta if ok else None


def _encode_splits(raw: bytes, tokenizer: Tokenizer, val_fraction: float) -> dict[str, np.ndarray]:
    """The train and val token ids of the corpus bytes ``raw`` (:func:`split_text`), refused when a side is
    (nearly) empty.

    Raises:
        MinigptError: text the tokenizer cannot encode, or a split with fewer than :data:`MIN_SPLIT_TOKENS` tokens.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    train_text, val_text = split_text(raw.decode("utf-8"), val_fraction, getattr(tokenizer, "special_tokens", ()))
    encoded = {split: np.asarray(tokenizer.encode(part), dtype=dtype)
               for split, part in (("train", train_text), ("val", val_text))}
    check_split_counts(val_fraction, encoded["train"].size, encoded["val"].size)
    return encoded


def prepare(corpus: Path, tokenizer: Tokenizer, out_root: Path, val_fraction: float = 0.1,
            log=print) -> PreparedData:
    """Tokenize ``corpus`` into ``out_root/<kind>-<fingerprint>/{train,val}.bin``.

    Reuses files whose ``meta.json`` names the same tokenizer, corpus and split;
    otherwise writes them afresh (each file through a temporary name and a rename,
    ``meta.json`` last, so a half-written set is never taken for a finished one).
    Existing files of the wrong size, or holding a token id beyond the
    tokenizer's vocabulary (damaged), are logged and prepared again.

    Raises:
        MinigptError: unreadable corpus, text the tokenizer cannot encode, or a
            ``val_fraction`` that leaves the train or val split with fewer than
            :data:`MIN_SPLIT_TOKENS` tokens (refused before anything is written;
            :func:`check_split_sizes` checks against ``model.block_size``).
    """
    raw, directory, want = _target(corpus, tokenizer, out_root, val_fraction)
    meta_path = directory / "meta.json"
    dtype = np.dtype(want["dtype"])
    meta = _reusable_meta(directory, want)
    if meta is not None:
        bad = _out_of_range(directory, dtype, tokenizer.vocab_size)
        if bad is not None:
            log(f"{bad[0]} holds token id {bad[1]:,}, beyond the tokenizer's {tokenizer.vocab_size:,} "
                f"entries (a damaged file); preparing it again")
            meta = None
    if meta is None:
        log(f"preparing token files in {directory} ...")
        # Encode both splits before writing anything, so a refused split leaves no files.
        encoded = _encode_splits(raw, tokenizer, val_fraction)
        directory.mkdir(parents=True, exist_ok=True)
        meta_path.unlink(missing_ok=True)
        meta = dict(want)
        for split, ids in encoded.items():
            atomic_write_bytes(directory / f"{split}.bin", ids.tobytes())
            meta[f"{split}_tokens"] = int(ids.size)
        atomic_write_text(meta_path, json.dumps(meta, indent=1))
    train = np.memmap(directory / "train.bin", dtype=dtype, mode="r")
    val = np.memmap(directory / "val.bin", dtype=dtype, mode="r")
    return PreparedData(directory, train, val, meta)


def split_counts(corpus: Path, tokenizer: Tokenizer, out_root: Path, val_fraction: float) -> tuple[int, int]:
    """The (train, val) token counts :func:`prepare` would give, writing nothing.

    Read from prepared files that :func:`prepare` would reuse, else by
    encoding the corpus (about 0.1 s for 1 MB with the char tokenizer, about a
    second with a trained one).

    Raises:
        MinigptError: as :func:`prepare` (unreadable corpus, text the tokenizer
            cannot encode, a (nearly) empty split).
    """
    raw, directory, want = _target(corpus, tokenizer, out_root, val_fraction)
    meta = _reusable_meta(directory, want)
    if meta is not None:
        return meta["train_tokens"], meta["val_tokens"]
    encoded = _encode_splits(raw, tokenizer, val_fraction)
    return int(encoded["train"].size), int(encoded["val"].size)


class BatchSampler:
    """Random (x, y) windows from a token memmap, drawn without Python loops.

    Offsets come from a dedicated ``torch.Generator`` so the data order is part
    of the training state (saved and restored with a checkpoint).
    """

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int,
                 device: torch.device, rank: int = 0, world: int = 1):
        if len(tokens) < block_size + 1:
            raise MinigptError(
                f"the split has {len(tokens)} tokens, fewer than block_size+1 = {block_size + 1}; "
                "lower model.block_size or use more text"
            )
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)
        # Every rank draws the same global batch and keeps its own slice, so a
        # run on N processes sees exactly the data of one process with N times the batch.
        self.rank, self.world = rank, world

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (batch_size, block_size) int64, y shifted by one position."""
        ix = torch.randint(len(self.tokens) - self.block_size, (self.batch_size * self.world,),
                           generator=self.generator)
        ix = ix[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        return windows(self.tokens, ix, self.block_size, self.device)

    def reseed(self, seed: int) -> None:
        """Restart the offsets from ``seed`` (eval batches are a function of the step, :func:`eval_seed`)."""
        self.generator.manual_seed(seed)

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def windows(tokens: np.ndarray, offsets: torch.Tensor, block_size: int,
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows of ``tokens`` starting at ``offsets`` (n,): x, y (n, block_size) int64 on ``device``, y shifted by one."""
    window = torch.from_numpy(tokens[offsets.numpy()[:, None] + np.arange(block_size + 1)].astype(np.int64))
    x, y = window[:, :-1], window[:, 1:]
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


#: Eval offsets are drawn this many at a time: memory stays bounded whatever ``eval_iters`` asks for.
EVAL_CHUNK = 4096


def eval_offsets(n_tokens: int, block_size: int, count: int, seed: int) -> Iterator[torch.Tensor]:
    """The start offsets of the ``count`` windows an eval reads, in chunks of at most :data:`EVAL_CHUNK`.

    Drawn uniformly from 0 .. n_tokens - block_size - 1 (every window has a
    next token), by a generator of their own, always in the same chunks, so
    the windows depend on (seed, count) alone: not on the batch size, the
    accumulation or the process count they are later read with.
    """
    generator = torch.Generator().manual_seed(seed)
    for start in range(0, count, EVAL_CHUNK):
        yield torch.randint(n_tokens - block_size, (min(EVAL_CHUNK, count - start),), generator=generator)


def eval_seed(seed: int, split: str, step: int) -> int:
    """The seed of the eval batches of ``split`` at optimizer step ``step``.

    A function of the step alone, so an eval at step s reads the same batches
    however the run got there: uninterrupted, resumed, or continued past a
    finished run's final eval.
    """
    return ((seed * 1_000_003 + {"train": 2, "val": 3}[split]) * 1_000_000_007 + step) & (2**63 - 1)
