"""The ``train-tokenizer`` command: train, save, and summarise a tokenizer, or compare all four
kinds."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..config.schema import Config, TokenizerConfig
from ..config.special_tokens import check_special_tokens
from ..errors import MinigptError
from ..fileio import atomic_write_text, check_writable, errors_as
from ..paths import default_tokenizer_path
from ..tokenizer.kinds import KINDS, Tokenizer
from ..tokenizer.training import check_vocab_size, train_tokenizer
from .corpus import Corpus, cut_pieces, open_corpus
from .pipeline import TOKENIZER_TRAIN_CHARS, configured_corpus, tokenizer_path, training_texts
from .preparation import encoded, split_plan

#: In the folder of an own-text corpus (``data/<name>-<fingerprint>/``): the tokenizer ``train-tokenizer``
#: last trained there, which ``train`` then uses for that corpus (:func:`chosen_tokenizer`).
CHOSEN = "chosen-tokenizer.json"


def chosen_tokenizer(cfg: Config, note: Callable[[str], None]) -> Config:
    """``cfg`` with the tokenizer ``train-tokenizer`` trained for its ``data.path`` corpus, in place
    of the config's, saying so through ``note``; ``cfg`` itself when there is none, when
    ``tokenizer.path`` names a file (the user's choice) or ``model.init_from`` a model (its own
    tokenizer), or when they agree.

    Raises:
        MinigptError: a ``data.path`` that names nothing readable.
    """
    tc, dc = cfg.tokenizer, cfg.data
    if dc.path is None or tc.path or cfg.model.init_from:
        return cfg
    # Hash the corpus (to find its folder) only where train-tokenizer left a record for some corpus.
    if not any(Path(dc.data_dir).glob(f"*/{CHOSEN}")):
        return cfg
    root = open_corpus(dc.path, dc.text_field).folder(dc.data_dir)
    try:
        chosen = TokenizerConfig.model_validate(json.loads((root / CHOSEN).read_text("utf-8")))
    except (OSError, ValueError):  # none for this corpus, or unreadable: the config's, as before
        return cfg
    ours = cfg.model_copy(update={"tokenizer": chosen})
    path = tokenizer_path(ours, root)
    if chosen == tc or not path.is_file():  # the same; or its file is gone, so nothing to use
        return cfg
    size = f"{chosen.vocab_size:,}-entry " if chosen.kind != "char" and chosen.vocab_size else ""
    note(
        f"note: training with the {size}{chosen.kind} tokenizer that train-tokenizer made for "
        f"{dc.path} ({path}) in place of the config's {tc.kind}; to keep the config's, add "
        f"--set tokenizer.path={tokenizer_path(cfg, root)}"
    )
    return ours


def sample_words(text: str, n: int = 3) -> list[tuple[str, int]]:
    """(word, count): the summary's examples, from the corpus itself: its ``n`` most frequent words
    of 4+ letters (often one token each), then its ``n`` most frequent of 8+ letters, all-capital
    ones (speaker names) last (where the kinds cut differently)."""
    counts = Counter(re.findall(r"[^\W\d_]{4,}", text))
    ranked = sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))
    frequent = ranked[:n]
    # Running text before a script's speaker names (GLOUCESTER), where the corpus has both.
    long = sorted((wc for wc in ranked if len(wc[0]) >= 8), key=lambda wc: wc[0].isupper())[:n]
    return frequent + long


@dataclass
class TokenizerReport:
    """How one trained tokenizer does on a corpus."""

    tokenizer: Tokenizer
    val_tokens: int
    val_chars: int
    round_trip: bool
    train_seconds: float

    @property
    def chars_per_token(self) -> float:
        return self.val_chars / max(self.val_tokens, 1)


def read_corpus(
    cfg: Config,
    input_path: Optional[Path],
    echo: Callable[[str], None],
    limit_chars: Optional[int] = None,
) -> tuple[Corpus, str, Path]:
    """The corpus, its training text, and its folder (where its tokenizers go by default). Raises
    MinigptError: nothing there, an empty or unreadable file, text that is not UTF-8, a bad JSON
    line."""
    # The corpus's errors name the key that gave it; with input_path that is --input.
    with errors_as(
        {MinigptError: lambda exc: exc.spelled({"data.path": "--input"}) if input_path else None}
    ):
        if input_path is not None:
            corpus = open_corpus(input_path, cfg.data.text_field)
            root = corpus.folder(cfg.data.data_dir)
        else:
            corpus, root = configured_corpus(cfg, echo)
        text = "".join(training_texts(corpus, cfg.tokenizer.special_tokens, limit_chars))
    if not text.strip("\n"):
        raise MinigptError(f"input {corpus.source!r} is empty; give it some text")
    return corpus, text, root


def evaluate(
    tok: Tokenizer, corpus: Corpus, text: str, val_fraction: float, train_seconds: float = 0.0
) -> TokenizerReport:
    """Tokens on the validation split ``prepare`` and ``train`` make
    (:func:`~.preparation.split_plan`; only that split is encoded), and whether
    decode(encode(text)) == text on the training text. The text is encoded as ``prepare`` encodes a
    document: in pieces cut where GPT-2's regex splits (:func:`~.corpus.cut_pieces`), which give
    encode(text)'s ids, in parallel (``encode_batch``)."""
    val_tokens = val_chars = 0
    plan = split_plan(corpus, val_fraction)[0]
    for _, ids, chars in encoded(corpus, tok, plan, progress=False, only=1):
        val_tokens, val_chars = val_tokens + ids.size, val_chars + chars
    pieces = list(cut_pieces([text], special_tokens=tok.special_tokens))
    ids = np.concatenate([*tok.encode_batch(pieces), np.zeros(0, dtype=np.int64)])
    return TokenizerReport(
        tok, val_tokens, val_chars, tok.decode(ids.tolist()) == text, train_seconds
    )


def _show(piece: str) -> str:
    return piece.replace(" ", "\u2581").replace("\n", "\\n").replace("\t", "\\t")


def segmentation(tok: Tokenizer, word: str) -> str:
    """``word`` after a space, cut into its tokens' texts (``▁where | fore``), or ``(not
    encodable)``."""
    with suppress(MinigptError):  # a char tokenizer without these characters
        return " | ".join(_show(p) for p in tok.pieces(" " + word))
    return "(not encodable)"


def run_train_tokenizer(
    cfg: Config,
    kind: Optional[str] = None,
    vocab_size: Optional[int] = None,
    input_path: Optional[Path] = None,
    output_path: Optional[Path] = None,
    special_tokens: Optional[Sequence[str]] = None,
    echo: Callable[[str], None] = print,
) -> str:
    """Train a tokenizer of ``kind`` (default: the config's), save it, and return a summary. Raises
    MinigptError: unknown kind, empty or missing input, an impossible vocabulary size; nothing
    written."""
    if (
        kind is None and cfg.model.init_from is not None
    ):  # a fine-tuning config: the folder's tokenizer.json
        kind = "hf"
    kind = kind or cfg.tokenizer.kind
    if (
        kind == "hf"
    ):  # the config's kind for a given file; train_tokenizer refuses any other unknown kind
        raise MinigptError(
            "tokenizer.kind hf is a Hugging Face tokenizer.json used as it is, never trained here",
            "pass --kind char, bpe, wordpiece or unigram to train one",
        )
    vocab_size = vocab_size or cfg.tokenizer.vocab_size
    specials = check_special_tokens(
        cfg.tokenizer.special_tokens if special_tokens is None else special_tokens
    )
    corpus, text, root = read_corpus(
        cfg, input_path, echo, None if kind == "char" else TOKENIZER_TRAIN_CHARS
    )
    # An own text's tokenizer in its default place is the one train then uses for it (CHOSEN).
    chosen = (
        output_path is None
        and not (cfg.tokenizer.path and kind == cfg.tokenizer.kind)
        and (input_path is not None or cfg.data.path is not None)
    )
    if output_path is not None:
        out = output_path
    elif cfg.tokenizer.path and kind == cfg.tokenizer.kind:
        out = Path(cfg.tokenizer.path)
    else:
        out = default_tokenizer_path(
            root.parent, root.name, kind, None if kind == "char" else vocab_size, specials
        )
    if out.exists() and Path(corpus.source).exists() and os.path.samefile(out, corpus.source):
        raise MinigptError(
            f"--output {str(out)!r} is the text the tokenizer trains on; writing there would "
            "replace it: pass another --output"
        )
    check_writable(out, folder=False)  # before the training, not after it
    status = f"training a {kind} tokenizer of {vocab_size or 0:,} entries on {corpus.source} ({len(text):,} characters)"
    t0 = time.perf_counter()
    tok = train_tokenizer(kind, text, vocab_size, specials, on_start=lambda: echo(status))
    seconds = time.perf_counter() - t0
    rep = evaluate(tok, corpus, text, cfg.data.val_fraction, seconds)
    tok.save(out)
    if chosen:
        record = {"kind": kind, "vocab_size": None if kind == "char" else vocab_size}
        atomic_write_text(root / CHOSEN, json.dumps({**record, "special_tokens": list(specials)}))
    size_note = (
        "  (--vocab-size is ignored for char: the alphabet decides)"
        if kind == "char" and vocab_size
        else ""
    )
    lines = [
        f"wrote {out}" + (f" (train uses it for data.path {corpus.source})" if chosen else ""),
        f"kind                {kind}",
        f"vocabulary size     {tok.vocab_size:,}{size_note}",
        f"val split tokens    {rep.val_tokens:,} ({rep.val_chars:,} characters)",
        f"characters / token  {rep.chars_per_token:.3f}",
        f"round trip on corpus {'exact' if rep.round_trip else 'NOT exact'}",
        f"training time       {seconds:.2f} s",
    ]
    if tok.special_tokens:
        lines.append(
            "special tokens      "
            + ", ".join(f"{s} (id {tok.encode(s)[0]})" for s in tok.special_tokens)
        )
    lines.append("segmentation of the corpus's frequent words (after a space, shown as \u2581):")
    lines += [f"  {w:<14} {segmentation(tok, w):<40} ({c:,}\u00d7)" for w, c in sample_words(text)]
    return "\n".join(lines)


def run_compare(
    cfg: Config,
    vocab_size: Optional[int] = None,
    input_path: Optional[Path] = None,
    special_tokens: Optional[Sequence[str]] = None,
    echo: Callable[[str], None] = print,
) -> str:
    """Train all four kinds at one vocabulary size on one corpus; return a table and segmentations.
    Raises MinigptError: as :func:`run_train_tokenizer`; every kind's size is checked before any is
    trained."""
    vocab_size = vocab_size or cfg.tokenizer.vocab_size
    if vocab_size is None:
        raise MinigptError(
            "--compare needs a vocabulary size; pass --vocab-size N or set tokenizer.vocab_size"
        )
    specials = check_special_tokens(
        cfg.tokenizer.special_tokens if special_tokens is None else special_tokens
    )
    corpus, text, _ = read_corpus(cfg, input_path, echo, TOKENIZER_TRAIN_CHARS)
    for kind in KINDS:
        check_vocab_size(kind, text, vocab_size, specials)
    reports = {}
    for kind in KINDS:
        echo(f"training {kind} ...")
        t0 = time.perf_counter()
        tok = train_tokenizer(kind, text, vocab_size, specials)
        reports[kind] = evaluate(tok, corpus, text, cfg.data.val_fraction, time.perf_counter() - t0)
    val_chars = next(iter(reports.values())).val_chars
    lines = [
        f"{corpus.source}: {len(text):,} characters; validation split {val_chars:,} characters; "
        f"vocabulary size {vocab_size:,}"
        + (f"; special tokens {', '.join(specials)}" if specials else ""),
        "",
        f"{'kind':<10} {'vocab':>7} {'val tokens':>11} {'chars/token':>12} {'round trip':>11} {'train s':>8}",
    ]
    for kind, r in reports.items():
        lines.append(
            f"{kind:<10} {r.tokenizer.vocab_size:>7,} {r.val_tokens:>11,} {r.chars_per_token:>12.3f} "
            f"{'exact' if r.round_trip else 'NOT exact':>11} {r.train_seconds:>8.2f}"
        )
    lines += [
        "(bpe merges the most frequent pair; wordpiece the pair with the highest count(ab)/(count(a)·count(b)),",
        " which favours pairs of rare symbols; unigram prunes a large candidate set by likelihood)",
        "",
        "segmentation of the corpus's frequent words (after a space, shown as \u2581):",
    ]
    for w, c in sample_words(text):
        lines.append(f"  {w} ({c:,}\u00d7)")
        lines += [f"    {kind:<10} {segmentation(r.tokenizer, w)}" for kind, r in reports.items()]
    return "\n".join(lines)
