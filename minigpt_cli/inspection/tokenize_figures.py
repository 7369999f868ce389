"""The pictures of ``minigpt inspect tokenize`` (:mod:`.tokenize`): the toy corpus's merges and
segmentations, and a tokenizer's pieces of a text."""

from __future__ import annotations

from pathlib import Path

from .figures import new_figure, save_png


def plot_toy(r: dict, folder: Path) -> str:
    """``tokenize.png`` of :func:`~.tokenize.toy`'s result ``r`` in ``folder``: the first BPE and
    WordPiece merges against the other pairs, and the Unigram segmentations of a word (the Viterbi
    choice in red)."""
    fig = new_figure(15, 4.8)
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.22, top=0.88, wspace=0.35)
    for k, (key, value, title, color) in enumerate(
        (
            ("bpe_first", "count", "BPE merges the most frequent pair", "tab:blue"),
            ("wordpiece_first", "score", "WordPiece: count(ab)/(count(a)·count(b))", "tab:green"),
        )
    ):
        ax = fig.add_subplot(1, 3, k + 1)
        pairs = r[key]
        ax.bar(
            range(len(pairs)),
            [m[value] for m in pairs],
            color=[color if i == 0 else "lightgrey" for i in range(len(pairs))],
        )
        ax.set_xticks(
            range(len(pairs)), [f"{m['a']}+{m['b']}" for m in pairs], rotation=45, ha="right"
        )
        ax.set_title(f"{title}\nbefore any merge (coloured: the first merge)", fontsize=10)
        ax.set_ylabel(f"pair {value}")
    ax = fig.add_subplot(1, 3, 3)
    entry = next((e for e in r["unigram"]["words"] if e["segmentations"]), None)
    if entry is not None:
        _segmentations(ax, entry)
        ax.set_title(f"Unigram: segmentations of {entry['word']!r}")
    return save_png(fig, folder, "tokenize.png")


def plot_pieces(r: dict, folder: Path) -> str:
    """``tokenize.png`` of :func:`~.tokenize.inspect_tokenizer`'s result ``r`` in ``folder``: the
    first 60 pieces with their ids, and a word's Unigram segmentations when ``r`` lists them."""
    pieces = r["pieces"][:60]
    words = [e for e in r["unigram_words"] or [] if e["segmentations"]]
    word = max(words, key=lambda e: e["count"], default=None)
    rows = len(word["segmentations"]) if word else 0
    height = 2.4 + (0.35 * rows + 1.2 if word else 0)
    fig = new_figure(min(16, max(6, 2 + 0.5 * sum(max(len(p), 2) for p in pieces) / 2)), height)
    ax = fig.add_axes((0.01, 1 - 2.0 / height, 0.98, 1.5 / height))
    ax.set_axis_off()
    x = 0.0
    colors = ["#cfe8ff", "#ffe2c6", "#d8f5d0", "#f3d6f5", "#fff3b0"]
    for k, (piece, i) in enumerate(zip(pieces, r["ids"])):
        width = max(len(piece), 2) * 0.6 + 0.4
        ax.add_patch(_box(x, width, colors[k % len(colors)]))
        shown = piece.replace("\n", "\\n").replace(" ", "␣")
        ax.text(
            x + width / 2, 0.62, shown, ha="center", va="center", fontsize=10, family="monospace"
        )
        ax.text(x + width / 2, 0.2, str(i), ha="center", va="center", fontsize=7, color="dimgrey")
        x += width + 0.1
    ax.set_xlim(-0.1, max(x, 1))
    ax.set_ylim(0, 1)
    more = f" (first 60 of {len(r['pieces'])})" if len(r["pieces"]) > 60 else ""
    fig.suptitle(f"{r['kind']}: {len(r['ids'])} tokens{more}, ids below each piece", fontsize=10)
    if word:
        ax = fig.add_axes((0.3, 0.6 / height, 0.65, (0.35 * rows) / height))
        _segmentations(ax, word)
        ax.set_title(f"segmentations of {word['word']!r}", fontsize=9)
    return save_png(fig, folder, "tokenize.png")


def _segmentations(ax, entry: dict) -> None:
    """Bars of a word's segmentations by log P, the first at the top and the Viterbi choice in
    red."""
    segs = entry["segmentations"][::-1]
    ax.barh(
        range(len(segs)),
        [s["log_prob"] for s in segs],
        color=["tab:red" if s["viterbi"] else "tab:grey" for s in segs],
    )
    ax.set_yticks(range(len(segs)), [" + ".join(s["pieces"]) for s in segs], fontsize=8)
    ax.set_xlabel("log P (red: the Viterbi choice)")


def _box(x: float, width: float, color: str):
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch(
        (x, 0.05), width, 0.9, boxstyle="round,pad=0.02", facecolor=color, edgecolor="grey"
    )
