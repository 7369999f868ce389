"""``minigpt inspect positions``: the sinusoidal table, what its dot products and rotations say, and
RoPE.

Vaswani et al. 2017 §3.5: p[t, 2i] = sin(t·ω_i), p[t, 2i+1] = cos(t·ω_i), ω_i = base^(-2i/d), so
p_t·p_s = Σ_i cos(ω_i (t − s)) and p_{t+k} = R_k p_t; RoPE (Su et al. 2021 §3.4) rotates q and k
after the projection, so (R_t q)·(R_s k) depends on s − t alone, while (p_t W_Q)·(p_s W_K) does not.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..errors import MinigptError
from ..model.gpt import apply_rope, rope_cos_sin, sinusoidal_table
from .figures import decorate, drawn, new_figure, num, report, save_png

#: Offsets k at which p(t+k) = R_k p(t) is checked for every t.
ROTATION_OFFSETS = (1, 7, 100)
#: The offset of the q·k pairs, and their first positions.
PAIR_OFFSET = 3
PAIR_STARTS = (0, 10, 100, 1000)
#: The rising steps are counted in 0..RISE_WINDOW.
RISE_WINDOW = 1024
#: Rows of the heatmap: the first positions only (thousands of rows alias the fast dimensions).
HEATMAP_ROWS = 256


def sinusoidal_table64(n_pos: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The model's sinusoidal table (Vaswani et al. 2017 §3.5) before its float32 rounding: (n_pos,
    dim), float64."""
    return sinusoidal_table(n_pos, dim, base, torch.float64)


def rotation(k: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """R_k (dim, dim), float64: blockdiag over pairs of [[cos ω_i k, sin ω_i k], [−sin ω_i k, cos
    ω_i k]], so that p_{t+k} = R_k p_t for the table's column vectors (Vaswani et al. 2017 §3.5)."""
    omega = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    c, s = torch.cos(omega * k), torch.sin(omega * k)
    return torch.block_diag(
        *[
            torch.tensor([[ci, si], [-si, ci]], dtype=torch.float64)
            for ci, si in zip(c.tolist(), s.tolist())
        ]
    )


def _rope_cos_sin64(
    positions: torch.Tensor, dim: int, base: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~minigpt_cli.model.gpt.rope_cos_sin`'s layout (θ_0..θ_{d/2−1} twice) in float64."""
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.double()[:, None] * theta[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def _rope_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    starts: Sequence[int],
    offset: int,
    dim: int,
    base: float,
    exact: bool,
) -> list[float]:
    """(R_t q)·(R_{t+offset} k) for each t in ``starts``, through the model's apply_rope."""
    t = torch.tensor(list(starts))
    cs_t = _rope_cos_sin64(t, dim, base) if exact else rope_cos_sin(t, dim, base)
    cs_s = _rope_cos_sin64(t + offset, dim, base) if exact else rope_cos_sin(t + offset, dim, base)
    dtype = torch.float64 if exact else torch.float32
    n = len(starts)
    qr = apply_rope(q.to(dtype).expand(1, 1, n, dim), *cs_t)[0, 0]  # (n, dim)
    kr = apply_rope(k.to(dtype).expand(1, 1, n, dim), *cs_s)[0, 0]
    return [float(v) for v in (qr * kr).sum(-1)]


def _scores(values: list[float]) -> dict:
    return {"scores": values, "spread": max(values) - min(values)}


def positions(
    dim: int = 128,
    max_len: int = 4096,
    base: float = 10000.0,
    seed: int = 0,
    output: Optional[Path] = None,
) -> dict:
    """The sinusoidal table's p0·pk ``curve``, the ``rotation`` check (largest |p(t+k) − R_k p(t)|)
    and the q·k scores with and without RoPE, each {``scores``, ``spread``}; ``seed`` seeds W_Q, W_K
    ~ N(0, 1/d). Raises MinigptError: an odd ``dim``, ``base`` ≤ 1.
    """
    assert dim >= 2 and max_len >= 2, (dim, max_len)
    if dim % 2:
        raise MinigptError(
            f"--dim {dim}: sinusoidal positions pair dimensions (sin, cos), so the width must be "
            f"even; e.g. --dim {dim + 1}"
        )
    if not (math.isfinite(base) and base > 1):
        raise MinigptError(
            f"--base {base}: the frequency base must be a finite number above 1; "
            "Vaswani et al. use 10000"
        )
    table = sinusoidal_table64(max_len, dim, base)  # (max_len, dim)
    curve = table @ table[0]  # p0·pk, k = 0..max_len-1
    up = (curve[1:] > curve[:-1]).nonzero().flatten() + 1  # the k with a rise from k-1 to k
    window = min(RISE_WINDOW, max_len - 1)
    lowest = int(curve.argmin())
    offsets = [k for k in ROTATION_OFFSETS if k < max_len] or [1]
    error = max(
        float((table[k:] - table[:-k] @ rotation(k, dim, base).T).abs().max()) for k in offsets
    )

    starts = [t for t in PAIR_STARTS if t + PAIR_OFFSET < max_len] or [0]
    offset = min(PAIR_OFFSET, max_len - 1)
    g = torch.Generator().manual_seed(seed)
    w_q = torch.randn(dim, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)
    w_k = torch.randn(dim, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)
    x_q = torch.randn(dim, generator=g, dtype=torch.float64)
    x_k = torch.randn(dim, generator=g, dtype=torch.float64)
    pt = sinusoidal_table64(max(starts) + offset + 1, dim, base)
    identity = [float(pt[t] @ pt[t + offset]) for t in starts]
    projected = [float((pt[t] @ w_q) @ (pt[t + offset] @ w_k)) for t in starts]
    q, k = x_q @ w_q, x_k @ w_k
    result = {
        "dim": dim,
        "max_len": max_len,
        "base": base,
        "seed": seed,
        "curve": [float(v) for v in curve],
        "first_rise": int(up[0]) if len(up) else None,
        "rising_steps": int((up <= window).sum()),
        "rise_window": window,
        "minimum": float(curve[lowest]),
        "minimum_at": lowest,
        "longest_wavelength": 2 * math.pi * base ** ((dim - 2) / dim),
        "shortest_wavelength": 2 * math.pi,
        "rotation": {"offsets": offsets, "max_error": error},
        "pairs": {"offset": offset, "starts": starts},
        "sinusoidal_identity": _scores(identity),
        "sinusoidal_projected": _scores(projected),
        "rope": _scores(_rope_scores(q, k, starts, offset, dim, base, exact=True)),
        "rope_float32": _scores(_rope_scores(q, k, starts, offset, dim, base, exact=False)),
        "png": None,
    }
    return drawn(result, output, _plot, table[:HEATMAP_ROWS])


def format_positions(r: dict) -> str:
    """The text report of :func:`positions`."""
    curve = r["curve"]
    rise = f"first rise at k = {r['first_rise']}" if r["first_rise"] is not None else "no rise"
    pairs = r["pairs"]
    lines = [
        f"sinusoidal positions: d = {r['dim']}, base {num(r['base'])}, positions 0..{r['max_len'] - 1} "
        f"(Vaswani et al. 2017 §3.5)",
        f"  p0·pk = Σ_i cos(ω_i k): {num(curve[0], 3)} at k = 0; {rise}; {r['rising_steps']} rising steps in "
        f"0..{r['rise_window']}; minimum {r['minimum']:.2f} at k = {r['minimum_at']}",
        f"  wavelengths 2π/ω_i: from {r['shortest_wavelength']:.4f} (i = 0) to {r['longest_wavelength']:,.1f} "
        f"(i = {r['dim'] // 2 - 1})",
        f"  p(t+k) = R_k p(t): max |difference| {r['rotation']['max_error']:.1e} for k = "
        f"{', '.join(map(str, r['rotation']['offsets']))}, every t",
        f"q·k for the pairs (t, t+{pairs['offset']}), t = {', '.join(map(str, pairs['starts']))}:",
    ]
    rows = [
        ("sinusoidal p_t·p_s (no projection)", "sinusoidal_identity", "same for every t"),
        ("sinusoidal after random W_Q, W_K", "sinusoidal_projected", "depends on t: not relative"),
        ("RoPE after random W_Q, W_K", "rope", "relative: depends on the offset only"),
        ("RoPE, the model's float32 angles", "rope_float32", "float32 rounding of the angles"),
    ]
    for label, key, note in rows:
        s = r[key]
        scores = "  ".join(f"{v:9.4f}" for v in s["scores"])
        lines.append(f"  {label:<36}{scores}   spread {s['spread']:.1e} ({note})")
    lines.append(
        "  (RoPE: Su et al. 2021 §3.4; W_Q, W_K entries N(0, 1/d), seed "
        f"{r['seed']}; RoPE's q, k from random content vectors)"
    )
    return report(lines, r)


def _plot(r: dict, heat: torch.Tensor, folder: Path) -> str:
    fig = new_figure(13, 6.5)
    grid = fig.add_gridspec(
        2,
        2,
        width_ratios=[1, 1.25],
        left=0.06,
        right=0.98,
        bottom=0.08,
        top=0.93,
        wspace=0.28,
        hspace=0.38,
    )
    ax = fig.add_subplot(grid[:, 0])
    im = ax.imshow(
        heat.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest"
    )
    ax.set_xlabel("dimension (2i: sin, 2i+1: cos)")
    ax.set_ylabel("position t")
    ax.set_title(f"sinusoidal table p[t, :], d = {r['dim']}, positions 0..{heat.shape[0] - 1}")
    fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)

    ax = fig.add_subplot(grid[0, 1])
    curve = r["curve"]
    ax.plot(range(len(curve)), curve, color="tab:blue", linewidth=0.8)
    ax.axhline(0, color="grey", linewidth=0.5)
    if r["first_rise"] is not None:
        k = r["first_rise"]
        ax.plot([k], [curve[k]], "o", color="tab:orange", label=f"first rise, k = {k}")
    ax.plot(
        [r["minimum_at"]],
        [r["minimum"]],
        "v",
        color="tab:red",
        label=f"minimum {r['minimum']:.2f} at k = {r['minimum_at']}",
    )
    ax.set_xscale("symlog", linthresh=16)
    decorate(
        ax,
        "offset k (linear to 16, then log)",
        "p0 · pk",
        f"p0·pk = Σ cos(ω_i k): {r['rising_steps']} rising steps in 0..{r['rise_window']}",
        loc="upper right",
        fontsize=8,
    )

    ax = fig.add_subplot(grid[1, 1])
    starts = r["pairs"]["starts"]
    for key, label, marker in (
        ("sinusoidal_identity", "sinusoidal, no projection", "s"),
        ("sinusoidal_projected", "sinusoidal, random W_Q, W_K", "o"),
        ("rope", "RoPE, random W_Q, W_K", "^"),
    ):
        ax.plot(
            range(len(starts)),
            r[key]["scores"],
            marker=marker,
            label=f"{label} (spread {r[key]['spread']:.1e})",
        )
    ax.set_xticks(range(len(starts)), [f"({t}, {t + r['pairs']['offset']})" for t in starts])
    decorate(
        ax,
        "pair of positions (t, s), s − t fixed",
        "score",
        "q·k at equal offsets: flat lines are relative",
        fontsize=8,
    )
    return save_png(fig, folder, "positions.png")
