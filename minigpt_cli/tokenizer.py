"""One Tokenizer interface over the four kinds the config names.

- ``char``: ours. One id per distinct character of the corpus, sorted by code
  point (nanoGPT's ``shakespeare_char``: 65 symbols on Tiny Shakespeare), then
  the special tokens, appended in the order given. Saved as our own JSON.
- ``bpe``: byte-level BPE (GPT-2) trained by the ``tokenizers`` library:
  ByteLevel pre-tokenizer (GPT-2's split regex, no prefix space) and decoder.
  The base vocabulary is the 256 bytes, so no text is ever unknown and
  decode(encode(s)) == s byte for byte.
- ``unigram``: the library's Unigram trainer (Kudo 2018) with an unknown token.
- ``wordpiece``: our trainer (below), which merges the pair with the highest
  score count(ab) / (count(a)·count(b)) as the course notes (§6.2) teach; the
  library's WordPiece trainer merges by frequency instead. The result is a
  library WordPiece model: greedy longest match with ``##`` continuations.

The three trained kinds are saved in the library's native ``tokenizer.json``
format, so ``tokenizers.Tokenizer.from_file`` loads them directly; that format
refuses extra top-level keys, so :func:`load_tokenizer` tells the kind from
``model.type``.

Unigram and WordPiece split words exactly as byte-level BPE does (GPT-2's
regex, every character kept), so the three compare on the same words, and
spell a space as ``▁`` (SentencePiece's Metaspace), undone on decode. Hence
decode(encode(s)) == s for any text made of characters seen in training,
with two documented exceptions: a literal ``▁`` (U+2581) in the input decodes
as a space, and a WordPiece "word" (a run between split points) longer than
:data:`WORDPIECE_MAX_WORD` characters is one unknown token. Characters never
seen in training become the unknown token ``<unk>`` (Unigram: that character;
WordPiece: the whole word holding it, as BERT does); the text around survives.

Special tokens (``<|endoftext|>``, ...) are single ids in every kind: they are
matched in the raw text before anything else, are never split or merged in
training, and decode to themselves. Near misses (``<|endof text|>``) are
ordinary text. Trained kinds put them first (ids 0..k-1, the unknown token
before them), as the library does; ``char`` appends them to its alphabet so
that its ids for plain characters do not move.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Optional, Protocol, Sequence

from .errors import MinigptError
from .fileio import atomic_write_text

if TYPE_CHECKING:
    from .config import Config

FORMAT = "minigpt-char-tokenizer"
KINDS = ("char", "bpe", "wordpiece", "unigram")
#: The unknown token of the Unigram and WordPiece kinds (byte-level BPE has none).
UNK = "<unk>"
#: WordPiece's mark for a piece that continues a word.
CONTINUATION = "##"
#: SentencePiece's visible space, used by the Unigram and WordPiece kinds.
SPACE_MARK = "\u2581"
#: GPT-2's pre-tokenization regex (what ByteLevel(use_regex=True) applies).
SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
#: Longest word WordPiece encodes; longer ones are one unknown token (BERT uses 100).
WORDPIECE_MAX_WORD = 1000
#: Largest vocabulary a trained tokenizer may ask for (2**20); far larger sizes
#: make the tokenizers library abort the process instead of raising.
MAX_VOCAB_SIZE = 1 << 20
#: Byte-level BPE's base alphabet: one entry per byte.
N_BYTES = 256

_MODEL_KINDS = {"BPE": "bpe", "WordPiece": "wordpiece", "Unigram": "unigram"}


class Tokenizer(Protocol):
    """What data preparation, training and generation need from a tokenizer."""

    kind: str
    #: Configured special tokens (``<|endoftext|>``, ...), each a single id; not the unknown token.
    special_tokens: list[str]

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def pieces(self, text: str) -> list[str]: ...

    def save(self, path: str | Path) -> None: ...

    def fingerprint(self) -> str: ...


def check_special_tokens(special_tokens: Iterable[str]) -> list[str]:
    """The special tokens as a list, checked: non-empty, no whitespace at the ends, distinct.

    Raises:
        MinigptError: an empty, padded or repeated entry, or the unknown token.
    """
    out: list[str] = []
    for s in special_tokens:
        if not isinstance(s, str) or not s or s != s.strip():
            raise MinigptError(f"special token {s!r} must be non-empty text without spaces at its ends")
        if s == UNK:
            raise MinigptError(f"special token {UNK!r} is the unknown token the tokenizer adds itself; drop it")
        if s in out:
            raise MinigptError(f"special token {s!r} is listed twice; list each once")
        out.append(s)
    return out


def split_special(text: str, special_tokens: Sequence[str]) -> list[str]:
    """``text`` cut around its special tokens: [text, special, text, special, ..., text].

    Odd positions hold special tokens (longest match first); even positions
    hold the ordinary text between them, possibly empty.
    """
    if not special_tokens:
        return [text]
    alternatives = "|".join(re.escape(s) for s in sorted(special_tokens, key=len, reverse=True))
    return re.split(f"({alternatives})", text)


# ----------------------------------------------------------------------------- char


class CharTokenizer:
    """Character-level tokenizer: id i is the i-th character of a sorted alphabet.

    Special tokens follow the alphabet (ids ``len(chars)``, ...) and are matched
    first when encoding, longest first.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str], special_tokens: Iterable[str] = ()):
        self.chars = list(chars)
        self.special_tokens = check_special_tokens(special_tokens)
        if not self.chars:
            raise MinigptError("a char tokenizer needs at least one character; is the corpus empty?")
        if len(set(self.chars)) != len(self.chars) or any(len(c) != 1 for c in self.chars):
            raise MinigptError("a char tokenizer's alphabet must be distinct single characters")
        self.itos = self.chars + self.special_tokens
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    @classmethod
    def train(cls, text: str, special_tokens: Iterable[str] = ()) -> "CharTokenizer":
        """The alphabet of ``text`` (outside its special tokens), sorted by code point.

        Raises:
            MinigptError: the text is empty, or holds nothing but special tokens.
        """
        specials = check_special_tokens(special_tokens)
        if not text:
            raise MinigptError("cannot train a char tokenizer on an empty corpus")
        plain = "".join(split_special(text, specials)[0::2])
        if not plain:
            raise MinigptError("the corpus holds nothing but special tokens; give it some text")
        return cls(sorted(set(plain)), specials)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def unknown(self, text: str) -> list[str]:
        """Characters of ``text`` outside the alphabet, each once, in order of appearance."""
        seen: dict[str, None] = {}
        for part in split_special(text, self.special_tokens)[0::2]:
            for ch in part:
                if ch not in self.stoi:
                    seen.setdefault(ch, None)
        return list(seen)

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
            bad = ", ".join(repr(c) for c in self.unknown(text))
            raise MinigptError(
                f"text has characters the tokenizer's vocabulary lacks: {bad}; "
                "remove or replace them"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.itos[int(i)] for i in ids)

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
    """A ``tokenizers.Tokenizer`` of kind bpe, wordpiece or unigram.

    ``encode`` never raises (bytes for BPE, ``<unk>`` for the others) and
    ``decode`` keeps special and unknown tokens in the text.
    """

    def __init__(self, tok):
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
        if mtype not in _MODEL_KINDS:
            raise MinigptError(f"a {mtype!r} tokenizer model is not one of BPE, WordPiece, Unigram")
        self.kind = _MODEL_KINDS[mtype]
        unk = model.get("unk_token")
        if mtype == "Unigram" and model.get("unk_id") is not None:
            unk = model["vocab"][model["unk_id"]][0]
        self.unk_token: Optional[str] = unk
        self.special_tokens = [a["content"] for a in obj.get("added_tokens") or []
                               if a.get("special") and a["content"] != unk]

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def pieces(self, text: str) -> list[str]:
        """The text of each token of ``text``; WordPiece continuations keep their ``##``."""
        ids = self.encode(text)
        if self.kind == "wordpiece":
            return [self._tok.id_to_token(i).replace(SPACE_MARK, " ") for i in ids]
        return [self.decode([i]) for i in ids]

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def save(self, path: str | Path) -> None:
        """Write the library's ``tokenizer.json`` (atomically)."""
        atomic_write_text(path, self._tok.to_str(pretty=True))

    def fingerprint(self) -> str:
        """Short sha256 of the serialized tokenizer: names the prepared data it made."""
        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()[:12]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer file: ours (char) or a ``tokenizers`` tokenizer.json (kind from ``model.type``).

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
    if isinstance(model, dict) and model.get("type") in _MODEL_KINDS:
        from tokenizers import Tokenizer as _Backend

        try:
            return HFTokenizer(_Backend.from_str(raw))
        except Exception as exc:  # the library raises plain Exception on bad files
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise MinigptError(f"tokenizer file {str(p)!r} is damaged ({first}); delete it and train it again") from None
    raise MinigptError(f"tokenizer file {str(p)!r} is not a minigpt tokenizer; delete it and train it again")


# ----------------------------------------------------------------------------- WordPiece training


def load_run_tokenizer(run_dir: Path, cfg: Config) -> Tokenizer:
    """A run folder's own ``tokenizer.json``, for ``generate`` and ``--resume``.

    A missing or damaged file is an error that says where the file the run
    was trained with came from (a retrained tokenizer is not the run's).

    Raises:
        MinigptError: the file is missing, unreadable or not a tokenizer.
    """
    from .paths import default_tokenizer_path

    try:
        return load_tokenizer(Path(run_dir) / "tokenizer.json")
    except MinigptError as exc:
        tc = cfg.tokenizer
        source = (Path(tc.path) if tc.path
                  else default_tokenizer_path(cfg.data.data_dir, cfg.data.dataset, tc.kind, tc.vocab_size,
                                              tc.special_tokens))
        problem = str(exc).split(";")[0]
        raise MinigptError(
            f"{problem}; a run keeps the tokenizer it was trained with: copy it back from {str(source)!r} "
            f"if that file was not retrained since"
        ) from None


def wordpiece_symbols(word: str) -> list[str]:
    """A word as WordPiece's starting symbols: ``hugs`` -> ``h ##u ##g ##s``."""
    return [word[0]] + [CONTINUATION + c for c in word[1:]]


def wordpiece_scores(word_counts: Mapping[str, int]) -> dict[tuple[str, str], float]:
    """Score count(ab) / (count(a)·count(b)) of every adjacent pair before any merge (notes §6.2)."""
    sym: Counter = Counter()
    pair: Counter = Counter()
    for w, f in word_counts.items():
        s = wordpiece_symbols(w)
        for x in s:
            sym[x] += f
        for p in zip(s, s[1:]):
            pair[p] += f
    return {p: c / (sym[p[0]] * sym[p[1]]) for p, c in pair.items()}


def wordpiece_merges(word_counts: Mapping[str, int]) -> Iterator[tuple[str, str, float, int]]:
    """Yield WordPiece merges in order: (a, b, score, count(ab)), best score first.

    Each step merges, in every word, the adjacent pair (a, b) with the highest
    score count(ab) / (count(a)·count(b)) (counts weighted by word frequency;
    ties: the more frequent pair, then the smaller strings). The new symbol is
    ``a + b`` without ``b``'s ``##``. Stops when no word has two symbols left.

    Pair and symbol counts are updated incrementally: a merge touches only the
    words that hold its pair, and re-scores only the pairs whose count or whose
    symbols' counts changed (a max-heap with stale entries skipped on pop).
    """
    words: list[list[str]] = []
    freqs: list[int] = []
    sym_count: Counter = Counter()
    pair_count: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    pairs_of: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for w, f in word_counts.items():
        if not w or f <= 0:
            continue
        s = wordpiece_symbols(w)
        wi = len(words)
        words.append(s)
        freqs.append(f)
        for x in s:
            sym_count[x] += f
        for p in zip(s, s[1:]):
            pair_count[p] += f
            where[p].add(wi)
            pairs_of[p[0]].add(p)
            pairs_of[p[1]].add(p)

    def key(p: tuple[str, str]) -> tuple[float, int, str, str]:
        c = pair_count[p]
        return (-c / (sym_count[p[0]] * sym_count[p[1]]), -c, p[0], p[1])

    heap = [key(p) for p in pair_count]
    heapq.heapify(heap)
    while heap:
        top = heapq.heappop(heap)
        p = (top[2], top[3])
        if pair_count.get(p, 0) <= 0 or key(p) != top:
            continue  # stale: a fresher entry for this pair is in the heap (or it is gone)
        a, b = p
        score, count = -top[0], -top[1]
        new = a + b[len(CONTINUATION):]
        pair_delta: Counter = Counter()
        sym_before = {s: sym_count[s] for s in (a, b, new)}
        for wi in where.pop(p):
            s = words[wi]
            if len(s) < 2:
                continue
            f = freqs[wi]
            merged: list[str] = []
            i, hit = 0, False
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    merged.append(new)
                    i += 2
                    hit = True
                else:
                    merged.append(s[i])
                    i += 1
            if not hit:
                continue  # the word lost this pair to an earlier merge
            for q in zip(s, s[1:]):
                pair_delta[q] -= f
            for q in zip(merged, merged[1:]):
                pair_delta[q] += f
                where[q].add(wi)
            n_merged = len(s) - len(merged)
            sym_count[a] -= f * n_merged
            sym_count[b] -= f * n_merged
            sym_count[new] += f * n_merged
            words[wi] = merged
        touched: set[tuple[str, str]] = set()
        for q, d in pair_delta.items():
            if d:
                pair_count[q] += d
                if pair_count[q] <= 0:
                    del pair_count[q]
                else:
                    pairs_of[q[0]].add(q)
                    pairs_of[q[1]].add(q)
                touched.add(q)
        pair_count.pop(p, None)
        for s_, before in sym_before.items():
            if sym_count[s_] != before:
                live = {q for q in pairs_of[s_] if pair_count.get(q, 0) > 0}
                pairs_of[s_] = live
                touched |= live
        for q in touched:
            if pair_count.get(q, 0) > 0:
                heapq.heappush(heap, key(q))
        if len(heap) > 4 * len(pair_count) + 10_000:  # drop stale entries now and then
            heap = [key(q) for q in pair_count]
            heapq.heapify(heap)
        yield a, b, score, count


# ----------------------------------------------------------------------------- training


def _word_pre_tokenizer():
    """GPT-2's split (every character kept), then spaces shown as ``▁``: Unigram and WordPiece."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="never", split=False),
    ])


def _space_decoder():
    from tokenizers import decoders

    return decoders.Metaspace(replacement=SPACE_MARK, prepend_scheme="never", split=False)


def _plain_chars(chunks: Sequence[str]) -> set[str]:
    """Distinct characters of the ordinary text, spaces spelled ``▁``."""
    chars: set[str] = set()
    for c in chunks:
        chars.update(c)
    if " " in chars:
        chars.discard(" ")
        chars.add(SPACE_MARK)
    return chars


def base_vocab_size(kind: str, text: str, special_tokens: Sequence[str] = ()) -> int:
    """The smallest vocabulary ``kind`` can have on ``text``: its base alphabet plus special tokens.

    char: the distinct characters; bpe: the 256 bytes; unigram: the distinct
    characters and ``<unk>``; wordpiece: each character both word-initial and
    as a ``##`` continuation (so any word of seen characters can be spelled),
    and ``<unk>``.
    """
    specials = check_special_tokens(special_tokens)
    if kind == "bpe":
        return N_BYTES + len(specials)
    chars = _plain_chars(split_special(text, specials)[0::2])
    if kind == "char":
        return len(chars) + len(specials)
    if kind == "unigram":
        return len(chars) + 1 + len(specials)
    if kind == "wordpiece":
        return 2 * len(chars) + 1 + len(specials)
    raise MinigptError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(KINDS)}")


def check_vocab_size(kind: str, text: str, vocab_size: Optional[int], special_tokens: Sequence[str] = ()) -> None:
    """Refuse a missing vocabulary size, one below ``kind``'s base alphabet, or one above :data:`MAX_VOCAB_SIZE`, before training.

    Raises:
        MinigptError: naming the smallest (or largest) size that works.
    """
    if kind == "char":
        return
    if vocab_size is None:
        raise MinigptError(f"a {kind} tokenizer needs a vocabulary size; pass --vocab-size N or set tokenizer.vocab_size")
    if vocab_size > MAX_VOCAB_SIZE:
        raise MinigptError(
            f"vocabulary size {vocab_size:,} is above the largest supported, {MAX_VOCAB_SIZE:,}; "
            f"use a vocabulary size of at most {MAX_VOCAB_SIZE:,} (a few thousand suits Tiny Shakespeare)"
        )
    least = base_vocab_size(kind, text, special_tokens)
    if vocab_size < least:
        what = {"bpe": "256 bytes", "unigram": "the corpus's characters and <unk>",
                "wordpiece": "the corpus's characters, initial and ##, and <unk>"}[kind]
        extra = f" and {len(special_tokens)} special tokens" if special_tokens else ""
        raise MinigptError(
            f"vocabulary size {vocab_size} is below the {kind} base alphabet of {least} "
            f"({what}{extra}); use a vocabulary size of at least {least}"
        )


def _too_big(kind: str, got: int, wanted: int) -> MinigptError:
    if kind == "unigram":  # the library's trainer stops short by amounts that vary with the size asked
        return MinigptError(
            f"the unigram trainer gave {got:,} vocabulary entries, fewer than the {wanted:,} asked for (near "
            f"what the corpus can give it stops short); use a smaller vocabulary size, e.g. {got:,}, or more text"
        )
    return MinigptError(
        f"the corpus gives at most {got:,} {kind} vocabulary entries, fewer than the {wanted:,} asked for; "
        f"use a vocabulary size of at most {got:,} or more text"
    )


def _train_interruptibly(tok, pieces: Iterator[str], trainer) -> None:
    """``tok.train_from_iterator(pieces, trainer)`` in a worker thread, so that Ctrl-C and SIGTERM work.

    The library's training runs in Rust without the GIL, but Python delivers a
    signal to the main thread only between bytecodes: a main thread inside the
    call would hold a Ctrl-C until training ended (minutes on a big corpus).
    Here it waits in short joins instead; on an interruption the exception
    propagates and the daemon thread ends with the process.
    """
    import threading

    failure: list[BaseException] = []

    def work() -> None:
        try:
            tok.train_from_iterator(pieces, trainer)
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="tokenizer-training", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if failure:
        raise failure[0]


#: Text goes to the library's trainers in pieces of about this many characters: one 100 MB string
#: made it hold ~22 GB at once; pieces keep its memory near the counts it needs.
PIECE_CHARS = 1 << 20
_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")


def _pieces(chunks: Iterable[str], size: int = PIECE_CHARS) -> Iterator[str]:
    """``chunks`` cut into pieces of about ``size`` characters, only where GPT-2's split cuts anyway.

    The cuts fall after a single newline between two non-spaces, or before a
    single space between two non-spaces; GPT-2's pre-tokenizer (``SPLIT_PATTERN``,
    used by every trained kind) splits there too, so the words the trainers
    count are the same as from the whole text. A stretch with no such place
    stays whole.
    """
    for chunk in chunks:
        start = 0
        while len(chunk) - start > size:
            cut = _CUT.search(chunk, start + size)
            if cut is None:
                break
            yield chunk[start:cut.start()]
            start = cut.start()
        yield chunk[start:]


def _train_bpe(chunks: list[str], vocab_size: int, specials: list[str]) -> HFTokenizer:
    from tokenizers import Tokenizer as _Backend, decoders, models, pre_tokenizers, trainers

    tok = _Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    _train_interruptibly(tok, _pieces(chunks), trainer)
    return HFTokenizer(tok)


def _train_unigram(chunks: list[str], vocab_size: int, specials: list[str]) -> HFTokenizer:
    from tokenizers import Tokenizer as _Backend, models, trainers

    tok = _Backend(models.Unigram())
    tok.pre_tokenizer = _word_pre_tokenizer()
    tok.decoder = _space_decoder()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token=UNK, special_tokens=[UNK, *specials],
                                      show_progress=False)
    _train_interruptibly(tok, _pieces(chunks), trainer)
    return HFTokenizer(_trim_unigram(tok, vocab_size))


def _trim_unigram(tok, vocab_size: int):
    """Drop the least likely multi-character pieces beyond ``vocab_size``.

    Near its base alphabet the library's trainer keeps every character on top
    of the pieces it chose, overshooting the size asked for (66 asked, 73
    given on Tiny Shakespeare). Single characters and special tokens stay, so
    every seen character can still be encoded.
    """
    from tokenizers import Tokenizer as _Backend

    extra = tok.get_vocab_size(with_added_tokens=True) - vocab_size
    if extra <= 0:
        return tok
    obj = json.loads(tok.to_str())
    vocab = obj["model"]["vocab"]
    keep_ids = {a["id"] for a in obj.get("added_tokens") or []}
    droppable = sorted((score, i) for i, (piece, score) in enumerate(vocab)
                       if i not in keep_ids and len(piece) > 1)
    drop = {i for _, i in droppable[:extra]}
    if any(i < max(keep_ids, default=-1) for i in drop):
        return tok  # would renumber a special token; keep the larger vocabulary
    obj["model"]["vocab"] = [v for i, v in enumerate(vocab) if i not in drop]
    return _Backend.from_str(json.dumps(obj, ensure_ascii=False))


def _train_wordpiece(chunks: list[str], vocab_size: int, specials: list[str]) -> HFTokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer as _Backend, decoders, models

    pre = _word_pre_tokenizer()
    counts: Counter = Counter()
    for chunk in chunks:
        counts.update(w for w, _ in pre.pre_tokenize_str(chunk))
    chars = sorted(_plain_chars(chunks))
    vocab: dict[str, int] = {}
    for s in [UNK, *specials, *chars, *(CONTINUATION + c for c in chars)]:
        vocab.setdefault(s, len(vocab))
    if vocab_size > 8192:
        # Every merged symbol is a word's prefix or an inner substring: a ceiling
        # (0.5 s to count), so an impossible size fails at once rather than
        # after minutes of merges.
        ceiling = len(vocab) + len(
            {w[:j] for w in counts for j in range(2, len(w) + 1)}
            | {CONTINUATION + w[i:j] for w in counts for i in range(1, len(w)) for j in range(i + 2, len(w) + 1)})
        if vocab_size > ceiling:
            raise _too_big("wordpiece", ceiling, vocab_size)
    if len(vocab) < vocab_size:
        for a, b, _, _ in wordpiece_merges(counts):
            vocab.setdefault(a + b[len(CONTINUATION):], len(vocab))
            if len(vocab) >= vocab_size:
                break
    tok = _Backend(models.WordPiece(vocab=vocab, unk_token=UNK, continuing_subword_prefix=CONTINUATION,
                                    max_input_chars_per_word=WORDPIECE_MAX_WORD))
    tok.pre_tokenizer = pre
    # Drop the ## of continuations and turn ▁ back into spaces; nothing else is
    # added between tokens (the library's WordPiece decoder would add spaces).
    tok.decoder = decoders.Sequence([decoders.Replace(Regex(f"^{re.escape(CONTINUATION)}"), ""), _space_decoder()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in [UNK, *specials]])
    return HFTokenizer(tok)


def train_tokenizer(kind: str, text: str, vocab_size: Optional[int] = None,
                    special_tokens: Iterable[str] = ()) -> Tokenizer:
    """Train a tokenizer of ``kind`` on ``text``.

    Args:
        kind: char, bpe, wordpiece or unigram.
        text: the corpus.
        vocab_size: entries in all (base alphabet, merges or pieces, special
            tokens, ``<unk>``); ignored for char, whose alphabet decides.
        special_tokens: texts that become single ids; their occurrences in
            ``text`` are cut out before training.

    Raises:
        MinigptError: unknown kind, empty corpus, a vocabulary size missing,
            below the kind's base alphabet, or above what the corpus can give.
    """
    if kind not in KINDS:
        raise MinigptError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(KINDS)}")
    specials = check_special_tokens(special_tokens)
    if not text:
        raise MinigptError(f"cannot train a {kind} tokenizer on an empty corpus")
    if kind == "char":
        return CharTokenizer.train(text, specials)
    check_vocab_size(kind, text, vocab_size, specials)
    chunks = [c for c in split_special(text, specials)[0::2] if c]
    if not chunks:
        raise MinigptError("the corpus holds nothing but special tokens; give it some text")
    trainer = {"bpe": _train_bpe, "unigram": _train_unigram, "wordpiece": _train_wordpiece}[kind]
    try:
        tok = trainer(chunks, vocab_size, specials)
    except MinigptError:
        raise
    except Exception as exc:  # the library's own refusals (plain Exception)
        raise MinigptError(f"training the {kind} tokenizer failed: {str(exc).splitlines()[0]}") from None
    if tok.vocab_size < vocab_size:
        raise _too_big(kind, tok.vocab_size, vocab_size)
    return tok
