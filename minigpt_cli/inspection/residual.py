"""``minigpt inspect residual``: how the residual stream grows with depth, and what 1/sqrt(2L) does
to it.

Each Pre-LN block adds two branches, so after L blocks the RMS grows like sqrt(2L); GPT-2 (Radford
et al. 2019 §2.3) scales each branch's last layer at init by 1/sqrt(2L), which keeps it flat (Xiong
et al. 2020).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..config.schema import ModelConfig
from ..errors import MinigptError
from ..model.gpt import GPT
from ..run import folder as runs
from .figures import check_heads, decorate, drawn, new_figure, report, save_png, seeded
from .run_model import open_run


def _rms(t: torch.Tensor) -> float:
    """RMS of a stream (B, T, C), per token then averaged."""
    return float(t.float().pow(2).mean(-1).sqrt().mean())


def stream_rms(blocks: Sequence[torch.nn.Module], x: torch.Tensor) -> list[float]:
    """RMS of the residual stream ``x`` (B, T, C), per token then averaged, before and after each
    block (L + 1)."""
    out = [_rms(x)]
    with torch.no_grad():
        for blk in blocks:
            x = blk(x)
            out.append(_rms(x))
    return out


def scale_branch_outputs(model: GPT, n_layer: int) -> None:
    """Multiply every ``c_proj.weight`` (each branch's last layer) by 1/sqrt(2·n_layer) in place
    (GPT-2 §2.3), on the same draw, so that the two streams differ by the rule alone."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight"):
                p.mul_(1 / math.sqrt(2 * n_layer))


def _mean_std(rows: list[list[float]]) -> tuple[list[float], list[float]]:
    t = torch.tensor(rows, dtype=torch.float64)
    std = t.std(0) if len(rows) > 1 else torch.zeros(t.shape[1], dtype=torch.float64)
    return t.mean(0).tolist(), std.tolist()


def residual(
    depths: Sequence[int] = (4, 16, 64),
    seeds: int = 8,
    n_embd: int = 64,
    n_head: int = 4,
    seq_len: int = 64,
    init_std: Optional[float] = None,
    output: Optional[Path] = None,
) -> dict:
    """RMS of the residual stream after each block at init, with and without 1/sqrt(2L), over
    ``seeds`` draws of unit-variance input; ``init_std`` None is 1/sqrt(n_embd), so that every
    branch writes O(1) and growth shows. Raises MinigptError: n_embd not divisible by n_head (the
    CLI checks the counts).
    """
    assert depths and min(depths) >= 1 and min(seeds, n_embd, n_head, seq_len) >= 1
    check_heads(n_embd, n_head)
    std = init_std if init_std is not None else 1 / math.sqrt(n_embd)
    result_depths = []
    for L in sorted(set(depths)):
        curves: dict[str, list[list[float]]] = {"unscaled": [], "scaled": []}
        for seed in range(seeds):
            x = torch.randn(
                1, seq_len, n_embd, generator=torch.Generator().manual_seed(10_000 + seed)
            )
            cfg = ModelConfig(
                n_layer=L,
                n_head=n_head,
                n_embd=n_embd,
                block_size=seq_len,
                vocab_size=1,
                dropout=0.0,
                bias=False,
                init_std=std,
                scale_residual_init=False,
            )
            with seeded(seed):
                model = GPT(cfg).eval()
            curves["unscaled"].append(stream_rms(model.h, x))
            scale_branch_outputs(model, L)
            curves["scaled"].append(stream_rms(model.h, x))
        entry = {"layers": L}
        for key, rows in curves.items():
            mean, spread = _mean_std(rows)
            entry[key] = {"mean": mean, "std": spread}
        result_depths.append(entry)
    growth = [
        {
            "from": a["layers"],
            "to": b["layers"],
            "ratio": b["unscaled"]["mean"][-1] / a["unscaled"]["mean"][-1],
            "sqrt_depth_ratio": math.sqrt(b["layers"] / a["layers"]),
        }
        for a, b in zip(result_depths, result_depths[1:])
    ]
    result = {
        "config": {
            "n_embd": n_embd,
            "n_head": n_head,
            "seq_len": seq_len,
            "seeds": seeds,
            "init_std": std,
        },
        "depths": result_depths,
        "growth": growth,
        "png": None,
    }
    return drawn(result, output, _plot)


def _val_windows(
    run: Path, cfg, tok, count: int, seed: int, echo: Callable[[str], None]
) -> torch.Tensor:
    """``count`` windows of block_size tokens from the run's validation split (its prepared token
    files)."""
    from ..data.pipeline import (
        corpus_on_disk,
        corpus_root,
        eval_offsets,
        run_corpus_config,
        windows,
    )
    from ..data.preparation import prepare

    cfg = run_corpus_config(cfg, run)  # found from any folder, as train read it
    corpus = corpus_on_disk(cfg)
    if corpus is None:
        raise MinigptError(
            f"the run's corpus ({cfg.data.path or cfg.data.dataset}) is not on disk, so there is "
            "no validation text to run; prepare it with: "
            f"minigpt prepare {Path(run) / runs.CONFIG}"
        )
    data = prepare(
        corpus, tok, corpus_root(cfg, corpus), cfg.data.val_fraction, log=echo, progress=False
    )
    block = cfg.model.block_size
    if len(data.val) <= block:
        raise MinigptError(
            f"the run's validation split has {len(data.val)} tokens, too few for one window of "
            f"block_size {block}"
        )
    offsets = next(eval_offsets(len(data.val), block, count, seed))
    x, _ = windows(data.val, offsets, block, torch.device("cpu"))
    return x


def model_stream_rms(model: GPT, idx: torch.Tensor) -> list[float]:
    """:func:`stream_rms` inside ``model``'s own forward on ``idx`` (B, T): the stream entering the
    first block, then after each block, whatever GPT.forward passes a block (rotary angles, value
    embeddings)."""
    out: list[float] = []
    hooks = [model.h[0].register_forward_pre_hook(lambda module, args: out.append(_rms(args[0])))]
    hooks += [
        blk.register_forward_hook(lambda module, args, y: out.append(_rms(y))) for blk in model.h
    ]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in hooks:
            h.remove()
    return out


def residual_run(
    run: str | Path,
    checkpoint: str = runs.BEST,
    windows: int = 8,
    seed: int = 0,
    output: Optional[Path] = None,
    echo: Callable[[str], None] = lambda m: None,
) -> dict:
    """RMS of a trained run's residual stream (``trained``) and of its architecture at init
    (``init``) after the embedding and each block, on validation windows. Raises MinigptError: as
    :func:`~.run_model.open_run`; the corpus is not on disk; a split shorter than a window.
    """
    model, cfg, tok, ckpt = open_run(run, checkpoint, echo)
    idx = _val_windows(Path(run), cfg, tok, windows, seed, echo)
    trained = model_stream_rms(model, idx)
    with seeded(cfg.seed):
        fresh = GPT(cfg.model).eval()
    init = model_stream_rms(fresh, idx)
    result = {
        "run": str(run),
        "checkpoint": ckpt,
        "layers": cfg.model.n_layer,
        "windows": windows,
        "block_size": cfg.model.block_size,
        "scale_residual_init": cfg.model.scale_residual_init,
        "trained": trained,
        "init": init,
        "png": None,
    }
    return drawn(result, output, _plot_run)


def format_residual(r: dict) -> str:
    """The text report of :func:`residual` or :func:`residual_run`."""
    if "trained" in r:
        lines = [
            f"residual stream RMS of {r['run']} ({r['checkpoint']}), {r['windows']} validation windows of "
            f"{r['block_size']} tokens; 1/√(2L) init: {'on' if r['scale_residual_init'] else 'off'}",
            f"  {'after':<12}{'trained':>10}{'at init':>10}",
        ]
        for i, (a, b) in enumerate(zip(r["trained"], r["init"])):
            lines.append(f"  {'embedding' if i == 0 else f'block {i - 1}':<12}{a:10.4f}{b:10.4f}")
    else:
        c = r["config"]
        lines = [
            f"residual stream RMS at init after the last block (per token; mean ± std over {c['seeds']} seeds), "
            f"d = {c['n_embd']}, {c['n_head']} heads, T = {c['seq_len']}, init std {c['init_std']:.4g}, "
            "input RMS ≈ 1",
            f"  {'blocks L':>8}   {'without 1/√(2L)':>17}   {'with 1/√(2L)':>15}",
        ]
        for d in r["depths"]:
            u, s = d["unscaled"], d["scaled"]
            lines.append(
                f"  {d['layers']:>8}   {u['mean'][-1]:>8.3f} ± {u['std'][-1]:<6.3f}   "
                f"{s['mean'][-1]:>6.3f} ± {s['std'][-1]:.3f}"
            )
        for g in r["growth"]:
            lines.append(
                f"  L {g['from']} → {g['to']}: without scaling ×{g['ratio']:.2f} "
                f"(√({g['to']}/{g['from']}) = {g['sqrt_depth_ratio']:.2f})"
            )
        lines.append(
            "  (GPT-2's init, Radford et al. 2019 §2.3: each branch's last layer scaled by 1/√(2L))"
        )
    return report(lines, r)


def _plot(r: dict, folder: Path) -> str:
    fig = new_figure(13, 5)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.9, wspace=0.22)
    ax = fig.add_subplot(1, 2, 1)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for i, d in enumerate(r["depths"]):
        L, color = d["layers"], colors[i % len(colors)]
        frac = [k / L for k in range(L + 1)]
        for key, style, label in (("unscaled", "-", "without"), ("scaled", "--", "with")):
            mean, std = d[key]["mean"], d[key]["std"]
            ax.plot(frac, mean, style, color=color, label=f"L = {L}, {label} 1/√(2L)")
            ax.fill_between(
                frac,
                [m - s for m, s in zip(mean, std)],
                [m + s for m, s in zip(mean, std)],
                color=color,
                alpha=0.15,
            )
    decorate(
        ax,
        "depth l / L (0: the input)",
        "RMS of the residual stream",
        f"at init, mean ± std over {r['config']['seeds']} seeds",
        fontsize=8,
    )
    ax = fig.add_subplot(1, 2, 2)
    Ls = [d["layers"] for d in r["depths"]]
    for key, marker, label in (
        ("unscaled", "o-", "without 1/√(2L)"),
        ("scaled", "s--", "with 1/√(2L)"),
    ):
        ax.errorbar(
            Ls,
            [d[key]["mean"][-1] for d in r["depths"]],
            yerr=[d[key]["std"][-1] for d in r["depths"]],
            fmt=marker,
            capsize=3,
            label=label,
        )
    first = r["depths"][0]["unscaled"]["mean"][-1]
    ax.plot(Ls, [first * math.sqrt(L / Ls[0]) for L in Ls], ":", color="grey", label="∝ √L")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(Ls, [str(L) for L in Ls])
    top = max(d["unscaled"]["mean"][-1] + d["unscaled"]["std"][-1] for d in r["depths"])
    ticks = [2.0**k for k in range(-1, 12) if 2.0**k <= 2 * top]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    decorate(ax, "blocks L", "RMS after the last block", "final RMS against depth")
    return save_png(fig, folder, "residual.png")


def _plot_run(r: dict, folder: Path) -> str:
    fig = new_figure(8, 5)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.12, top=0.9)
    ax = fig.add_subplot()
    layers = range(len(r["trained"]))
    ax.plot(layers, r["trained"], "o-", label=f"trained ({r['checkpoint']})")
    ax.plot(layers, r["init"], "s--", label="same architecture at init")
    ax.set_xticks(list(layers), ["emb"] + [str(i) for i in range(len(r["trained"]) - 1)])
    decorate(
        ax,
        "after block",
        "RMS of the residual stream",
        f"{Path(r['run']).name}: {r['windows']} validation windows",
    )
    return save_png(fig, folder, "residual.png")
