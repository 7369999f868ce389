"""One Tokenizer interface over the five kinds the config names.

- ``char``: ours. One id per distinct character of the corpus, sorted by code
  point (nanoGPT's ``shakespeare_char``: 65 symbols on Tiny Shakespeare), then
  the special tokens, appended in the order given. Saved as our own JSON.
- ``bpe``: byte-level BPE (GPT-2). The base vocabulary is the 256 bytes, so no
  text is ever unknown and decode(encode(s)) == s byte for byte.
- ``unigram``: Unigram (Kudo 2018) with an unknown token.
- ``wordpiece``: WordPiece with merges chosen by score count(ab) /
  (count(a)·count(b)) (:mod:`.wordpiece`); encoding is greedy longest match
  with ``##`` continuations.
- ``hf``: any ``tokenizer.json`` of a Hugging Face model folder (GPT-2's,
  Llama's, ...), used as the library reads it; never trained here.

Training lives in :mod:`.tokenizer_training`. The three trained kinds are
saved in the ``tokenizers`` library's native ``tokenizer.json`` format, so
``tokenizers.Tokenizer.from_file`` loads them directly; that format refuses
extra top-level keys, so :func:`load_tokenizer` tells the kind from
``model.type``.

Unigram and WordPiece split words exactly as byte-level BPE does (GPT-2's
regex, every character kept), so the three compare on the same words, and
spell a space as ``▁`` (SentencePiece's Metaspace), undone on decode. Hence
decode(encode(s)) == s for any text made of characters seen in training,
with two documented exceptions: a literal ``▁`` (U+2581) in the input decodes
as a space, and a WordPiece "word" (a run between split points) longer than
``WORDPIECE_MAX_WORD`` characters is one unknown token. Characters never seen
in training become the unknown token ``<unk>`` (Unigram: that character, a run
of them one ``<unk>``; WordPiece: the whole word holding it, as BERT does); the
text around survives. :meth:`Tokenizer.unknown_chars` and :func:`lossy_report`
say which characters those are.

Special tokens (``<|endoftext|>``, ...) are single ids in every kind: they are
matched in the raw text before anything else, are never split or merged in
training, and decode to themselves. Near misses (``<|endof text|>``) are
ordinary text. Trained kinds put them first (ids 0..k-1, the unknown token
before them), as the library does; ``char`` appends them to its alphabet so
that its ids for plain characters do not move.

Every ``decode`` refuses an id outside [0, vocab_size) (:func:`check_ids`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Container, Iterable, Optional, Protocol, Sequence

from .errors import MinigptError
from .fileio import atomic_write_text
from .special_tokens import UNK, check_special_tokens, split_special

if TYPE_CHECKING:
    import numpy as np

    from .config import Config

__all__ = ["FORMAT", "KINDS", "UNK", "SPACE_MARK", "Tokenizer", "CharTokenizer", "HFTokenizer", "check_ids",
           "lossy_report", "load_tokenizer", "load_run_tokenizer"]

FORMAT = "minigpt-char-tokenizer"
KINDS = ("char", "bpe", "wordpiece", "unigram")
#: SentencePiece's visible space, used by the Unigram and WordPiece kinds.
SPACE_MARK = "\u2581"
#: At most this many characters are named by :func:`lossy_report`.
MAX_SHOWN = 10

_MODEL_KINDS = {"BPE": "bpe", "WordPiece": "wordpiece", "Unigram": "unigram"}


class Tokenizer(Protocol):
    """What data preparation, training and generation need from a tokenizer."""

    #: One of :data:`KINDS`.
    kind: str
    #: Configured special tokens (``<|endoftext|>``, ...), each a single id; not the unknown token.
    special_tokens: list[str]
    #: The token unknown characters become (``<unk>``), or None: char refuses them, bpe has none.
    unk_token: Optional[str]

    @property
    def vocab_size(self) -> int:
        """Number of ids: every id is in [0, vocab_size)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, one per token; special tokens are single ids."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list["np.ndarray"]:
        """The ids of each of ``texts`` (as :meth:`encode`), as int64 arrays; faster than one call each."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; raises MinigptError for an id outside [0, vocab_size)."""
        ...

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` its vocabulary lacks (lost to ``unk_token``), once each, in order."""
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
    """``ids`` as a list of ints, each checked to be a token id: 0 <= id < ``vocab_size``.

    One min and one max over the list, so decoding a stream token by token
    stays cheap.

    Raises:
        MinigptError: naming the first id outside the vocabulary, and its size.
    """
    ids = list(ids)
    if any(isinstance(i, (bool, float)) for i in ids):  # int(1.7) would silently decode id 1
        bad = next(i for i in ids if isinstance(i, (bool, float)))
        raise MinigptError(f"token id {bad!r} is not an integer; decode integer ids (the ids encode gives)")
    out = list(map(int, ids))
    if out and (min(out) < 0 or max(out) >= vocab_size):
        bad = next(i for i in out if not 0 <= i < vocab_size)
        raise MinigptError(
            f"token id {bad:,} is not in the tokenizer's vocabulary of {vocab_size:,} ids "
            f"(0 to {vocab_size - 1:,}); decode ids with the tokenizer that made them"
        )
    return out


#: The parts of :func:`lossy_report`'s note: text of a prompt the model will not see as it was typed.
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
    """A one-line note naming the text of ``text`` the model will not see as typed, or None.

    For the kinds with an unknown token (Unigram, WordPiece): the characters
    ``tok.encode`` turns into ``<unk>`` (e.g. ``note: 3 characters of the
    prompt became <unk>: '¿', 'é', '😀'``), a literal ``▁`` (it decodes as a
    space), a literal ``<unk>`` (one id, the unknown token, not five
    characters), and any other text for which decode(encode(text)) != text (a
    WordPiece word over its longest, one ``<unk>``). The parts are joined
    with ``; `` after ``note: ``; ``what`` names the text. At most
    :data:`MAX_SHOWN` characters are named. None when nothing is lost, and for
    kinds without an unknown token (bpe keeps every byte; char refuses
    unknown characters in ``encode``, :func:`~minigpt_cli.sampling.encode_prompt`).
    """
    unk = tok.unk_token
    if unk is None:
        return None
    parts = []
    chars = tok.unknown_chars(text)
    if chars:
        shown = ", ".join(repr(c) for c in chars[:MAX_SHOWN]) + (", ..." if len(chars) > MAX_SHOWN else "")
        n = f"{len(chars)} character{'s' if len(chars) > 1 else ''}"
        # WordPiece: the whole word holding such a character becomes <unk>
        parts.append(_LOSSY["unknown_words" if tok.kind == "wordpiece" else "unknown"].format(
            n=n, what=what, unk=unk, shown=shown))
    plain = "".join(split_special(text, tok.special_tokens)[0::2])  # special tokens are one id by design
    if SPACE_MARK in plain:
        parts.append(_LOSSY["space_mark"].format(what=what, mark=SPACE_MARK, kind=tok.kind))
    if unk in plain:
        parts.append(_LOSSY["unk_text"].format(what=what, unk=unk, length=len(unk)))
    if not parts:
        back = tok.decode(tok.encode(text))
        if back != text:
            parts.append(_LOSSY["other"].format(what=what, back=_clip(repr(back))))
    return "note: " + "; ".join(parts) if parts else None


def _missing(text: str, special_tokens: list[str], known: Container[str]) -> list[str]:
    """Characters of ``text`` outside its special tokens that are not in ``known``, once each, in order."""
    seen: dict[str, None] = {}
    for part in split_special(text, special_tokens)[0::2]:
        for ch in part:
            if ch not in known:
                seen.setdefault(ch, None)
    return list(seen)


# ----------------------------------------------------------------------------- char


class CharTokenizer:
    """Character-level tokenizer: id i is the i-th character of a sorted alphabet.

    Special tokens follow the alphabet (ids ``len(chars)``, ...) and are matched
    first when encoding, longest first.
    """

    kind = "char"
    unk_token: Optional[str] = None  # encode refuses unknown characters instead

    def __init__(self, chars: Iterable[str], special_tokens: Iterable[str] = ()):
        self.chars = list(chars)
        self.special_tokens = check_special_tokens(special_tokens)
        if not self.chars:
            raise MinigptError("a char tokenizer needs at least one character; is the corpus empty?")
        if len(set(self.chars)) != len(self.chars) or any(len(c) != 1 for c in self.chars):
            raise MinigptError("a char tokenizer's alphabet must be distinct single characters")
        self.itos = self.chars + self.special_tokens
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self._sorted = None  # (code points sorted, their ids): encode_batch's table, made on first use

    @classmethod
    def train(cls, text: str | Iterable[str], special_tokens: Iterable[str] = ()) -> "CharTokenizer":
        """The alphabet of ``text`` (outside its special tokens), sorted by code point.

        ``text``: a string, or an iterable of pieces (a corpus read in a stream) none of which cuts a
        special token in two.

        Raises:
            MinigptError: the text is empty, or holds nothing but special tokens.
        """
        specials = check_special_tokens(special_tokens)
        chars: set[str] = set()
        empty = True
        for piece in [text] if isinstance(text, str) else text:
            empty = empty and not piece
            for part in split_special(piece, specials)[0::2]:
                chars.update(part)
        if empty:
            raise MinigptError("cannot train a char tokenizer on an empty corpus")
        if not chars:
            raise MinigptError("the corpus holds nothing but special tokens; give it some text")
        return cls(sorted(chars), specials)

    @property
    def vocab_size(self) -> int:
        """The alphabet's size plus the number of special tokens."""
        return len(self.itos)

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` outside the alphabet (``encode`` refuses them), once each, in order of appearance."""
        return _missing(text, self.special_tokens, self.stoi)

    unknown = unknown_chars  # the earlier name

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``, each special token one id.

        Raises:
            MinigptError: naming each character the alphabet lacks, once.
        """
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
                f"text has characters the tokenizer's vocabulary lacks: {bad}; "
                "remove or replace them"
            ) from None

    def encode_batch(self, texts: Sequence[str]) -> list["np.ndarray"]:
        """The ids of each text, as :meth:`encode` gives them, in int64 arrays (vectorised over code points).

        Raises:
            MinigptError: as :meth:`encode`, naming each character the alphabet lacks.
        """
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
            out.append(np.concatenate([plain(p) if i % 2 == 0 else np.array([self.stoi[p]], dtype=np.int64)
                                       for i, p in enumerate(parts)]))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """The characters and special tokens of ``ids``, joined.

        Raises:
            MinigptError: an id outside [0, vocab_size).
        """
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
    """A ``tokenizers.Tokenizer`` of kind bpe, wordpiece or unigram; of kind hf (``kind="hf"``), any model.

    ``encode`` never raises (bytes for BPE, ``<unk>`` for the others) and
    ``decode`` keeps special and unknown tokens in the text.
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
        if mtype not in _MODEL_KINDS and kind != "hf":
            raise MinigptError(f"a {mtype!r} tokenizer model is not one of BPE, WordPiece, Unigram")
        self.kind = kind or _MODEL_KINDS[mtype]
        unk = model.get("unk_token")
        if mtype == "Unigram" and model.get("unk_id") is not None:
            unk = model["vocab"][model["unk_id"]][0]
        self.unk_token: Optional[str] = unk
        self.special_tokens = [a["content"] for a in obj.get("added_tokens") or []
                               if a.get("special") and a["content"] != unk]
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
        """Ids of ``text``; never raises (bpe: bytes; unigram, wordpiece: ``<unk>`` for unseen characters)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list["np.ndarray"]:
        """The ids of each text, as :meth:`encode` gives them, in int64 arrays; the library encodes the
        texts in parallel on every core (Rayon; ``TOKENIZERS_PARALLELISM=false`` turns that off)."""
        import numpy as np

        return [np.asarray(e.ids, dtype=np.int64)
                for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, special and unknown tokens kept as their text.

        Raises:
            MinigptError: an id outside [0, vocab_size).
        """
        return self._tok.decode(check_ids(ids, self.vocab_size), skip_special_tokens=False)

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` that become ``<unk>``, once each, in order of appearance; [] for bpe.

        A character is unknown when no single-character piece spells it (a
        space: ``▁``). Unigram turns each run of them into one ``<unk>``;
        WordPiece the whole word holding one.
        """
        if self.unk_token is None:
            return []
        if self._known is None:
            known = {t for t in self._tok.get_vocab(with_added_tokens=False) if len(t) == 1}
            self._known = frozenset(known | {" "} if SPACE_MARK in known else known)
        return _missing(text, [*self.special_tokens, self.unk_token], self._known)

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


def load_tokenizer(path: str | Path, kind: Optional[str] = None) -> Tokenizer:
    """Load a tokenizer file: ours (char) or a ``tokenizers`` tokenizer.json (kind from ``model.type``, or
    ``kind="hf"``: any such file, as it is).

    Raises:
        MinigptError: missing, unreadable or unrecognised file.
    """
    p = Path(path)
    if not p.is_file():
        raise MinigptError(f"tokenizer file {str(p)!r} not found; train one with minigpt train-tokenizer")
    try:
        raw = p.read_text(encoding="utf-8")
        obj = json.loads(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MinigptError(f"tokenizer file {str(p)!r} is not valid JSON ({exc}); delete it and train it again") from None
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        chars = obj.get("chars")
        specials = obj.get("special_tokens", [])
        if not isinstance(chars, list) or not all(isinstance(c, str) for c in chars):
            raise MinigptError(f"tokenizer file {str(p)!r} is damaged (no 'chars' list); delete it and train it again")
        if not isinstance(specials, list):
            raise MinigptError(f"tokenizer file {str(p)!r} is damaged ('special_tokens' is not a list); "
                               "delete it and train it again")
        return CharTokenizer(chars, specials)
    model = obj.get("model") if isinstance(obj, dict) else None
    if isinstance(model, dict) and (model.get("type") in _MODEL_KINDS or kind == "hf"):
        from tokenizers import Tokenizer as _Backend

        try:
            return HFTokenizer(_Backend.from_str(raw), "hf" if kind == "hf" else None)
        except Exception as exc:  # the library raises plain Exception on bad files
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise MinigptError(f"tokenizer file {str(p)!r} is damaged ({first}); delete it and train it again") from None
    raise MinigptError(f"tokenizer file {str(p)!r} is not a minigpt tokenizer; delete it and train it again")


# ----------------------------------------------------------------------------- run folders


def load_run_tokenizer(run_dir: Path, cfg: Config) -> Tokenizer:
    """A run folder's own ``tokenizer.json``, for ``generate`` and ``--resume``.

    A missing or damaged file is an error that says where the file the run
    was trained with came from (a retrained tokenizer is not the run's).

    Raises:
        MinigptError: the file is missing, unreadable or not a tokenizer.
    """
    from .paths import default_tokenizer_path

    try:
        return load_tokenizer(Path(run_dir) / "tokenizer.json", cfg.tokenizer.kind)
    except MinigptError as exc:
        tc = cfg.tokenizer
        source = (Path(tc.path) if tc.path
                  else default_tokenizer_path(cfg.data.data_dir, cfg.data.dataset, tc.kind, tc.vocab_size, tc.special_tokens))
        if cfg.model.init_from and source.absolute() == (Path(run_dir) / "tokenizer.json").absolute():
            source = Path(cfg.model.init_from) / "tokenizer.json"  # a resumed fine-tuning run names its own
        problem = str(exc).split(";")[0]
        raise MinigptError(
            f"{problem}; a run keeps the tokenizer it was trained with: copy it back from {str(source)!r} "
            f"if that file was not retrained since"
        ) from None
