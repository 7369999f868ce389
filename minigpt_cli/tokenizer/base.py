"""The :class:`Tokenizer` interface, and what is computed over any tokenizer: the id check every
``decode`` makes, the note on prompt text the model will not see as typed, the fix for a run's lost
tokenizer.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import TYPE_CHECKING, Container, Iterable, Optional, Protocol, Sequence

from ..config.special_tokens import split_special
from ..errors import MinigptError

if TYPE_CHECKING:
    import numpy as np

    from ..config.schema import Config

__all__ = [
    "SPACE_MARK",
    "MAX_SHOWN",
    "Tokenizer",
    "check_ids",
    "lossy_report",
    "missing_chars",
    "run_tokenizer_fix",
]

#: What this module says: ids that are not token ids, and the fix for a run whose own tokenizer.json
#: is lost.

#: SentencePiece's visible space, used by the Unigram and WordPiece kinds.
SPACE_MARK = "\u2581"
#: At most this many characters are named by :func:`lossy_report`.
MAX_SHOWN = 10


class Tokenizer(Protocol):
    """What data preparation, training and generation need from a tokenizer."""

    #: One of :data:`~minigpt_cli.tokenizer.kinds.KINDS`, or ``hf`` (a given tokenizer.json, as it
    #: is).
    kind: str
    #: Configured special tokens (``<|endoftext|>``, ...), each a single id; not the unknown token.
    special_tokens: list[str]
    #: The token unknown characters become (``<unk>``), or None: char (and hf without one) refuses
    #: them, bpe has none.
    unk_token: Optional[str]

    @property
    def vocab_size(self) -> int:
        """Number of ids: every id is in [0, vocab_size)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, one per token; special tokens are single ids."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list["np.ndarray"]:
        """The ids of each of ``texts`` (as :meth:`encode`), as int64 arrays; faster than one call
        each."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; raises MinigptError for an id outside [0, vocab_size)."""
        ...

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` its vocabulary lacks (lost to ``unk_token``), once each, in
        order."""
        ...

    def pieces(self, text: str) -> list[str]:
        """The text of each token of ``text``."""
        ...

    def save(self, path: str | Path) -> None:
        """Write the tokenizer file (atomically)."""
        ...

    def fingerprint(self) -> str:
        """Short sha256 of the saved form (12 hex digits)."""
        ...


def check_ids(ids: Iterable[int], vocab_size: int) -> list[int]:
    """``ids`` as a list of ints, each a token id: 0 <= id < ``vocab_size`` (one min and one max:
    cheap per token).

    Raises:
        MinigptError: naming the first id outside the vocabulary, and its size.
    """
    ids = list(ids)
    # One pass in C over the types: a list of plain ints (what encode gives) needs no more. Others
    # (numpy integers) are converted, but int(1.7) would silently decode id 1, so floats are refused.
    plain = set(map(type, ids)) <= {int}
    floats = [] if plain else [i for i in ids if isinstance(i, (bool, float))]
    out = ids if plain else [] if floats else list(map(int, ids))
    outside = (
        [i for i in out if not 0 <= i < vocab_size]
        if out and (min(out) < 0 or max(out) >= vocab_size)
        else []
    )
    if floats or outside:
        raise MinigptError(
            f"token id {floats[0]!r} is not an integer; decode integer ids (the ids encode gives)"
            if floats
            else f"token id {outside[0]:,} is not in the tokenizer's vocabulary of {vocab_size:,} "
            f"ids (0 to {vocab_size - 1:,}); decode ids with the tokenizer that made them"
        )
    return out


#: The parts of :func:`lossy_report`'s note: text of a prompt the model will not see as it was
#: typed.
_LOSSY = {
    "unknown": "{n} of {what} became {unk}: {shown}",
    "unknown_words": "the words of {what} holding {n} the vocabulary lacks became {unk}: {shown}",
    "space_mark": "{what}'s {mark!r} (U+2581) becomes a space ({kind} writes a space as {mark!r})",
    "unk_text": "{what}'s {unk!r} is read as the unknown token (one id), not as its {length} characters",
    "other": "{what} does not come back as typed: it decodes as {back}",
}


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def lossy_report(tok: Tokenizer, text: str, what: str = "the prompt") -> Optional[str]:
    """A one-line ``note:`` naming the text of ``text`` (``what``) the model will not see as typed,
    or None.

    For the kinds with an unknown token (Unigram, WordPiece): the characters that become ``<unk>``
    (at most :data:`MAX_SHOWN` named), a literal ``▁`` (it decodes as a space), a literal ``<unk>``
    (one id), and any other text whose round trip differs. None for bpe (every byte kept) and char
    (``encode`` refuses).
    """
    unk = tok.unk_token
    if unk is None:
        return None
    parts = []
    chars = tok.unknown_chars(text)
    if chars:
        shown = ", ".join(repr(c) for c in chars[:MAX_SHOWN]) + (
            ", ..." if len(chars) > MAX_SHOWN else ""
        )
        n = f"{len(chars)} character{'s' if len(chars) > 1 else ''}"
        # WordPiece: the whole word holding such a character becomes <unk>
        parts.append(
            _LOSSY["unknown_words" if tok.kind == "wordpiece" else "unknown"].format(
                n=n, what=what, unk=unk, shown=shown
            )
        )
    plain = "".join(
        split_special(text, tok.special_tokens)[0::2]
    )  # special tokens are one id by design
    if SPACE_MARK in plain:
        parts.append(_LOSSY["space_mark"].format(what=what, mark=SPACE_MARK, kind=tok.kind))
    if unk in plain:
        parts.append(_LOSSY["unk_text"].format(what=what, unk=unk, length=len(unk)))
    if not parts:
        back = tok.decode(tok.encode(text))
        if back != text:
            parts.append(_LOSSY["other"].format(what=what, back=_clip(repr(back))))
    return "note: " + "; ".join(parts) if parts else None


def missing_chars(text: str, special_tokens: list[str], known: Container[str]) -> list[str]:
    """Characters of ``text`` outside its special tokens that are not in ``known``, once each, in
    order."""
    seen: dict[str, None] = {}
    for part in split_special(text, special_tokens)[0::2]:
        for ch in part:
            if ch not in known:
                seen.setdefault(ch, None)
    return list(seen)


def run_tokenizer_fix(run_dir: Path, cfg: Config) -> str:
    """How to mend run ``run_dir``'s missing or damaged ``tokenizer.json``: copy back the file it
    was trained with (``tokenizer.path``, else the ``model.init_from`` folder's, else the dataset
    folder's default file) when it is there, else that no copy is known. A relative path is taken
    from where ``train`` ran, or from the project's folder now; the run's own file is never named.
    """
    from ..paths import default_tokenizer_path
    from ..run import env as run_env
    from ..run import folder as runs

    tc, mc, dc = cfg.tokenizer, cfg.model, cfg.data
    dest = Path(os.path.abspath(Path(run_dir) / runs.TOKENIZER))
    folder = (
        Path(mc.init_from) / runs.TOKENIZER if mc.init_from else None
    )  # a model folder's, named as a run's
    default = default_tokenizer_path(
        dc.data_dir, dc.dataset, tc.kind, tc.vocab_size, tc.special_tokens
    )
    if (
        dc.path is not None and dc.fingerprint
    ):  # a data.path corpus keeps it in <data_dir>/<name>-<fingerprint>/
        default = Path(dc.data_dir) / f"*-{dc.fingerprint[:12]}" / default.name
    named = Path(tc.path) if tc.path else folder or default
    bases = run_env.training_dirs(
        run_dir, cfg.train.out_dir
    )  # where train ran, or where the project is now
    looked = []
    for given in dict.fromkeys(p for p in (named, folder) if p is not None):
        if given.is_absolute():
            options = [given]
        else:
            options = [base / given for base in bases]  # none: relative to a folder no record names
        for option in options:
            matches = (
                [Path(m) for m in sorted(glob.glob(str(option)))]
                if glob.has_magic(str(option))
                else [option]
            )
            for source in (Path(os.path.abspath(m)) for m in matches):
                if source == dest or (
                    source.exists() and dest.exists() and os.path.samefile(source, dest)
                ):
                    continue
                if source.is_file():
                    return (
                        "a run keeps the tokenizer it was trained with: copy it back from "
                        f"{str(source)!r} to {str(dest)!r}, if that file was not retrained since"
                    )
            looked.append(str(Path(os.path.abspath(option))))
        looked = list(dict.fromkeys(looked))
    where = (
        f" ({' and '.join(map(repr, looked))} {'are' if len(looked) > 1 else 'is'} not there)"
        if looked
        else ""
    )
    return (
        f"a run keeps the tokenizer it was trained with, and no copy of it is known{where}: "
        f"the run cannot be used without it; restore {str(dest)!r} from a backup, or train a new run"
    )
