"""``minigpt inspect tokenize``: how the three subword algorithms cut text, and why.

The toy corpus is the Hugging Face LLM course's (ch. 6.5-6.7): BPE (Sennrich et al. 2016; byte-level
as GPT-2) merges the most frequent pair, WordPiece the highest count(ab) / (count(a)·count(b)), and
Unigram (Kudo 2018 §3.2) starts from every substring, probability by frequency.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..config.schema import load_config
from ..config.special_tokens import UNK
from ..errors import MinigptError
from ..fileio import read_text_file
from ..run import folder as runs
from ..tokenizer.kinds import Tokenizer, load_run_tokenizer, load_tokenizer, tokenizer_file
from ..tokenizer.wordpiece import (
    CONTINUATION,
    wordpiece_merges,
    wordpiece_scores,
    wordpiece_symbols,
)
from .figures import drawn, report
from .tokenize_figures import plot_pieces, plot_toy

#: The toy corpus: word -> frequency.
TOY_WORDS = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
#: The toy's default text: a word of the corpus, and one it never saw.
TOY_TEXT = "hugs bugs"
#: Segmentations of one word are enumerated up to this many (then the word is skipped, with a note).
MAX_SEGMENTATIONS = 20_000
#: Words longer than this are not enumerated.
MAX_WORD = 24
#: Segmentations shown per word (the most likely first; the Viterbi choice always among them).
SHOWN = 12


def parse_words(text: str) -> dict[str, int]:
    """``"hug=10,pug=5"`` -> {"hug": 10, "pug": 5}; MinigptError unless word=count pairs with counts
    >= 1."""
    pairs = [
        (word.strip(), count.strip())
        for word, _, count in (item.partition("=") for item in text.split(","))
    ]
    if not all(word.isalpha() and count.isdecimal() and int(count) >= 1 for word, count in pairs):
        raise MinigptError(
            f"--words {text!r}: give word=count pairs (a word of letters only, a count of at "
            "least 1) separated by commas, e.g. --words hug=10,pug=5"
        )
    out: dict[str, int] = {}
    for word, count in pairs:
        out[word] = out.get(word, 0) + int(count)
    return out


def _corpus(words: dict[str, int]) -> str:
    """One word a line, each as often as its count: the pre-tokenizer then sees exactly these
    words."""
    return "\n".join(w for w, n in words.items() for _ in range(n))


def replay(words: dict[str, int], merges: Sequence[tuple[str, str]]) -> list[int]:
    """The count each BPE merge had when it was made: the merges applied in order to the weighted
    words."""
    split = {w: list(w) for w in words}
    counts = []
    for a, b in merges:
        counts.append(_pair_counts(split, words)[(a, b)])
        split = {w: _merge(s, a, b) for w, s in split.items()}
    return counts


def _pair_counts(split: dict[str, list[str]], words: dict[str, int]) -> Counter:
    """How often each adjacent pair of symbols occurs in the weighted words, ``split`` into
    symbols."""
    pairs: Counter = Counter()
    for w, symbols in split.items():
        for p in zip(symbols, symbols[1:]):
            pairs[p] += words[w]
    return pairs


def _merge(symbols: list[str], a: str, b: str) -> list[str]:
    """``symbols`` with each adjacent ``a``, ``b`` (left to right, not overlapping) made one symbol
    ``a + b``."""
    out, i = [], 0
    while i < len(symbols):
        pair = i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b
        out.append(a + b if pair else symbols[i])
        i += 2 if pair else 1
    return out


def toy_bpe(words: dict[str, int]) -> list[dict]:
    """Every BPE merge on the toy words, in order: {a, b, count} (the library's trainer, byte-level
    as minigpt's ``bpe`` kind: GPT-2's split and the 256-byte alphabet; the toy words are ASCII, so
    bytes are letters)."""
    from tokenizers import Tokenizer as _Backend
    from tokenizers import models, pre_tokenizers, trainers

    tok = _Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bound = sum(
        len(w) - 1 for w in words
    )  # no word has more merges than letters - 1: room to merge everything
    trainer = trainers.BpeTrainer(
        vocab_size=256 + bound + 1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_corpus(words)], trainer)
    raw = json.loads(tok.to_str())["model"]["merges"]
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in raw
    ]  # "a b" (old files) or [a, b]
    return [{"a": a, "b": b, "count": c} for (a, b), c in zip(merges, replay(words, merges))]


def seed_unigram(words: dict[str, int]) -> dict[str, float]:
    """Kudo 2018 §3.2's seed model: every substring of the words, log-probability ln(freq /
    total)."""
    freq: Counter = Counter()
    for w, n in words.items():
        for i in range(len(w)):
            for j in range(i + 1, len(w) + 1):
                freq[w[i:j]] += n
    total = sum(freq.values())
    return {
        piece: math.log(c / total)
        for piece, c in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))
    }


def segmentations(word: str, logp: dict[str, float]) -> Optional[list[tuple[list[str], float]]]:
    """Every cut of ``word`` into vocabulary pieces with its log-probability, most likely first;
    None when there are more than :data:`MAX_SEGMENTATIONS` or the word is longer than
    :data:`MAX_WORD`."""
    if len(word) > MAX_WORD:
        return None
    out: list[tuple[list[str], float]] = []

    def walk(start: int, pieces: list[str], total: float) -> bool:
        if start == len(word):
            out.append((list(pieces), total))
            return len(out) <= MAX_SEGMENTATIONS
        for end in range(start + 1, len(word) + 1):
            piece = word[start:end]
            if piece in logp:
                pieces.append(piece)
                ok = walk(end, pieces, total + logp[piece])
                pieces.pop()
                if not ok:
                    return False
        return True

    if not walk(0, [], 0.0):
        return None
    return sorted(out, key=lambda s: (-s[1], len(s[0])))


def _unigram_words(backend, words: Sequence[str], logp: dict[str, float]) -> list[dict]:
    """Each word's segmentations, the library's Viterbi pieces, and whether they are the best
    listed."""
    out = []
    for word in words:
        viterbi = [t.value for t in backend.model.tokenize(word)]
        found = segmentations(word, logp)
        entry = {
            "word": word,
            "viterbi": viterbi,
            "count": None if found is None else len(found),
            "segmentations": None,
            "viterbi_is_best": None,
        }
        if found:
            entry["segmentations"] = [
                {"pieces": p, "log_prob": lp, "viterbi": p == viterbi} for p, lp in found[:SHOWN]
            ]
            best = found[0][1]
            entry["viterbi_is_best"] = any(
                p == viterbi and abs(lp - best) < 1e-9 for p, lp in found
            )
            if not any(s["viterbi"] for s in entry["segmentations"]):
                entry["segmentations"] += [
                    {"pieces": p, "log_prob": lp, "viterbi": True}
                    for p, lp in found
                    if p == viterbi
                ]
        out.append(entry)
    return out


def toy(
    words: Optional[dict[str, int]] = None, text: str = TOY_TEXT, output: Optional[Path] = None
) -> dict:
    """BPE and WordPiece merges ({a, b, count} / {a, b, score, count}; ``*_first``: every pair
    before any merge) and Unigram segmentations (the library's Viterbi choice marked) on the toy
    corpus, and ``text`` cut by each.
    """
    from tokenizers import Tokenizer as _Backend
    from tokenizers import models, pre_tokenizers

    from ..tokenizer.training import base_vocab_size, train_tokenizer

    words = dict(TOY_WORDS if words is None else words)
    bpe = toy_bpe(words)
    wp = [
        {"a": a, "b": b, "score": s, "count": c} for a, b, s, c in wordpiece_merges(words)
    ]  # best score first
    corpus = _corpus(words)
    merged = {m["a"] + m["b"][len(CONTINUATION) :] for m in wp} - {
        s for w in words for s in wordpiece_symbols(w)
    }
    wp_tok = train_tokenizer(
        "wordpiece", corpus, base_vocab_size("wordpiece", corpus) + len(merged)
    )
    logp = seed_unigram(words)
    uni = _Backend(models.Unigram([(UNK, 0.0), *logp.items()], unk_id=0, byte_fallback=False))
    uni.pre_tokenizer = pre_tokenizers.Whitespace()
    text_words = [w for w, _ in uni.pre_tokenizer.pre_tokenize_str(text)]
    bpe_pieces = _bpe_cut(text_words, bpe)
    first_counts = _pair_counts({w: list(w) for w in words}, words)
    result = {
        "mode": "toy",
        "words": words,
        "text": text,
        "bpe": bpe,
        "bpe_pieces": bpe_pieces,
        "bpe_first": [
            {"a": a, "b": b, "count": c}
            for (a, b), c in sorted(first_counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "wordpiece": wp,
        "wordpiece_pieces": [p for w in text_words for p in wp_tok.pieces(w)],
        "wordpiece_first": [
            {"a": a, "b": b, "score": sc}
            for (a, b), sc in sorted(
                wordpiece_scores(words).items(), key=lambda kv: (-kv[1], kv[0])
            )
        ],
        "unigram": {
            "vocab": logp,
            "total": sum(n * len(w) * (len(w) + 1) // 2 for w, n in words.items()),
            "words": _unigram_words(uni, text_words, logp),
        },
        "png": None,
    }
    return drawn(result, output, plot_toy)


def _bpe_cut(text_words: Sequence[str], merges: Sequence[dict]) -> list[str]:
    """Each word cut by replaying the merges in order (how BPE encodes)."""
    pieces = []
    for w in text_words:
        s = list(w)
        for m in merges:
            s = _merge(s, m["a"], m["b"])
        pieces += s
    return pieces


def inspect_tokenizer(
    tok: Tokenizer,
    text: str,
    source: str,
    all_segmentations: bool = False,
    corpus: Optional[Path] = None,
    output: Optional[Path] = None,
) -> dict:
    """A trained tokenizer's pieces and ids for ``text``, with ``details`` per piece: bpe
    {merge_rank, a, b}; wordpiece {merge_rank, and with ``corpus`` score, count}; unigram
    {log_prob}. Raises MinigptError: ``corpus`` but not wordpiece, or unreadable;
    ``all_segmentations`` but not unigram.
    """
    if corpus is not None and tok.kind != "wordpiece":
        raise MinigptError(
            f"--corpus recomputes WordPiece merge scores; this tokenizer is {tok.kind}"
        )
    if all_segmentations and tok.kind != "unigram":
        raise MinigptError(
            f"--all-segmentations lists Unigram segmentations; this tokenizer is {tok.kind}"
        )
    ids = tok.encode(text)
    model = json.loads(tok.backend.to_str())["model"] if tok.kind != "char" else {}
    result = {
        "mode": "tokenizer",
        "source": source,
        "kind": tok.kind,
        "model": model.get("type"),
        "vocab_size": tok.vocab_size,
        "text": text,
        "pieces": tok.pieces(text),
        "ids": ids,
        "details": [{} for _ in ids],
        "unigram_words": None,
        "png": None,
    }
    if tok.kind in (
        "bpe",
        "wordpiece",
        "unigram",
    ):  # char and hf (a pretrained folder's file): pieces and ids
        backend = tok.backend
        tokens = [backend.id_to_token(i) for i in ids]
        if tok.kind == "bpe":
            made = {}
            for rank, m in enumerate(model["merges"]):
                a, b = m.split(" ") if isinstance(m, str) else m  # "a b" (old files) or [a, b]
                made.setdefault(a + b, (rank, a, b))
            result["details"] = [
                dict(zip(("merge_rank", "a", "b"), made.get(t, (None, None, None)))) for t in tokens
            ]
        elif tok.kind == "wordpiece":
            result["details"] = _wordpiece_details(tok, model, tokens, corpus)
        else:
            logp = {p: s for p, s in model["vocab"]}
            result["details"] = [{"log_prob": logp.get(t)} for t in tokens]
            if all_segmentations:
                words = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
                result["unigram_words"] = _unigram_words(backend, words, logp)
    return drawn(result, output, plot_pieces)


def _wordpiece_details(tok, model: dict, tokens: list[str], corpus: Optional[Path]) -> list[dict]:
    """Each WordPiece piece's merge rank (its place among the merged entries, which our trainer
    appends in merge order), and with the training text the score and count of the merge that made
    it."""
    vocab = model["vocab"]
    base = sum(
        1
        for t in vocab
        if len(t.removeprefix(CONTINUATION)) <= 1 or t in tok.special_tokens or t == tok.unk_token
    )
    rank = {t: i - base for t, i in vocab.items() if i >= base}
    details = [{"merge_rank": rank.get(t)} for t in tokens]
    if corpus is not None:
        counts: Counter = Counter()
        pre = tok.backend.pre_tokenizer
        counts.update(w for w, _ in pre.pre_tokenize_str(read_text_file(corpus, "--corpus")))
        need = max((d["merge_rank"] for d in details if d["merge_rank"] is not None), default=-1)
        made = {}
        for i, (a, b, score, count) in zip(range(need + 1), wordpiece_merges(counts)):
            made.setdefault(a + b[len(CONTINUATION) :], (i, a, b, score, count))
        for d, t in zip(details, tokens):
            d["corpus_checked"] = d["merge_rank"] is not None
            if t in made:
                i, a, b, score, count = made[t]
                d.update({"a": a, "b": b, "score": score, "count": count, "corpus_rank": i})
    return details


def format_tokenize(r: dict) -> str:
    """The text report of :func:`toy` or :func:`inspect_tokenizer`."""
    lines = []
    if r["mode"] == "toy":
        words = ", ".join(f"{w} x{n}" for w, n in r["words"].items())
        lines.append(f"toy corpus: {words}")
        lines.append(
            "BPE merges, most frequent pair first (Sennrich et al. 2016; GPT-2's byte-level BPE):"
        )
        for i, m in enumerate(r["bpe"]):
            lines.append(
                f"  {i + 1:>2}. {m['a']} + {m['b']} -> {m['a'] + m['b']}   count {m['count']}"
            )
        first = ", ".join(f"{m['a']}+{m['b']} {m['count']}" for m in r["bpe_first"])
        lines.append(f"  (pair counts before any merge: {first})")
        lines.append(
            "WordPiece merges, highest count(ab)/(count(a)·count(b)) first (scores at the time of "
            "each merge):"
        )
        for i, m in enumerate(r["wordpiece"]):
            lines.append(
                f"  {i + 1:>2}. {m['a']} + {m['b']} -> {m['a'] + m['b'][len(CONTINUATION) :]}   "
                f"score {m['score']:.4f}   count {m['count']}"
            )
        first = ", ".join(f"{m['a']}+{m['b']} {m['score']:.3f}" for m in r["wordpiece_first"])
        lines.append(f"  (pair scores before any merge: {first})")
        lines.append(
            f"{r['text']!r}: BPE {' '.join(r['bpe_pieces'])}   WordPiece {' '.join(r['wordpiece_pieces'])}"
        )
        lines.append(
            f"Unigram, the seed model (Kudo 2018 §3.2): every substring, p = frequency / "
            f"{r['unigram']['total']}; the library's Viterbi choice marked *:"
        )
        lines += _format_segmentations(r["unigram"]["words"])
    else:
        model = f", a {r['model']} model" if r["kind"] == "hf" and r.get("model") else ""
        lines.append(
            f"{r['kind']} tokenizer {r['source']} ({r['vocab_size']:,} entries{model}): "
            f"{len(r['ids'])} tokens"
        )
        for piece, i, d in zip(r["pieces"], r["ids"], r["details"]):
            lines.append(f"  {piece!r:<16} id {i:<7}{_detail(r['kind'], d)}")
        if r["unigram_words"] is not None:
            lines.append("every segmentation of each word (Unigram, Kudo 2018; ▁ is a space):")
            lines += _format_segmentations(r["unigram_words"])
    return report(lines, r)


def _detail(kind: str, d: dict) -> str:
    if kind == "bpe":
        return (
            "a base byte"
            if d.get("merge_rank") is None
            else f"merge #{d['merge_rank'] + 1}: {d['a']} + {d['b']}"
        )
    if kind == "wordpiece":
        if d.get("merge_rank") is None:
            return "base symbol"
        if "score" in d:
            text = f"merge #{d['merge_rank'] + 1}: {d['a']} + {d['b']}, score {d['score']:.3g}, count {d['count']:,}"
            if d["corpus_rank"] != d["merge_rank"]:
                text += f" (the corpus makes it at merge #{d['corpus_rank'] + 1}: is it the training text?)"
            return text
        if d.get("corpus_checked"):
            return f"merge #{d['merge_rank'] + 1} (not among the corpus's merges: is it the training text?)"
        return f"merge #{d['merge_rank'] + 1} (pass --corpus, the training text, for its score)"
    if kind == "unigram":
        return "" if d.get("log_prob") is None else f"log p = {d['log_prob']:.3f}"
    return ""


def _format_segmentations(entries: list[dict]) -> list[str]:
    lines = []
    for e in entries:
        word = repr(e["word"])
        if e["segmentations"] is None:
            why = (
                "none: a character outside the vocabulary"
                if e["count"] == 0
                else "too many to list"
            )
            lines.append(f"  {word}: {why}; Viterbi: {' + '.join(e['viterbi'])}")
            continue
        agree = "the best listed" if e["viterbi_is_best"] else "NOT the best listed"
        many = "segmentation" if e["count"] == 1 else "segmentations"
        lines.append(f"  {word}: {e['count']} {many}; Viterbi (*) = {agree}")
        for s in e["segmentations"]:
            mark = "*" if s["viterbi"] else " "
            lines.append(f"    {mark} {' + '.join(s['pieces']):<28} log P = {s['log_prob']:.3f}")
    return lines


def load_for_inspect(
    tokenizer: Optional[Path], run: Optional[Path]
) -> tuple[Optional[Tokenizer], str]:
    """The tokenizer ``--tokenizer`` (a user's file, never to be deleted) or ``--run`` names (None:
    the toy corpus), and how to name it. Raises MinigptError: both given; no such run folder, or a
    sweep's; a missing or damaged file.
    """
    if run is not None:
        runs.refuse_sweep(Path(run))
    if tokenizer is not None and run is not None:
        raise MinigptError("pass --tokenizer FILE or --run DIR, not both")
    if run is not None and not (Path(run) / runs.CONFIG).is_file():
        raise MinigptError(
            f"run folder {str(run)!r} not found (no config.yaml there); "
            "pass --run runs/NAME of a trained run"
        )
    if tokenizer is not None:
        return load_tokenizer(tokenizer, own=False), str(tokenizer_file(tokenizer, own=False))
    if run is not None:
        tok = load_run_tokenizer(Path(run), load_config(Path(run) / runs.CONFIG))
        return tok, str(Path(run) / runs.TOKENIZER)
    return None, "toy"


def tokenize(
    tokenizer: Optional[Path] = None,
    run: Optional[Path] = None,
    text: Optional[str] = None,
    words: Optional[dict[str, int]] = None,
    all_segmentations: bool = False,
    corpus: Optional[Path] = None,
    output: Optional[Path] = None,
    echo: Callable[[str], None] = lambda m: None,
) -> dict:
    """:func:`toy` without a tokenizer, else :func:`inspect_tokenizer`; MinigptError for an empty
    ``text``."""
    if text == "":
        raise MinigptError("--text '': give some text to cut")
    tok, source = load_for_inspect(tokenizer, run)
    if tok is None:
        return toy(words, TOY_TEXT if text is None else text, output)
    return inspect_tokenizer(
        tok, "ROMEO: hugs" if text is None else text, source, all_segmentations, corpus, output
    )
