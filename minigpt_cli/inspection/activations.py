"""``minigpt inspect activations``: ReLU, GELU, GELU-tanh and SiLU, and how far apart GELU's two
forms are.

ReLU max(0, x) (Vaswani et al. 2017 §3.3); GELU x·Φ(x) and its tanh form 0.5·x·(1 +
tanh(sqrt(2/π)·(x +
0.044715·x³))) (Hendrycks & Gimpel 2016 §2); SiLU x·σ(x) (Elfwing et al. 2018); float64, the MLP's
own calls.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ..errors import MinigptError
from .figures import decorate, drawn, new_figure, report, save_png

#: The difference GELU − GELU-tanh is searched on [-SEARCH, SEARCH] with step STEP (it vanishes far
#: out).
SEARCH = 10.0
STEP = 1e-4
#: Where the table of values is taken.
TABLE_AT = (-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)

FUNCTIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def activations(lo: float = -4.0, hi: float = 4.0, output: Optional[Path] = None) -> dict:
    """The four activations at :data:`TABLE_AT` and max |GELU − GELU-tanh| with its x > 0
    (``output``: a folder). Raises MinigptError: a range that is not two finite numbers, lo < hi.
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise MinigptError(
            f"--range {lo},{hi}: give two finite numbers, the first below the second; "
            "e.g. --range -4,4"
        )
    # GELU(−x) = GELU(x) − x for both forms, so their difference is even: x >= 0 is searched alone
    x = torch.arange(0.0, SEARCH + STEP / 2, STEP, dtype=torch.float64)
    diff = (F.gelu(x) - F.gelu(x, approximate="tanh")).abs()
    at = int(diff.argmax())
    points = torch.tensor(TABLE_AT, dtype=torch.float64)
    table = {
        "x": list(TABLE_AT),
        **{name: [float(v) for v in f(points)] for name, f in FUNCTIONS.items()},
    }
    result = {
        "range": [lo, hi],
        "table": table,
        "gelu_tanh_max_error": float(diff[at]),
        "gelu_tanh_max_error_at": float(x[at]),
        "png": None,
    }
    return drawn(result, output, _plot)


def format_activations(r: dict) -> str:
    """The text report of :func:`activations`."""
    t = r["table"]
    names = {"relu": "ReLU", "gelu": "GELU x·Φ(x)", "gelu_tanh": "GELU-tanh", "silu": "SiLU x·σ(x)"}
    lines = [
        "activations (ReLU: Vaswani et al. 2017; GELU and its tanh form: Hendrycks & Gimpel 2016; "
        "SiLU: Elfwing et al. 2018)",
        f"  {'x':<13}" + "".join(f"{v:>9g}" for v in t["x"]),
    ]
    for key, label in names.items():
        lines.append(f"  {label:<13}" + "".join(f"{v:9.4f}" for v in t[key]))
    err, at = r["gelu_tanh_max_error"], r["gelu_tanh_max_error_at"]
    lines.append(
        f"  max |GELU − GELU-tanh| = {err:.3e} at x = ±{at:.3f} "
        f"(searched on [−{SEARCH:g}, {SEARCH:g}], step {STEP:g})"
    )
    return report(lines, r)


def _plot(r: dict, folder: Path) -> str:
    lo, hi = r["range"]
    x = torch.linspace(lo, hi, 801, dtype=torch.float64)
    fig = new_figure(12, 4.8)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.9, wspace=0.25)
    ax = fig.add_subplot(1, 2, 1)
    styles = {
        "relu": ("ReLU", "-"),
        "gelu": ("GELU", "-"),
        "gelu_tanh": ("GELU-tanh", "--"),
        "silu": ("SiLU", "-"),
    }
    for key, (label, style) in styles.items():
        ax.plot(x, FUNCTIONS[key](x), style, label=label, linewidth=1.5)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.axvline(0, color="grey", linewidth=0.5)
    decorate(ax, "x", None, "activations")
    ax = fig.add_subplot(1, 2, 2)
    span = max(abs(lo), abs(hi), r["gelu_tanh_max_error_at"] + 1)
    xs = torch.linspace(-span, span, 2001, dtype=torch.float64)
    ax.plot(xs, F.gelu(xs) - F.gelu(xs, approximate="tanh"), color="tab:purple")
    a, e = r["gelu_tanh_max_error_at"], r["gelu_tanh_max_error"]
    sign = math.copysign(
        1.0,
        float(
            F.gelu(torch.tensor(a, dtype=torch.float64))
            - F.gelu(torch.tensor(a, dtype=torch.float64), approximate="tanh")
        ),
    )
    ax.plot(
        [-a, a],
        [sign * e, sign * e],
        "o",
        color="tab:red",
        label=f"max |difference| {e:.3e} at x = ±{a:.3f}",
    )
    ax.axhline(0, color="grey", linewidth=0.5)
    decorate(ax, "x", None, "GELU − GELU-tanh", loc="center")
    return save_png(fig, folder, "activations.png")
