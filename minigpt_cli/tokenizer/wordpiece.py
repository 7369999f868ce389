"""Our WordPiece trainer: the merges, best score first.

From single characters (``h ##u ##g``), it merges the adjacent pair with the highest count(ab) /
(count(a)·count(b)), not the most frequent (Hugging Face LLM course, ch. 6.6 "WordPiece
tokenization"; the library's own trainer merges by frequency). Pure Python.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterator, Mapping

#: WordPiece's mark for a piece that continues a word.
CONTINUATION = "##"


def wordpiece_symbols(word: str) -> list[str]:
    """A word (non-empty) as WordPiece's starting symbols: ``hugs`` -> ``h ##u ##g ##s``."""
    return [word[0]] + [CONTINUATION + c for c in word[1:]]


def wordpiece_scores(word_counts: Mapping[str, int]) -> dict[tuple[str, str], float]:
    """Score count(ab) / (count(a)·count(b)) of every adjacent pair before any merge, in (0, 1];
    counts are weighted by the words' frequencies in ``word_counts``.
    """
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
    """Yield WordPiece merges in order: (a, b, score, count(ab)), best score first (ties: the more
    frequent pair, then the smaller strings); the new symbol is ``a + b`` without ``b``'s ``##``.

    Counts are updated incrementally: a merge touches only the words holding its pair and re-scores
    only the pairs it changed (a max-heap, stale entries skipped on pop).
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
        new = a + b[len(CONTINUATION) :]
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
