"""``minigpt inspect ffn``: a tiny position-wise feed-forward pass, step by step, and SwiGLU's width
rule.

FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017 §3.3), row vectors: x (1, d_model), W1
(d_model, d_ff), W2 (d_ff, d_model); SwiGLU: Swish(x W1) ⊙ (x V) (Shazeer 2020 eq. 6). SwiGLU's d_ff
= 2/3·4d rounded up to ``multiple_of`` keeps 3·d·d_ff near a 4d MLP's 8d² (Llama: d = 4096 gives
11008).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..config.schema import ModelConfig
from ..errors import MinigptError
from ..fileio import JSON_BOUNDS, read_text_file
from ..model.gpt import MLP
from .activations import FUNCTIONS
from .figures import drawn, new_figure, num, report, save_png, shape, vector

#: The default example, d_model = 2, d_ff = 3, ReLU: every product is exact in halves and ReLU turns a
#: different unit off for each x.
EXAMPLE = {
    "activation": "relu",
    "W1": [[1.0, -1.0, 0.5], [0.5, 1.0, -1.0]],
    "b1": [0.0, 0.0, 0.0],
    "W2": [[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]],
    "b2": [0.0, 0.0],
}
EXAMPLE_XS = ((1.0, 2.0), (2.0, -1.0))
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
#: Keys a weights file may hold.
KEYS = {"activation", "W1", "b1", "W2", "b2", "V"}


def read_weights(path: Path) -> dict:
    """A weights file: a JSON object of :data:`KEYS` (``W1``, ``W2``; ``V`` for swiglu;
    ``activation``: relu). Raises MinigptError: unreadable, not JSON, unknown keys, values that are
    not numbers, a missing matrix, an unknown activation.
    """
    example = json.dumps(EXAMPLE, separators=(",", ":"))
    try:
        obj = json.loads(read_text_file(path, "--weights", JSON_BOUNDS))
    except (json.JSONDecodeError, RecursionError) as exc:  # not JSON, or nested past Python's stack
        raise MinigptError(f"--weights {path}: {exc}; give a JSON file such as {example}") from None
    if not isinstance(obj, dict):
        raise MinigptError(
            f"--weights {path}: the file must hold one JSON object with W1, W2 "
            "(b1, b2 optional; V for swiglu)"
        )
    act = obj.get("activation", "relu")
    unknown = [key for key in obj if key not in KEYS]
    if unknown:
        raise MinigptError(
            f"--weights {path}: unknown key {unknown[0]!r}; use {', '.join(sorted(KEYS))}"
        )
    missing = [key for key in ("W1", "W2") + (("V",) if act == "swiglu" else ()) if key not in obj]
    if missing:
        raise MinigptError(f"--weights {path}: {missing[0]} is missing")
    bad = [key for key in sorted(KEYS - {"activation"}) if key in obj and not _numbers(obj[key])]
    if bad:
        raise MinigptError(
            f"--weights {path}: {bad[0]} must be a list of numbers (a matrix: a list of rows)"
        )
    if act not in ACTIVATIONS:
        raise MinigptError(
            f"--weights {path}: activation {act!r}: use one of {', '.join(ACTIVATIONS)}"
        )
    return obj


def _numbers(value) -> bool:
    if isinstance(value, list):
        return all(_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shape_problem(w: dict, xs: Sequence[Sequence[float]]) -> Optional[str]:
    """What does not fit: each weight against W1's (d_model, d_ff), then the inputs; or None."""
    w1 = shape(w["W1"])
    if len(w1) != 2 or 0 in w1:
        return (
            "W1 must be a matrix, a list of d_model rows of d_ff numbers each, "
            "e.g. [[1, -1, 0.5], [0.5, 1, -1]]"
        )
    d_model, d_ff = w1
    want = {
        "W1": ((d_model, d_ff), "d_model x d_ff: one row per input number"),
        "b1": ((d_ff,), "d_ff: one per hidden unit"),
        "W2": ((d_ff, d_model), "d_ff x d_model: one row per hidden unit, back to d_model"),
        "b2": ((d_model,), "d_model: one per output"),
        "V": ((d_model, d_ff), "d_model x d_ff, as W1"),
    }
    fmt = lambda s: " x ".join(map(str, s)) or "a number"  # noqa: E731
    for key, (need, why) in want.items():
        got = shape(w[key]) if key in w else need
        rows = (
            [len(row) if isinstance(row, list) else 0 for row in w[key]]
            if key in w and len(need) == 2
            else []
        )
        if len(set(rows)) > 1:
            lengths = ", ".join(map(str, rows))
            return f"{key}'s rows differ in length ({lengths}); a matrix needs rows of one length"
        if got != need:
            return (
                f"{key} has shape {fmt(got)}, but {fmt(need)} is needed ({why}); "
                "fix the weights file"
            )
    wrong = [x for x in xs if len(x) != d_model]  # the weights first: --x is judged by W1's rows
    return (
        f"--x {','.join(num(v) for v in wrong[0])!r} has {len(wrong[0])} numbers, "
        f"but the weights take d_model = {d_model}"
        if wrong
        else None
    )


def _model_mlp(w: dict, d_model: int, d_ff: int, act: str, b1, b2) -> MLP:
    """The model's MLP holding these weights (nn.Linear stores W transposed: (out, in))."""
    cfg = ModelConfig(
        n_layer=1, n_head=1, n_embd=d_model, d_ff=d_ff, ffn=act, bias=True, dropout=0.0
    )
    mlp = MLP(cfg)
    with torch.no_grad():
        w1 = torch.tensor(w["W1"], dtype=torch.float32).T
        if act == "swiglu":  # c_fc holds [W_gate; W_up] stacked
            w1 = torch.cat([w1, torch.tensor(w["V"], dtype=torch.float32).T])
            b1 = torch.cat([b1, torch.zeros_like(b1)])
        mlp.c_fc.weight.copy_(w1)
        mlp.c_fc.bias.copy_(b1)
        mlp.c_proj.weight.copy_(torch.tensor(w["W2"], dtype=torch.float32).T)
        mlp.c_proj.bias.copy_(b2)
    return mlp.eval()


def swiglu_width(d_model: int = 4096, multiple_of: int = 256) -> dict:
    """SwiGLU's hidden width by the 2/3 rule (Shazeer 2020 §2; Llama's rounding: the model's
    ``ffn_hidden``), and the parameter counts biases aside: ``params_mlp`` 2·d·4d, ``params_swiglu``
    3·d·d_ff."""
    cfg = ModelConfig(n_layer=1, n_head=1, n_embd=d_model, ffn="swiglu", multiple_of=multiple_of)
    d_ff = cfg.ffn_hidden
    return {
        "d_model": d_model,
        "four_d": 4 * d_model,
        "two_thirds": 2 * 4 * d_model / 3,
        "multiple_of": multiple_of,
        "d_ff": d_ff,
        "params_mlp": 8 * d_model * d_model,
        "params_swiglu": 3 * d_model * d_ff,
    }


def ffn(
    weights: Optional[dict] = None,
    xs: Sequence[Sequence[float]] = EXAMPLE_XS,
    swiglu_d_model: int = 4096,
    multiple_of: int = 256,
    output: Optional[Path] = None,
) -> dict:
    """The FFN forward pass in float64 for each input, step by step (``z`` = x W1 + b1, ``u`` = x V,
    ``h``, ``off`` (units exactly 0), ``y``, ``x_plus_y``), checked against the model's MLP
    (``model_y``, ``model_max_error``). Raises MinigptError: a weight or input of the wrong shape.
    """
    w = EXAMPLE if weights is None else weights
    problem = _shape_problem(w, xs)
    if problem:
        raise MinigptError(problem)
    act = w.get("activation", "relu")
    d_model, d_ff = shape(w["W1"])
    f64 = lambda key: torch.tensor(w[key], dtype=torch.float64)  # noqa: E731
    W1, W2 = f64("W1"), f64("W2")
    b1 = f64("b1") if "b1" in w else torch.zeros(d_ff, dtype=torch.float64)
    b2 = f64("b2") if "b2" in w else torch.zeros(d_model, dtype=torch.float64)
    mlp = _model_mlp(w, d_model, d_ff, act, b1.float(), b2.float())
    steps = []
    for x in xs:
        xt = torch.tensor(list(x), dtype=torch.float64)
        z = xt @ W1 + b1
        h = {**FUNCTIONS, "swiglu": F.silu}[act](z)  # SwiGLU's gate is SiLU
        step = {"x": list(map(float, x)), "z": z.tolist()}
        if act == "swiglu":
            u = xt @ f64("V")
            h = h * u
            step["u"] = u.tolist()
        y = h @ W2 + b2
        with torch.no_grad():
            model_y = mlp(xt.float()[None])[0].double()
        step.update(
            {
                "h": h.tolist(),
                "off": [j for j, v in enumerate(h.tolist()) if v == 0.0],
                "y": y.tolist(),
                "x_plus_y": (xt + y).tolist(),
                "model_y": model_y.tolist(),
                "model_max_error": float((model_y - y).abs().max()),
            }
        )
        steps.append(step)
    result = {
        "activation": act,
        "d_model": d_model,
        "d_ff": d_ff,
        **{k: w[k] for k in ("W1", "W2", "V") if k in w},
        "b1": b1.tolist(),
        "b2": b2.tolist(),
        "steps": steps,
        "swiglu": swiglu_width(swiglu_d_model, multiple_of),
        "png": None,
    }
    return drawn(result, output, _plot)


def _products(
    name: str, x: Sequence[float], matrix, bias: Optional[Sequence[float]], out: Sequence[float]
):
    """Each output ``out[j]`` of x·matrix + bias written out: ``z1 = 1·1 + 2·0.5 = 2``."""

    def factor(v: float) -> str:
        return num(v) if v >= 0 else f"({num(v)})"

    lines = []
    for j, (column, value) in enumerate(zip(zip(*matrix), out)):
        terms = " + ".join(f"{factor(a)}·{factor(b)}" for a, b in zip(x, column))
        lines.append(
            f"  {name}{j + 1} = {terms}{f' + {num(bias[j])}' if bias and bias[j] else ''} = {num(value)}"
        )
    return lines


def format_ffn(r: dict) -> str:
    """The text report of :func:`ffn`: every product written out, so it can be checked by hand."""
    act = r["activation"]
    hidden = "Swish(x W1) ⊙ (x V)" if act == "swiglu" else f"{act}(x W1 + b1)"
    lines = [
        f"FFN(x) = {hidden} W2 + b2: d_model = {r['d_model']}, d_ff = {r['d_ff']} "
        f"({'Shazeer 2020' if act == 'swiglu' else 'Vaswani et al. 2017 §3.3'}; row vectors, x W)"
    ]
    for key in ("W1", "V", "W2"):
        if key in r:
            lines.append(
                f"  {key} ({' x '.join(map(str, shape(r[key])))}) = "
                + "["
                + ", ".join(vector(row) for row in r[key])
                + "]"
            )
    lines.append(f"  b1 = {vector(r['b1'])}   b2 = {vector(r['b2'])}")
    for s in r["steps"]:
        x = s["x"]
        lines.append(f"x = {vector(x)}")
        lines += _products("z", x, r["W1"], r["b1"], s["z"])
        if act == "swiglu":
            lines += _products("u", x, r["V"], None, s["u"])
            lines.append(f"  h = silu(z) ⊙ u = {vector(s['h'])}")
        else:
            off = ", ".join(str(j + 1) for j in s["off"])
            lines.append(
                f"  h = {act}(z) = {vector(s['h'])}"
                + (
                    f"   (unit {off} off)"
                    if len(s["off"]) == 1
                    else f"   (units {off} off)"
                    if off
                    else ""
                )
            )
        lines += _products("y", s["h"], r["W2"], r["b2"], s["y"])
        lines.append(f"  y = {vector(s['y'])};  x + y = {vector(s['x_plus_y'])} (the residual add)")
        lines.append(
            f"  check: minigpt's MLP gives {vector(s['model_y'])} (max difference "
            f"{s['model_max_error']:.1e}, float32)"
        )
    g = r["swiglu"]
    lines.append(
        f"SwiGLU width, d = {g['d_model']}: 2/3·4d = {g['two_thirds']:.2f}, rounded up to a multiple of "
        f"{g['multiple_of']}: d_ff = {g['d_ff']} (3·d·d_ff = {g['params_swiglu']:,} parameters against "
        f"8d² = {g['params_mlp']:,} for a 4d MLP; Shazeer 2020, Llama's rounding)"
    )
    return report(lines, r)


def _plot(r: dict, folder: Path) -> str:
    hidden = "h = silu(z) ⊙ x V" if r["activation"] == "swiglu" else f"h = {r['activation']}(z)"
    stages = [
        ("x", "x"),
        ("z", "z = x W1 + b1"),
        ("h", hidden),
        ("y", "y = h W2 + b2"),
        ("x_plus_y", "x + y"),
    ]
    n = len(r["steps"])
    fig = new_figure(3 * len(stages), 2.6 * n + 0.6)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.08, top=0.88, wspace=0.35, hspace=0.6)
    fig.suptitle(
        f"FFN forward pass, {r['activation']}, d_model = {r['d_model']}, d_ff = {r['d_ff']}: "
        "each row one input, left to right"
    )
    for i, s in enumerate(r["steps"]):
        for j, (key, title) in enumerate(stages):
            ax = fig.add_subplot(n, len(stages), i * len(stages) + j + 1)
            values = s[key]
            colors = [
                "lightgrey"
                if key == "h" and k in s["off"]
                else ("tab:blue" if v >= 0 else "tab:red")
                for k, v in enumerate(values)
            ]
            ax.bar(range(1, len(values) + 1), values, color=colors)
            ax.axhline(0, color="grey", linewidth=0.5)
            if len(values) <= 8:
                for k, v in enumerate(values):
                    off = key == "h" and k in s["off"]
                    ax.annotate(
                        "0 (off)" if off else num(v, 3),
                        (k + 1, v),
                        ha="center",
                        va="bottom" if v >= 0 else "top",
                        fontsize=8,
                        color="grey" if off else "black",
                    )
            ax.set_xticks(range(1, len(values) + 1))
            low, high = min(values + [0.0]), max(values + [0.0])
            pad = 0.25 * (high - low or 1.0)
            ax.set_ylim(low - pad, high + pad)
            ax.set_title(title, fontsize=9)
            if j == 0:
                ax.set_ylabel(f"x = {vector(s['x'], 3)}", fontsize=8)
    return save_png(fig, folder, "ffn.png")
