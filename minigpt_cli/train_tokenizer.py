"""The ``train-tokenizer`` command: train, save, and summarise a tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from .config import Config
from .data import ensure_corpus, split_text
from .errors import MinigptError
from .paths import default_tokenizer_path
from .tokenizer import train_tokenizer

KINDS = ("char", "bpe", "wordpiece", "unigram")
SAMPLE_WORDS = ("ROMEO", "thou", "hath", "wherefore", "Gloucester")


def run_train_tokenizer(cfg: Config, kind: Optional[str] = None, vocab_size: Optional[int] = None,
                        input_path: Optional[Path] = None, output_path: Optional[Path] = None,
                        echo: Callable[[str], None] = print) -> str:
    """Train a tokenizer of ``kind`` (default: the config's) and return a summary.

    The summary gives the vocabulary size, tokens on the validation split,
    characters per token, whether decode(encode(text)) == text on the corpus,
    and the segmentation of a few words.

    Raises:
        MinigptError: unknown kind, empty or missing input, unusable vocabulary size.
    """
    kind = kind or cfg.tokenizer.kind
    if kind not in KINDS:
        raise MinigptError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(KINDS)}")
    vocab_size = vocab_size or cfg.tokenizer.vocab_size
    if input_path is not None:
        if not input_path.is_file():
            raise MinigptError(f"input file {str(input_path)!r} not found; pass an existing text file to --input")
        corpus = input_path
    else:
        corpus = ensure_corpus(cfg, echo)
    try:
        text = corpus.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MinigptError(f"cannot read {str(corpus)!r} as UTF-8 text ({exc})") from None
    if not text:
        raise MinigptError(f"input file {str(corpus)!r} is empty; give it some text")
    tok = train_tokenizer(kind, text, vocab_size)
    out = output_path or (Path(cfg.tokenizer.path) if cfg.tokenizer.path and kind == cfg.tokenizer.kind
                          else default_tokenizer_path(cfg.data.data_dir, cfg.data.dataset, kind))
    tok.save(out)
    _, val = split_text(text, cfg.data.val_fraction)
    val_ids = tok.encode(val)
    roundtrip = tok.decode(tok.encode(text)) == text
    lines = [
        f"wrote {out}",
        f"kind                {kind}",
        f"vocabulary size     {tok.vocab_size:,}",
        f"val split tokens    {len(val_ids):,} ({len(val):,} characters)",
        f"characters / token  {len(val) / max(len(val_ids), 1):.3f}",
        f"round trip on corpus {'exact' if roundtrip else 'NOT exact'}",
        "segmentation:",
    ]
    for w in SAMPLE_WORDS:
        try:
            pieces = [tok.decode([i]) for i in tok.encode(w)]
        except MinigptError:
            pieces = ["(not encodable)"]
        lines.append(f"  {w:<12} {' | '.join(pieces)}")
    return "\n".join(lines)
