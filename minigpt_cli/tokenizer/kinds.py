"""One Tokenizer interface over the five kinds the config names (char, bpe, unigram, wordpiece, hf;
see the README).

The trained kinds are saved in the ``tokenizers`` library's own ``tokenizer.json`` (which refuses
extra keys, so :func:`load_tokenizer` tells the kind from ``model.type``); char in our own JSON
(:data:`FORMAT`). Special tokens are single ids in every kind, matched in the raw text first;
trained kinds put them first (ids 0..k-1), char appends them. Every ``decode`` refuses an id outside
[0, vocab_size) (:func:`check_ids`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

from ..config.special_tokens import UNK, special_token_problem, split_special
from ..errors import MinigptError
from ..fileio import (
    TOKENIZER_BOUNDS,
    atomic_write_text,
    check_regular,
    errors_as,
    parse_json,
    read_problem,
    read_text,
)
from .base import (
    MAX_SHOWN,
    SPACE_MARK,
    Tokenizer,
    check_ids,
    lossy_report,
    missing_chars,
    run_tokenizer_fix,
)

if TYPE_CHECKING:
    import numpy as np

    from ..config.schema import Config

__all__ = [
    "FORMAT",
    "KINDS",
    "UNK",
    "SPACE_MARK",
    "MAX_SHOWN",
    "Tokenizer",
    "CharTokenizer",
    "HFTokenizer",
    "check_ids",
    "lossy_report",
    "load_tokenizer",
    "load_run_tokenizer",
    "tokenizer_file",
    "check_run_tokenizer",
]

FORMAT = "minigpt-char-tokenizer"
KINDS = ("char", "bpe", "wordpiece", "unigram")

_MODEL_KINDS = {"BPE": "bpe", "WordPiece": "wordpiece", "Unigram": "unigram"}


def _attempt(call: Callable[[], object]) -> tuple[object, Optional[Exception]]:
    """``(call(), None)``, or ``(None, error)`` when the ``tokenizers`` library refuses with its own
    error (a plain ``Exception``); anything else is a bug and is raised."""
    try:
        return call(), None
    except Exception as exc:
        if type(exc) is not Exception:
            raise
        return None, exc


# ----------------------------------------------------------------------------- char


class CharTokenizer:
    """Character-level tokenizer: id i is the i-th character of a sorted alphabet, then the special
    tokens."""

    kind = "char"
    unk_token: Optional[str] = None  # encode refuses unknown characters instead

    def __init__(self, chars: Iterable[str], special_tokens: Iterable[str] = ()):
        self.chars = list(chars)
        self.special_tokens = list(
            special_tokens
        )  # checked where they came in: the config, a file, a flag
        assert (
            self.chars
            and all(len(c) == 1 for c in self.chars)
            and len(set(self.chars)) == len(self.chars)
        )
        self.itos = self.chars + self.special_tokens
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self._sorted = (
            None  # (code points sorted, their ids): encode_batch's table, made on first use
        )

    @classmethod
    def train(
        cls, text: str | Iterable[str], special_tokens: Iterable[str] = ()
    ) -> "CharTokenizer":
        """The sorted alphabet of ``text`` (a string, or pieces none cutting a special token),
        special tokens aside.

        Raises:
            MinigptError: the text is empty, or holds nothing but special tokens.
        """
        specials = list(special_tokens)
        chars: set[str] = set()
        empty = True
        for piece in [text] if isinstance(text, str) else text:
            empty = empty and not piece
            for part in split_special(piece, specials)[0::2]:
                chars.update(part)
        if not chars:
            raise MinigptError(
                "cannot train a tokenizer on an empty corpus"
                if empty
                else "the corpus holds nothing but special tokens; give it some text"
            )
        return cls(sorted(chars), specials)

    @property
    def vocab_size(self) -> int:
        """The alphabet's size plus the number of special tokens."""
        return len(self.itos)

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` outside the alphabet (``encode`` refuses them), once each, in
        order of appearance."""
        return missing_chars(text, self.special_tokens, self.stoi)

    unknown = unknown_chars  # the earlier name

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``, each special token one id; MinigptError names unknown
        characters."""
        stoi = self.stoi
        try:
            if not self.special_tokens:
                return [stoi[c] for c in text]
            ids: list[int] = []
            for i, part in enumerate(split_special(text, self.special_tokens)):
                if i % 2:
                    ids.append(stoi[part])
                else:
                    ids.extend(stoi[c] for c in part)
            return ids
        except KeyError:
            bad = ", ".join(repr(c) for c in self.unknown_chars(text))
            raise MinigptError(
                f"text has characters the tokenizer's vocabulary lacks: {bad}",
                "remove or replace them",
            ) from None

    def encode_batch(self, texts: Sequence[str]) -> list["np.ndarray"]:
        """The ids of each text, as :meth:`encode` gives them, in int64 arrays (vectorised over code
        points)."""
        import numpy as np

        if self._sorted is None:
            cps = np.array([ord(c) for c in self.chars], dtype=np.int64)
            order = np.argsort(cps)
            self._sorted = (cps[order], order)
        cps, order = self._sorted

        def plain(text: str) -> "np.ndarray":
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
            at = np.minimum(np.searchsorted(cps, codes), len(cps) - 1)
            if not np.array_equal(cps[at], codes):
                self.encode(text)  # raises, naming the characters
            return order[at]

        out = []
        for text in texts:
            if not self.special_tokens:
                out.append(plain(text))
                continue
            parts = split_special(text, self.special_tokens)
            out.append(
                np.concatenate(
                    [
                        plain(p) if i % 2 == 0 else np.array([self.stoi[p]], dtype=np.int64)
                        for i, p in enumerate(parts)
                    ]
                )
            )
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """The characters and special tokens of ``ids``, joined; MinigptError for an id outside [0,
        vocab_size)."""
        itos = self.itos
        return "".join([itos[i] for i in check_ids(ids, len(itos))])

    def pieces(self, text: str) -> list[str]:
        """The text of each token of ``text``."""
        return [self.itos[i] for i in self.encode(text)]

    def to_json(self) -> str:
        obj: dict = {"format": FORMAT, "kind": "char", "chars": self.chars}
        if self.special_tokens:  # absent when none, so older files keep their fingerprint
            obj["special_tokens"] = self.special_tokens
        return json.dumps(obj, ensure_ascii=False, indent=1)

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as JSON (atomically)."""
        atomic_write_text(path, self.to_json())

    def fingerprint(self) -> str:
        """Short sha256 of the saved form: names the prepared data it made."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()[:12]


# ----------------------------------------------------------------------------- library-backed kinds


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` of kind bpe, wordpiece or unigram; of kind hf (``kind="hf"``), any
    model.

    ``encode`` never fails for the trained kinds (bytes for BPE, ``<unk>`` for the others); an
    ``hf`` one without an unknown token refuses characters its vocabulary lacks, as char does.
    ``decode`` keeps special tokens.
    """

    def __init__(self, tok, kind: Optional[str] = None):
        from tokenizers import Tokenizer as _Backend

        # One trip through the JSON form: the library does not print floats
        # (Unigram scores) exactly, so a freshly trained tokenizer and the one
        # read back from its file would differ in the last bit, and in
        # fingerprint. After one trip the form is a fixed point.
        self._json = _Backend.from_str(tok.to_str()).to_str()
        self._tok = _Backend.from_str(self._json)
        obj = json.loads(self._json)
        model = obj.get("model") or {}
        mtype = model.get("type")
        assert mtype in _MODEL_KINDS or kind == "hf", (
            mtype
        )  # the trainers' models, or load_tokenizer's kind hf
        self.kind = kind or _MODEL_KINDS[mtype]
        unk = model.get("unk_token")
        if mtype == "Unigram" and model.get("unk_id") is not None:
            unk = model["vocab"][model["unk_id"]][0]
        if unk is not None and self._tok.token_to_id(unk) is None:
            unk = None  # WordLevel names "<unk>" even when its vocabulary lacks it: then nothing becomes it
        self.unk_token: Optional[str] = unk
        self.special_tokens = [
            a["content"]
            for a in obj.get("added_tokens") or []
            if a.get("special") and a["content"] != unk
        ]
        self._known: Optional[frozenset[str]] = None  # single-character pieces, on first use

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Entries in all: base alphabet, merges or pieces, special tokens, ``<unk>``."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (bpe: bytes; unigram, wordpiece: ``<unk>`` for unseen characters).

        Raises:
            MinigptError: text an ``hf`` tokenizer without an unknown token cannot encode, naming
            the characters.
        """
        encoded, error = _attempt(lambda: self._tok.encode(text, add_special_tokens=False))
        if error is not None:
            raise self._refusal(text, error)
        return encoded.ids

    def encode_batch(self, texts: Sequence[str]) -> list["np.ndarray"]:
        """The ids of each text, as :meth:`encode` gives them, in int64 arrays; the library encodes
        them in parallel (``TOKENIZERS_PARALLELISM=false`` turns that off).
        """
        import numpy as np

        encoded, error = _attempt(
            lambda: self._tok.encode_batch(list(texts), add_special_tokens=False)
        )
        if (
            error is not None
        ):  # one at a time: encode refuses the first text that fails, naming its characters
            return [np.asarray(self.encode(text), dtype=np.int64) for text in texts]
        return [np.asarray(e.ids, dtype=np.int64) for e in encoded]

    def _refusal(self, text: str, exc: Exception) -> MinigptError:
        """The error for ``text``, which the library failed to encode with ``exc``: the characters
        it cannot encode alone (:meth:`unknown_chars`), else the library's own words."""
        chars = self._unencodable(text)
        if chars:
            return MinigptError(
                "text has characters the tokenizer's vocabulary lacks: "
                + ", ".join(map(repr, chars)),
                "remove or replace them",
            )
        error = (str(exc).splitlines() or [type(exc).__name__])[0]
        return MinigptError(
            f"the tokenizer cannot encode the text ({error})",
            "remove or replace the text it fails on",
        )

    def _unencodable(self, text: str) -> list[str]:
        """Characters of ``text`` (outside its special tokens) the library fails to encode on their
        own, once each; one call per distinct character, so only once a whole text failed.
        """
        plain = "".join(split_special(text, self.special_tokens)[0::2])
        return [
            ch
            for ch in dict.fromkeys(plain)
            if _attempt(lambda: self._tok.encode(ch, add_special_tokens=False))[1] is not None
        ]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, special and unknown tokens kept as their text; MinigptError for an
        id out of range."""
        return self._tok.decode(check_ids(ids, self.vocab_size), skip_special_tokens=False)

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` that become ``<unk>`` (no single-character piece spells them),
        once each, in order; [] for bpe. An ``hf`` tokenizer without an unknown token: the
        characters :meth:`encode` refuses.
        """
        if self.unk_token is None:
            if self.kind != "hf":  # byte-level BPE: every text encodes
                return []
            failed = _attempt(lambda: self._tok.encode(text, add_special_tokens=False))[1]
            return self._unencodable(text) if failed else []
        if self._known is None:
            known = {t for t in self._tok.get_vocab(with_added_tokens=False) if len(t) == 1}
            self._known = frozenset(known | {" "} if SPACE_MARK in known else known)
        return missing_chars(text, [*self.special_tokens, self.unk_token], self._known)

    def pieces(self, text: str) -> list[str]:
        """The text of each token of ``text``; WordPiece continuations keep their ``##``."""
        ids = self.encode(text)
        if self.kind == "wordpiece":
            return [self._tok.id_to_token(i).replace(SPACE_MARK, " ") for i in ids]
        return [self.decode([i]) for i in ids]

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of the vocabulary entry ``token``, or None."""
        return self._tok.token_to_id(token)

    def save(self, path: str | Path) -> None:
        """Write the library's ``tokenizer.json`` (atomically)."""
        atomic_write_text(path, self._tok.to_str(pretty=True))

    def fingerprint(self) -> str:
        """Short sha256 of the serialized tokenizer: names the prepared data it made."""
        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()[:12]


def tokenizer_file(path: str | Path, own: bool = True) -> Path:
    """The file :func:`load_tokenizer` reads for ``path``: ``path`` itself, or for a folder the user
    names (``own`` False, a Hugging Face model folder) the ``tokenizer.json`` in it."""
    p = Path(path)
    return (
        p / "tokenizer.json" if not own and p.is_dir() and (p / "tokenizer.json").is_file() else p
    )


def load_tokenizer(
    path: str | Path,
    kind: Optional[str] = None,
    *,
    own: bool = True,
    fix: Optional[str | Callable[[], str]] = None,
) -> Tokenizer:
    """Load a tokenizer file: ours (char) or a ``tokenizers`` tokenizer.json (kind from
    ``model.type``, or ``kind="hf"``: any such file, as it is).

    ``own``: minigpt made the file (prepared data's, a run's), so a damaged one is trained again;
    False for a file the user names: any tokenizer.json is read, and a folder stands for its
    ``tokenizer.json``. ``fix``: the fix an error gives (a function: worked out only then).

    Raises:
        MinigptError: missing, unreadable or unrecognised file; a folder, or a path that is not a
        regular file.
    """
    p = tokenizer_file(path, own)
    found = _read(p, kind, own)
    if isinstance(found, tuple):
        problem, missing = found
        fix = fix() if callable(fix) else fix
        # One minigpt made (prepared data's, a run's) is trained again; one the user named is never
        # deleted, but replaced by one it reads.
        fix = fix or (
            "train one with minigpt train-tokenizer"
            if missing
            else "delete it and train it again"
            if own
            else "pass a tokenizer file: minigpt's char tokenizer or a tokenizers tokenizer.json "
            "(train-tokenizer writes both; a run folder and a Hugging Face model folder hold one)"
        )
        raise MinigptError(problem, fix, path=p)
    return found


def _read(p: Path, kind: Optional[str], own: bool) -> Tokenizer | tuple[str, bool]:
    """The tokenizer in file ``p``, or what is wrong with the file (one line, the fix to follow) and
    whether it is missing. Raises MinigptError (:func:`~minigpt_cli.fileio.read_problem`) for a file
    that cannot be read: unreadable (its permissions: never "delete it"), a dangling link, past
    :data:`~minigpt_cli.fileio.TOKENIZER_BOUNDS`."""
    what, named = "tokenizer file", f"tokenizer file {str(p)!r}"
    with errors_as({OSError: lambda exc: read_problem(exc, p, what)}):
        if p.is_dir():
            return (
                f"tokenizer path {str(p)!r} is a folder, not a tokenizer file, and holds no "
                "tokenizer.json",
                False,
            )
        check_regular(p)  # a FIFO, socket or device: read_problem names which
        if not p.exists() and not p.is_symlink():
            return f"{named} not found", True
    raw = read_text(p, what, TOKENIZER_BOUNDS)  # a dangling link: read_problem names it
    try:
        obj = parse_json(raw, p, what, TOKENIZER_BOUNDS)
    except MinigptError as exc:  # damaged, or nested past the bounds: the caller's fix follows
        return exc.what, False
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        chars, specials = obj.get("chars"), obj.get("special_tokens", [])
        if not (
            isinstance(chars, list)
            and chars
            and all(isinstance(c, str) and len(c) == 1 for c in chars)
            and len(set(chars)) == len(chars)
        ):
            return f"{named} is damaged (no list of distinct single characters in 'chars')", False
        problem = special_token_problem(specials) if isinstance(specials, list) else "not a list"
        if problem:
            return f"{named} is damaged ('special_tokens': {problem})", False
        return CharTokenizer(chars, specials)
    model = obj.get("model") if isinstance(obj, dict) else None
    if not (
        isinstance(model, dict) and (model.get("type") in _MODEL_KINDS or kind == "hf" or not own)
    ):
        return f"{named} is not a minigpt tokenizer", False
    from tokenizers import Tokenizer as _Backend

    as_hf = kind == "hf" or model.get("type") not in _MODEL_KINDS
    tok, error = _attempt(lambda: HFTokenizer(_Backend.from_str(raw), "hf" if as_hf else None))
    if error:
        return (
            f"{named} is damaged ({str(error).splitlines()[0] if str(error) else 'Exception'})",
            False,
        )
    return tok


# ----------------------------------------------------------------------------- run folders


def load_run_tokenizer(run_dir: Path, cfg: Config) -> Tokenizer:
    """A run folder's own ``tokenizer.json``; a missing or damaged one's error says where a copy of
    the file the run was trained with is (:func:`~.base.run_tokenizer_fix`).
    """
    return load_tokenizer(
        Path(run_dir) / "tokenizer.json",
        cfg.tokenizer.kind,
        fix=lambda: run_tokenizer_fix(run_dir, cfg),
    )


def check_run_tokenizer(run_dir: Path, cfg: Config, tok: Optional[Tokenizer]) -> None:
    """Refuse to resume run ``run_dir`` with another tokenizer ``tok`` (None: none named) than its
    ``tokenizer.json``.

    Raises:
        MinigptError: the fingerprints differ; a missing or damaged ``tokenizer.json``.
    """
    if tok is not None and load_run_tokenizer(run_dir, cfg).fingerprint() != tok.fingerprint():
        raise MinigptError(
            "--resume: the tokenizer file the config names differs from "
            f"{Path(run_dir) / 'tokenizer.json'}",
            "point tokenizer.path at the run's tokenizer.json",
        )
