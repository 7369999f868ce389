"""``minigpt inspect attention``: a trained run's attention weights on a prompt, per layer and head,
and their entropy.

Weights softmax(q kᵀ / sqrt(head_dim)) under the causal mask (Vaswani et al. 2017 §3.2.1), key heads
shared by n_head / n_kv_head query heads (Ainslie et al. 2023); entropy −Σ_s p(s) ln p(s) over keys
s ≤ t, in nats.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..errors import MinigptError
from ..run import folder as runs
from ..sample.sampling import encode_prompt
from .figures import drawn, new_figure, report, save_png, widen_to_fit
from .run_model import open_run

#: Tick labels are drawn for prompts up to this many tokens.
LABELLED = 24


def attention_weights(
    attn, x: torch.Tensor, rope=None, ve=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention weights (B, n_head, T, T) float32 of one attention layer on its input x (B, T,
    C), and the layer's output (B, T, C) recomputed from them (``scaled_dot_product_attention`` does
    not return weights); ``rope`` and ``ve`` (the layer's value embedding) as the block passes
    them."""
    B, T, C = x.size()
    with torch.no_grad():
        q, k, v = attn.qkv(
            x, rope, ve
        )  # (B, nh, T, hs), (B, nkv, T, hs): QK-norm, RoPE, value embedding applied
        rep = attn.n_head // attn.n_kv_head
        k = k.repeat_interleave(rep, dim=1)  # (B, nh, T, hs): query head h reads key head h // rep
        v = v.repeat_interleave(rep, dim=1)
        scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(
            attn.head_dim
        )  # (B, nh, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        weights = F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (weights.to(v.dtype) @ v).transpose(1, 2).contiguous().view(B, T, C)
        return weights, attn.c_proj(y)


def entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``weights`` (..., T, T): −Σ p ln p, 0·ln 0 taken as 0."""
    logs = torch.where(weights > 0, weights.clamp_min(1e-30).log(), torch.zeros_like(weights))
    return -(weights * logs).sum(-1)


def attention(
    run: str | Path,
    prompt: str,
    checkpoint: str = runs.BEST,
    output: Optional[Path] = None,
    echo: Callable[[str], None] = lambda m: None,
) -> dict:
    """Attention weights ([layer][head][query][key]) of a run on ``prompt``, each head's mean
    entropy over positions 1..T−1, and ``max_check_error`` (weights·v through c_proj against the
    layer's output). Raises MinigptError: as :func:`~.run_model.open_run`; a prompt the tokenizer
    cannot encode or longer than block_size (refused, not cropped: the model never saw those
    positions together).
    """
    model, cfg, tok, ckpt = open_run(run, checkpoint, echo)
    ids = encode_prompt(tok, prompt)
    block = cfg.model.block_size
    if len(ids) > block:
        raise MinigptError(
            f"the prompt is {len(ids)} tokens, longer than the run's block_size {block}: the model "
            f"never saw positions past {block - 1}, so their maps would mean nothing; "
            f"give at most {block} tokens"
        )
    maps: list[torch.Tensor] = []
    errors: list[float] = []

    def compare_output(module, args, out):  # Block calls attn(x, rope, cache, layer, positions, ve)
        weights, recomputed = attention_weights(module, args[0], args[1], args[5])
        maps.append(weights[0])
        errors.append(float((recomputed - out).abs().max()))

    hooks = [blk.attn.register_forward_hook(compare_output) for blk in model.h]
    try:
        with torch.no_grad():
            model(torch.tensor([ids], dtype=torch.long))
    finally:
        for h in hooks:
            h.remove()
    T = len(ids)
    rows = slice(1, T) if T > 1 else slice(0, 1)
    rep = cfg.model.n_head // cfg.model.kv_heads
    heads = [
        {
            "layer": layer,
            "head": h,
            "kv_head": h // rep,
            "mean_entropy": float(entropy(m[h])[rows].mean()),
        }
        for layer, m in enumerate(maps)
        for h in range(m.shape[0])
    ]
    uniform = float(torch.log(torch.arange(1, T + 1, dtype=torch.float64))[rows].mean())
    result = {
        "run": str(run),
        "checkpoint": ckpt,
        "n_layer": cfg.model.n_layer,
        "n_head": cfg.model.n_head,
        "n_kv_head": cfg.model.kv_heads,
        "pos_encoding": cfg.model.pos_encoding,
        "tokens": tok.pieces(prompt),
        "ids": ids,
        "heads": heads,
        "uniform_entropy": uniform,
        "weights": [m.tolist() for m in maps],
        "max_check_error": max(errors),
        "png": None,
    }
    return drawn(result, output, _plot, maps)


def format_attention(r: dict) -> str:
    """The text report of :func:`attention`."""
    kv = (
        f", {r['n_kv_head']} key/value heads (grouped-query)"
        if r["n_kv_head"] != r["n_head"]
        else ""
    )
    shown = " ".join(repr(t) for t in r["tokens"][:LABELLED]) + (
        " ..." if len(r["tokens"]) > LABELLED else ""
    )
    lines = [
        f"attention of {r['run']} ({r['checkpoint']}): {r['n_layer']} layers x {r['n_head']} heads{kv}, "
        f"positions: {r['pos_encoding']}",
        f"  prompt: {len(r['ids'])} tokens: {shown}",
        f"  mean entropy per head over query positions 1..{len(r['ids']) - 1}, in nats (evenly spread: "
        f"{r['uniform_entropy']:.3f}; one key: 0):",
    ]
    grouped = r["n_kv_head"] != r["n_head"]
    for layer in range(r["n_layer"]):
        cells = [
            f"h{h['head']}"
            + (f"(kv{h['kv_head']})" if grouped else "")
            + f" {h['mean_entropy']:.3f}"
            for h in r["heads"]
            if h["layer"] == layer
        ]
        lines.append(f"  layer {layer}: " + "  ".join(cells))
    lines.append(
        f"  check: weights·v through c_proj reproduce each layer's output to {r['max_check_error']:.1e}"
    )
    return report(lines, r)


def _plot(r: dict, maps: list[torch.Tensor], folder: Path) -> str:
    L, H, T = r["n_layer"], r["n_head"], len(r["ids"])
    cell = 2.6 if T <= LABELLED else 2.2
    height = 0.9 * cell * L + 0.8
    fig = new_figure(cell * H + 1.2, height)
    # fixed margins clipped the title of a narrow grid: the layout engine makes room for every label
    fig.set_layout_engine("constrained", w_pad=0.08, h_pad=0.08)
    title = fig.suptitle(
        f"{Path(r['run']).name}: attention weights\n"
        "rows: query, columns: key; H: mean entropy in nats"
    )
    labels = (
        [t.replace("\n", "↵").replace(" ", "␣") for t in r["tokens"]]
        if len(r["tokens"]) == T
        else [str(i) for i in r["ids"]]
    )
    image = None
    for layer, m in enumerate(maps):
        for h in range(H):
            ax = fig.add_subplot(L, H, layer * H + h + 1)
            image = ax.imshow(
                m[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest"
            )
            ent = next(
                x["mean_entropy"] for x in r["heads"] if x["layer"] == layer and x["head"] == h
            )
            kv = f" kv{h // (H // r['n_kv_head'])}" if r["n_kv_head"] != H else ""
            ax.set_title(f"layer {layer} head {h}{kv}  H={ent:.2f}", fontsize=8)
            # Every map has the same tokens: the key labels under the last row only, the query
            # labels left of the first column only (a label on every map cost 4 of the 5 s it took
            # to draw 4 x 4 maps of 24 tokens, and crowded them).
            if T <= LABELLED:
                ax.set_xticks(range(T), labels if layer == L - 1 else [], fontsize=6, rotation=90)
                ax.set_yticks(range(T), labels if h == 0 else [], fontsize=6)
            else:
                ax.tick_params(labelsize=6, labelbottom=layer == L - 1, labelleft=h == 0)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, fraction=0.02, pad=0.02)
    widen_to_fit(fig, title)
    return save_png(fig, folder, "attention.png")
