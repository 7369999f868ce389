"""``minigpt inspect block``: our Transformer block against PyTorch's, and the shapes through a
stack of them.

Pre-LN (GPT-2; Xiong et al. 2020) and Post-LN (Vaswani et al. 2017 §3.1) blocks, their weights
copied into ``torch.nn.TransformerEncoderLayer``, run with and without the causal mask (so that the
check can fail).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..config.schema import ModelConfig
from ..model.gpt import GPT, Block
from .figures import check_heads, decorate, drawn, new_figure, report, save_png, seeded

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
#: The trace's vocabulary: Tiny Shakespeare's 65 characters.
TRACE_VOCAB = 65


def copy_into_reference(blk: Block, ref: nn.TransformerEncoderLayer) -> None:
    """Our block's weights into PyTorch's layer: c_attn is [W_Q; W_K; W_V] stacked as in_proj is."""
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(blk.attn.c_attn.weight)
        ref.self_attn.in_proj_bias.copy_(blk.attn.c_attn.bias)
        for ours, theirs in (
            (blk.attn.c_proj, ref.self_attn.out_proj),
            (blk.mlp.c_fc, ref.linear1),
            (blk.mlp.c_proj, ref.linear2),
            (blk.ln_1, ref.norm1),
            (blk.ln_2, ref.norm2),
        ):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)


def compare(
    norm_position: str,
    n_embd: int = 64,
    n_head: int = 4,
    d_ff: int = 256,
    seq_len: int = 8,
    batch: int = 2,
    activation: str = "gelu",
    seed: int = 0,
) -> dict:
    """One block of ours against ``nn.TransformerEncoderLayer`` with the same weights, causal mask,
    float32: ``max_error``, ``max_error_without_mask`` (what a missing mask costs), and 256 outputs
    of each for the plot.
    """
    cfg = ModelConfig(
        n_layer=1,
        n_head=n_head,
        n_embd=n_embd,
        d_ff=d_ff,
        block_size=seq_len,
        ffn=activation,
        norm_position=norm_position,
        bias=True,
        dropout=0.0,
    )
    with seeded(seed), torch.no_grad():
        blk = Block(cfg).eval()
        for ln in (
            blk.ln_1,
            blk.ln_2,
        ):  # norm gains and biases away from 1 and 0, so that copying them is tested
            ln.weight.add_(0.1 * torch.randn_like(ln.weight))
            ln.bias.add_(0.1 * torch.randn_like(ln.bias))
        ref = nn.TransformerEncoderLayer(
            n_embd,
            n_head,
            dim_feedforward=d_ff,
            dropout=0.0,
            activation=activation,
            layer_norm_eps=cfg.norm_eps,
            batch_first=True,
            norm_first=norm_position == "pre",
        ).eval()
        x = torch.randn(batch, seq_len, n_embd)
    copy_into_reference(blk, ref)
    mask = nn.Transformer.generate_square_subsequent_mask(seq_len)
    with torch.no_grad():
        ours = blk(x)
        theirs = ref(x, src_mask=mask, is_causal=True)
        unmasked = ref(x)
    return {
        "norm_position": norm_position,
        "max_error": float((ours - theirs).abs().max()),
        "max_error_without_mask": float((ours - unmasked).abs().max()),
        "ours": ours.flatten()[:256].tolist(),
        "reference": theirs.flatten()[:256].tolist(),
        "unmasked": unmasked.flatten()[:256].tolist(),
    }


def trace(
    n_layer: int = 2,
    batch: int = 2,
    seq_len: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    d_ff: int = 256,
    dtype: str = "float32",
    seed: int = 0,
) -> dict:
    """Shapes and dtypes after every sub-layer of a small GPT forward (``steps``, ``bt_c``: the
    shape is (B, T, C); with the per-head q/k/v and scores SDPA hides), ``dtype_kept``, the ``loss``
    and each gradient's norm."""
    cfg = ModelConfig(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        d_ff=d_ff,
        block_size=seq_len,
        vocab_size=TRACE_VOCAB,
        dropout=0.0,
    )
    with seeded(seed):
        model = GPT(cfg).to(DTYPES[dtype])
    steps: list[dict] = []
    block_dtypes: list[tuple[torch.dtype, torch.dtype]] = []
    bt_c = (batch, seq_len, n_embd)

    def note(name: str, t: torch.Tensor) -> None:
        steps.append(
            {
                "name": name,
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "bt_c": tuple(t.shape) == bt_c,
            }
        )

    def after(name):
        return lambda module, args, out: note(name, out)

    def before(name):
        return lambda module, args: note(name, args[0])

    def qkv(name, attn):
        def hook(module, args, out):
            note(f"{name} c_attn [q|k|v]", out)
            B, T, _ = out.shape
            q, k, v = out.split([n_embd, attn.kv_dim, attn.kv_dim], dim=2)
            q = q.view(B, T, attn.n_head, attn.head_dim).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, attn.n_kv_head, attn.head_dim).transpose(1, 2)
            note(f"{name} q, k, v per head", q)
            note(
                f"{name} scores q·kᵀ/√hs (causal)",
                q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim),
            )

        return hook

    hooks = [
        model.wte.register_forward_hook(after("wte (token embedding)")),
        model.wpe.register_forward_hook(after("wpe (positions, added)")),
    ]
    for i, blk in enumerate(model.h):
        p = f"h.{i}"
        hooks += [
            blk.register_forward_pre_hook(before(f"{p} input")),
            blk.ln_1.register_forward_hook(after(f"{p} ln_1")),
            blk.attn.c_attn.register_forward_hook(qkv(f"{p} attn", blk.attn)),
            blk.attn.c_proj.register_forward_pre_hook(before(f"{p} attn heads merged")),
            blk.attn.register_forward_hook(after(f"{p} attn c_proj (W_O)")),
            blk.ln_2.register_forward_pre_hook(before(f"{p} x + attn (residual)")),
            blk.ln_2.register_forward_hook(after(f"{p} ln_2")),
            blk.mlp.c_fc.register_forward_hook(after(f"{p} mlp c_fc")),
            blk.mlp.c_proj.register_forward_pre_hook(before(f"{p} mlp {cfg.ffn}")),
            blk.mlp.register_forward_hook(after(f"{p} mlp c_proj")),
            blk.register_forward_hook(after(f"{p} x + mlp (block output)")),
            blk.register_forward_hook(
                lambda m, args, out: block_dtypes.append((args[0].dtype, out.dtype))
            ),
        ]
    hooks += [
        model.ln_f.register_forward_hook(after("ln_f")),
        model.lm_head.register_forward_hook(after("lm_head")),
    ]
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(TRACE_VOCAB, (batch, seq_len), generator=g)
    targets = torch.randint(TRACE_VOCAB, (batch, seq_len), generator=g)
    try:
        _, loss = model(idx, targets)
    finally:
        for h in hooks:
            h.remove()
    loss.backward()
    grads = {
        name: float(p.grad.float().norm())
        for name, p in model.named_parameters()
        if p.grad is not None
    }
    return {
        "config": {
            "n_layer": n_layer,
            "batch": batch,
            "seq_len": seq_len,
            "n_embd": n_embd,
            "n_head": n_head,
            "d_ff": cfg.ffn_hidden,
            "vocab_size": TRACE_VOCAB,
        },
        "dtype": dtype,
        "steps": steps,
        "dtype_kept": all(a == b for a, b in block_dtypes),
        "loss": loss.item(),
        "grad_norms": grads,
    }


def block(
    n_embd: int = 64,
    n_head: int = 4,
    d_ff: int = 256,
    seq_len: int = 8,
    activation: str = "gelu",
    seed: int = 0,
    with_trace: bool = False,
    n_layer: int = 2,
    batch: int = 2,
    trace_len: int = 4,
    dtype: str = "float32",
    output: Optional[Path] = None,
) -> dict:
    """Pre-LN and Post-LN blocks against ``nn.TransformerEncoderLayer`` (``pre``, ``post``:
    :func:`compare`'s numbers), and with ``with_trace`` :func:`trace`'s. Raises MinigptError: n_embd
    not divisible by n_head (the CLI checks the sizes, activation and dtype).
    """
    assert (
        activation in ("relu", "gelu")
        and dtype in DTYPES
        and min(n_embd, n_head, d_ff, seq_len, batch) >= 1
    )
    check_heads(n_embd, n_head)
    runs = {
        p: compare(p, n_embd, n_head, d_ff, seq_len, batch, activation, seed)
        for p in ("pre", "post")
    }
    result = {
        "config": {
            "n_embd": n_embd,
            "n_head": n_head,
            "d_ff": d_ff,
            "seq_len": seq_len,
            "batch": batch,
            "activation": activation,
            "seed": seed,
        },
        **{
            p: {k: v for k, v in r.items() if k not in ("ours", "reference", "unmasked")}
            for p, r in runs.items()
        },
        "trace": trace(n_layer, batch, trace_len, n_embd, n_head, d_ff, dtype, seed)
        if with_trace
        else None,
        "png": None,
    }
    return drawn(result, output, _plot, runs)


def format_block(r: dict) -> str:
    """The text report of :func:`block`."""
    c = r["config"]
    lines = [
        f"one block, d = {c['n_embd']}, {c['n_head']} heads, d_ff = {c['d_ff']}, {c['activation']}, "
        f"B = {c['batch']}, T = {c['seq_len']}, causal mask, float32:"
    ]
    for key, label in (
        ("pre", "Pre-LN  (norm_first=True;  GPT-2, Xiong et al. 2020)"),
        ("post", "Post-LN (norm_first=False; Vaswani et al. 2017)"),
    ):
        lines.append(
            f"  {label}: max |ours − nn.TransformerEncoderLayer| = {r[key]['max_error']:.1e}"
            f"   (without the mask: {r[key]['max_error_without_mask']:.2f})"
        )
    t = r["trace"]
    if t is not None:
        k = t["config"]
        lines.append(
            f"trace: {k['n_layer']} blocks, B = {k['batch']}, T = {k['seq_len']}, C = {k['n_embd']}, "
            f"{k['n_head']} heads, d_ff = {k['d_ff']}, vocabulary {k['vocab_size']}, {t['dtype']} "
            "(* marks a shape other than (B, T, C))"
        )
        width = max(len(s["name"]) for s in t["steps"])
        for s in t["steps"]:
            shape = "(" + ", ".join(map(str, s["shape"])) + ")"
            lines.append(
                f"  {s['name']:<{width}}  {shape:<16} {s['dtype']:<9}{'' if s['bt_c'] else ' *'}"
            )
        lines.append(
            f"  every block returns its input's dtype: {'yes' if t['dtype_kept'] else 'NO'}"
        )
        lines.append(
            f"gradient norms after one backward pass (cross-entropy {t['loss']:.4f} on random targets):"
        )
        width = max(len(n) for n in t["grad_norms"])
        for name, norm in t["grad_norms"].items():
            lines.append(f"  {name:<{width}}  {norm:.3e}")
    return report(lines, r)


def _plot(r: dict, runs: dict, folder: Path) -> str:
    t = r["trace"]
    fig = new_figure(15 if t else 10, 5)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12 if not t else 0.3, top=0.9, wspace=0.3)
    panels = 3 if t else 2
    for i, key in enumerate(("pre", "post")):
        ax = fig.add_subplot(1, panels, i + 1)
        ours, ref = runs[key]["ours"], runs[key]["reference"]
        low, high = min(ours + ref), max(ours + ref)
        ax.plot([low, high], [low, high], color="grey", linewidth=0.8, label="y = x")
        ax.plot(
            runs[key]["unmasked"],
            ours,
            ".",
            markersize=3,
            color="tab:orange",
            alpha=0.5,
            label="torch without the causal mask",
        )
        ax.plot(
            ref, ours, ".", markersize=3, color="tab:blue", label="torch, causal mask: the check"
        )
        decorate(
            ax,
            "nn.TransformerEncoderLayer",
            "minigpt Block",
            f"{'Pre' if key == 'pre' else 'Post'}-LN: max |difference| {r[key]['max_error']:.1e}",
            loc="upper left",
        )
    if t:
        ax = fig.add_subplot(1, panels, 3)
        names = list(t["grad_norms"])
        ax.bar(range(len(names)), [t["grad_norms"][n] for n in names], color="tab:green")
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_title("gradient norm per parameter (one backward)")
    return save_png(fig, folder, "block.png")
