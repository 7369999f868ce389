"""One Tokenizer interface over the kinds the config names.

``char`` is ours: one id per distinct character of the corpus, sorted by code
point (nanoGPT's ``shakespeare_char``: 65 symbols on Tiny Shakespeare), saved
as JSON. The trained kinds (BPE, WordPiece, Unigram) come with the tokenizer
issue and share this interface.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Protocol

from .errors import MinigptError

FORMAT = "minigpt-char-tokenizer"


class Tokenizer(Protocol):
    """What data preparation, training and generation need from a tokenizer."""

    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def save(self, path: str | Path) -> None: ...

    def fingerprint(self) -> str: ...


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write text to path through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CharTokenizer:
    """Character-level tokenizer: id i is the i-th character of a sorted alphabet."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        self.chars = list(chars)
        if not self.chars:
            raise MinigptError("a char tokenizer needs at least one character; is the corpus empty?")
        if len(set(self.chars)) != len(self.chars) or any(len(c) != 1 for c in self.chars):
            raise MinigptError("a char tokenizer's alphabet must be distinct single characters")
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        """The alphabet of ``text``, sorted by code point.

        Raises:
            MinigptError: the text is empty.
        """
        if not text:
            raise MinigptError("cannot train a char tokenizer on an empty corpus")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown(self, text: str) -> list[str]:
        """Characters of ``text`` outside the alphabet, each once, in order of appearance."""
        seen: dict[str, None] = {}
        for ch in text:
            if ch not in self.stoi:
                seen.setdefault(ch, None)
        return list(seen)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``.

        Raises:
            MinigptError: naming each character the alphabet lacks, once.
        """
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            bad = ", ".join(repr(c) for c in self.unknown(text))
            raise MinigptError(
                f"text has characters the tokenizer's vocabulary lacks: {bad}; "
                "remove or replace them"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "kind": "char", "chars": self.chars}, ensure_ascii=False, indent=1)

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as JSON (atomically)."""
        atomic_write_text(path, self.to_json())

    def fingerprint(self) -> str:
        """Short sha256 of the saved form: names the prepared data it made."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()[:12]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer file written by :meth:`save`.

    Raises:
        MinigptError: missing, unreadable or unrecognised file.
    """
    p = Path(path)
    if not p.is_file():
        raise MinigptError(f"tokenizer file {str(p)!r} not found; train one with minigpt train-tokenizer")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MinigptError(f"tokenizer file {str(p)!r} is not valid JSON ({exc}); delete it and train it again") from None
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        chars = obj.get("chars")
        if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars):
            raise MinigptError(f"tokenizer file {str(p)!r} is damaged (no 'chars' list); delete it and train it again")
        return CharTokenizer(chars)
    raise MinigptError(f"tokenizer file {str(p)!r} is not a minigpt tokenizer; delete it and train it again")


def train_tokenizer(kind: str, text: str, vocab_size: int | None = None) -> Tokenizer:
    """Train a tokenizer of ``kind`` on ``text``.

    Raises:
        MinigptError: an empty corpus, or a kind not available yet.
    """
    if kind == "char":
        return CharTokenizer.train(text)
    raise MinigptError(f"tokenizer kind {kind!r} is not available yet; use tokenizer.kind=char")
