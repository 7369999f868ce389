"""Training the three library-backed kinds (bpe, unigram, wordpiece), and the size checks before it.

bpe: the ``tokenizers`` library's byte-level BPE (GPT-2; Radford et al. 2019 §2.2); unigram: its
Unigram trainer (Kudo 2018) with ``<unk>``, trimmed to the size asked (:func:`_trim_unigram`);
wordpiece: our merges (:mod:`.wordpiece`) in a library WordPiece model. Unigram and WordPiece split
words as GPT-2 does and spell a space ``▁``. The library trains in a process of its own so that
Ctrl-C stops it at once.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

from ..config.schema import MAX_VOCAB as MAX_VOCAB_SIZE  # far larger: the tokenizers library aborts
from ..config.special_tokens import UNK, check_special_tokens, split_special
from ..errors import MinigptError
from .kinds import KINDS, SPACE_MARK, CharTokenizer, HFTokenizer, Tokenizer, _attempt
from .wordpiece import CONTINUATION, wordpiece_merges

#: GPT-2's pre-tokenization regex (what ByteLevel(use_regex=True) applies).
SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
#: Longest word WordPiece encodes; longer ones are one unknown token (BERT uses 100).
WORDPIECE_MAX_WORD = 1000
#: Byte-level BPE's base alphabet: one entry per byte.
N_BYTES = 256


def _word_pre_tokenizer():
    """GPT-2's split (every character kept), then spaces shown as ``▁``: Unigram and WordPiece."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="never", split=False),
        ]
    )


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
    """The smallest vocabulary ``kind`` can have on ``text``: char its characters, bpe the 256
    bytes, unigram the characters and ``<unk>``, wordpiece each character initial and as ``##``, and
    ``<unk>``; plus special tokens.
    """
    specials = list(special_tokens)
    if kind == "bpe":
        return N_BYTES + len(specials)
    chars = _plain_chars(split_special(text, specials)[0::2])
    if kind == "char":
        return len(chars) + len(specials)
    if kind == "unigram":
        return len(chars) + 1 + len(specials)
    assert kind == "wordpiece", (
        kind
    )  # the config (a Literal) and train-tokenizer's --kind are checked
    return 2 * len(chars) + 1 + len(specials)


def check_vocab_size(
    kind: str, text: str, vocab_size: Optional[int], special_tokens: Sequence[str] = ()
) -> None:
    """Refuse a missing vocabulary size, one below ``kind``'s base alphabet or one above the
    largest, before training.

    Raises:
        MinigptError: naming the smallest (or largest) size that works.
    """
    if kind == "char":
        return
    too_big = vocab_size is not None and vocab_size > MAX_VOCAB_SIZE
    least = (
        base_vocab_size(kind, text, special_tokens) if vocab_size is not None and not too_big else 0
    )
    if vocab_size is None:
        raise MinigptError(
            f"a {kind} tokenizer needs a vocabulary size",
            "pass --vocab-size N or set tokenizer.vocab_size",
        )
    if too_big:
        raise MinigptError(
            f"vocabulary size {vocab_size:,} is above the largest supported, {MAX_VOCAB_SIZE:,}",
            f"use a vocabulary size of at most {MAX_VOCAB_SIZE:,} (a few thousand suits Tiny "
            "Shakespeare)",
        )
    if vocab_size < least:
        what = {
            "bpe": "256 bytes",
            "unigram": "the corpus's characters and <unk>",
            "wordpiece": "the corpus's characters, initial and ##, and <unk>",
        }[kind]
        extra = f" and {len(special_tokens)} special tokens" if special_tokens else ""
        raise MinigptError(
            f"vocabulary size {vocab_size} is below the {kind} base alphabet of {least} "
            f"({what}{extra})",
            f"use a vocabulary size of at least {least}",
        )


def _too_big(kind: str, got: int, wanted: int) -> MinigptError:
    # the unigram trainer stops short of what the corpus can give by amounts that vary with the size
    # asked
    if kind == "unigram":
        return MinigptError(
            f"the unigram trainer gave {got:,} vocabulary entries, fewer than the {wanted:,} asked "
            "for (near what the corpus can give it stops short)",
            f"use a smaller vocabulary size, e.g. {got:,}, or more text",
        )
    return MinigptError(
        f"the corpus gives at most {got:,} {kind} vocabulary entries, fewer than the {wanted:,} "
        "asked for",
        f"use a vocabulary size of at most {got:,} or more text",
    )


def _train_interruptibly(tok, pieces: Iterator[str], trainer):
    """``tok`` trained by ``tok.train_from_iterator(pieces, trainer)`` in a process of its own
    (:mod:`.library_worker`), which a Ctrl-C or SIGTERM here kills: a call into the library cannot
    be stopped, only abandoned (a thread would run on, with its CPU and memory, until the library
    returned), and a loop that holds the GIL would hold back this process's signals too. The worker
    has a session of its own (a terminal's Ctrl-C reaches this process alone, which stops within a
    second, exit 130, nothing written).

    Raises:
        Exception: the library's refusal (a plain Exception, as the library raises it in-process).
    """
    import os
    import pickle
    import subprocess
    import sys

    from tokenizers import Tokenizer as _Backend

    worker = Path(__file__).with_name("library_worker.py")
    # -c and not the script alone: the current folder and the script's own stay off sys.path.
    start = (
        "import runpy, sys; sys.path.pop(0); sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", start, str(worker), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        try:
            pickle.dump((tok, trainer, list(pieces)), proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        except BrokenPipeError:  # the worker failed at its start: its stderr says why
            pass
        out, err = proc.communicate()  # closes stdin: the worker's input ends
    finally:  # a signal (KeyboardInterrupt, SIGTERM's exception) or an error here: the worker goes too
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        said = err.decode("utf-8", "replace").strip().splitlines()
        raise Exception(said[-1] if said else f"the worker exited with status {proc.returncode}")
    return _Backend.from_str(out.decode("utf-8"))


#: Text goes to the library's trainers in pieces of about this many characters: one 100 MB string
#: made it hold ~22 GB at once; pieces keep its memory near the counts it needs.
PIECE_CHARS = 1 << 20
_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")


def _pieces(chunks: Iterable[str], size: int = PIECE_CHARS) -> Iterator[str]:
    """``chunks`` cut into pieces of about ``size`` characters, only where GPT-2's split cuts anyway
    (after a single newline, or before a single space, between non-spaces), so the trainers count
    the same words.
    """
    for chunk in chunks:
        start = 0
        while len(chunk) - start > size:
            cut = _CUT.search(chunk, start + size)
            if cut is None:
                break
            yield chunk[start : cut.start()]
            start = cut.start()
        yield chunk[start:]


def _train_bpe(chunks: list[str], vocab_size: int, specials: list[str]) -> HFTokenizer:
    from tokenizers import Tokenizer as _Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    return HFTokenizer(_train_interruptibly(tok, _pieces(chunks), trainer))


def _train_unigram(chunks: list[str], vocab_size: int, specials: list[str]) -> HFTokenizer:
    from tokenizers import Tokenizer as _Backend
    from tokenizers import models, trainers

    tok = _Backend(models.Unigram())
    tok.pre_tokenizer = _word_pre_tokenizer()
    tok.decoder = _space_decoder()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, unk_token=UNK, special_tokens=[UNK, *specials], show_progress=False
    )
    tok = _train_interruptibly(tok, _pieces(chunks), trainer)
    return HFTokenizer(_trim_unigram(tok, vocab_size))


def _trim_unigram(tok, vocab_size: int):
    """Drop the least likely multi-character pieces beyond ``vocab_size``: near its base alphabet
    the library's trainer overshoots (66 asked, 73 given on Tiny Shakespeare). Characters and
    special tokens stay.
    """
    from tokenizers import Tokenizer as _Backend

    extra = tok.get_vocab_size(with_added_tokens=True) - vocab_size
    if extra <= 0:
        return tok
    obj = json.loads(tok.to_str())
    vocab = obj["model"]["vocab"]
    keep_ids = {a["id"] for a in obj.get("added_tokens") or []}
    droppable = sorted(
        (score, i) for i, (piece, score) in enumerate(vocab) if i not in keep_ids and len(piece) > 1
    )
    drop = {i for _, i in droppable[:extra]}
    if any(i < max(keep_ids, default=-1) for i in drop):
        return tok  # would renumber a special token; keep the larger vocabulary
    obj["model"]["vocab"] = [v for i, v in enumerate(vocab) if i not in drop]
    return _Backend.from_str(json.dumps(obj, ensure_ascii=False))


def _train_wordpiece(chunks: list[str], vocab_size: int, specials: list[str]) -> HFTokenizer:
    from tokenizers import AddedToken, Regex, decoders, models
    from tokenizers import Tokenizer as _Backend

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
            | {
                CONTINUATION + w[i:j]
                for w in counts
                for i in range(1, len(w))
                for j in range(i + 2, len(w) + 1)
            }
        )
        if vocab_size > ceiling:
            raise _too_big("wordpiece", ceiling, vocab_size)
    if len(vocab) < vocab_size:
        for a, b, _, _ in wordpiece_merges(counts):
            vocab.setdefault(a + b[len(CONTINUATION) :], len(vocab))
            if len(vocab) >= vocab_size:
                break
    tok = _Backend(
        models.WordPiece(
            vocab=vocab,
            unk_token=UNK,
            continuing_subword_prefix=CONTINUATION,
            max_input_chars_per_word=WORDPIECE_MAX_WORD,
        )
    )
    tok.pre_tokenizer = pre
    # Drop the ## of continuations and turn ▁ back into spaces; nothing else is
    # added between tokens (the library's WordPiece decoder would add spaces).
    tok.decoder = decoders.Sequence(
        [decoders.Replace(Regex(f"^{re.escape(CONTINUATION)}"), ""), _space_decoder()]
    )
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in [UNK, *specials]]
    )
    return HFTokenizer(tok)


def train_tokenizer(
    kind: str,
    text: str | Iterable[str],
    vocab_size: Optional[int] = None,
    special_tokens: Iterable[str] = (),
    on_start: Callable[[], None] = lambda: None,
) -> Tokenizer:
    """Train a tokenizer of ``kind`` on ``text`` (or its pieces, none cutting a special token).

    ``vocab_size``: entries in all (ignored for char); ``special_tokens`` become single ids;
    ``on_start`` is called once the inputs are checked, as the (long) training starts.

    Raises:
        MinigptError: unknown kind, empty corpus, a vocabulary size missing, below the kind's base
            alphabet, or above what the corpus can give.
    """
    if kind not in KINDS:  # the Python API's edge; the config's kind is a Literal
        raise MinigptError(
            f"unknown tokenizer kind {kind!r}", "use one of char, bpe, wordpiece, unigram"
        )
    specials = check_special_tokens(special_tokens)
    if kind != "char" and not isinstance(text, str):
        text = "".join(text)
    chunks = [] if kind == "char" else [c for c in split_special(text, specials)[0::2] if c]
    if (
        kind == "char" or not chunks
    ):  # char's alphabet; for the others, its refusal of a corpus without text
        return CharTokenizer.train(text, specials)
    check_vocab_size(kind, text, vocab_size, specials)
    trainer = {"bpe": _train_bpe, "unigram": _train_unigram, "wordpiece": _train_wordpiece}[kind]
    on_start()
    tok, error = _attempt(
        lambda: trainer(chunks, vocab_size, specials)
    )  # the library's refusals: one line
    if error is not None:
        raise MinigptError(f"training the {kind} tokenizer failed: {str(error).splitlines()[0]}")
    if tok.vocab_size < vocab_size:
        raise _too_big(kind, tok.vocab_size, vocab_size)
    return tok
