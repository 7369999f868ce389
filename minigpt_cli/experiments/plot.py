"""``minigpt plot``: any runs' loss curves on one figure, by step, wall time or training FLOPs.

Each run's training loss at every log step (faint) with its moving average, and its val loss at each
eval, from its metrics.jsonl; FLOPs are the sum over the run's steps of each step's tokens (batch x
accumulation x context x processes, smaller inside a batch-size ramp or sequence-length warmup)
times the training FLOPs per token that :func:`minigpt_cli.accounting.params.flops` counts at its
context for the recorded config (:func:`~minigpt_cli.trainer.schedule.train_flops_through`, as
``compare`` does)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..accounting.steps import train_flops_through
from ..config.schema import load_config
from ..errors import MinigptError
from ..fileio import atomic_write_bytes, check_writable
from ..run import env as run_env
from ..run import folder as runs
from ..run.metrics import METRICS, draw_losses, read_events

#: What the x axis can be, and its label.
AXES = {
    "step": "optimizer step",
    "time": "wall time (s, evals included)",
    "flops": "training FLOPs",
}
#: The file ``plot`` writes when no --output is given.
DEFAULT_OUTPUT = Path("curves.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Curves:
    """One run's curves: (x, training loss) at each log step, (x, train loss, val loss) at each
    eval."""

    name: str
    train: list[tuple[float, float]]
    evals: list[tuple[float, float, float]]


def _run_folders(paths: list[Path]) -> list[Path]:
    """The run folders ``paths`` name: each a run, or a folder of runs (a sweep's). Raises
    MinigptError: a path that is missing, a file, or neither a run nor a folder of runs."""
    if not paths:
        raise MinigptError("give at least one run folder to plot", "e.g. minigpt plot runs/quick")
    out = []
    for p in paths:
        if not p.exists():
            raise MinigptError(f"{str(p)!r}: no such run folder", "pass a run folder (runs/NAME)")
        if (p / runs.CONFIG).is_file() or (p / METRICS).is_file():
            out.append(p)
            continue
        inside = sorted(q for q in p.iterdir() if (q / METRICS).is_file()) if p.is_dir() else []
        if not inside:
            raise MinigptError(
                f"{str(p)!r} is not a run folder (no {METRICS} nor {runs.CONFIG}), nor a folder "
                "of runs",
                "pass a run folder (runs/NAME), or a sweep's folder",
            )
        out += inside
    return list(dict.fromkeys(out))  # each run once


def _flops_through(run: Path) -> Callable[[int], float]:
    """Training FLOPs of ``run``'s first n optimizer steps, from its config.yaml and env.json's
    process count (exact under a batch-size ramp or sequence-length warmup)."""
    if not (run / runs.CONFIG).is_file():
        raise MinigptError(
            f"{run} has no {runs.CONFIG}, which --x flops counts from",
            "plot it by --x step or --x time",
        )
    cfg = load_config(run / runs.CONFIG)
    world = run_env._read_env(run).get("world_size", 1)
    return lambda steps: train_flops_through(steps, cfg, world)


def read_curves(run: Path, x: str) -> Curves:
    """``run``'s curves against ``x`` (:data:`AXES`). Raises MinigptError: an unknown ``x``, a run
    with no event logged yet, a damaged metrics.jsonl or config.yaml."""
    if x not in AXES:
        raise MinigptError(f"--x {x!r}: use one of {', '.join(AXES)}")
    events = read_events(run / METRICS)
    if not events:
        raise MinigptError(
            f"{run} has no logged step yet (its {METRICS} is empty or missing)",
            "train it past its first log step",
        )
    flops = _flops_through(run) if x == "flops" else None

    def at(e: dict) -> float:
        if x == "time":
            return e["elapsed_s"]
        return flops(e["step"]) if flops is not None else e["step"]

    return Curves(
        run.name,
        [(at(e), e["loss"]) for e in events if e["event"] == "train"],
        [(at(e), e["train_loss"], e["val_loss"]) for e in events if e["event"] == "eval"],
    )


def plot_runs(paths: list[Path], x: str = "step", output: Path = DEFAULT_OUTPUT) -> list[Curves]:
    """Draw the runs ``paths`` name (runs, or folders of runs) on one figure against ``x`` and write
    it to ``output`` as a PNG, atomically. Raises MinigptError: a path that is not a run, an unknown
    ``x``, an ``output`` that is a folder or a file other than a PNG (never overwritten)."""
    if x not in AXES:
        raise MinigptError(f"--x {x!r}: use one of {', '.join(AXES)}")
    if output.is_dir():
        raise MinigptError(
            f"--output {output} is a folder", f"give a file name, e.g. {output / 'x.png'}"
        )
    check_writable(output, folder=False)  # a dangling link, a FIFO: refused as every output is
    if output.is_file() and output.read_bytes()[:8] != PNG_SIGNATURE:
        raise MinigptError(
            f"--output {output} exists and is not a PNG; it is left as it is",
            "give another --output",
        )
    curves = [read_curves(run, x) for run in _run_folders(paths)]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, c in enumerate(curves):
        color = f"C{i % 10}"
        label = f"{c.name}: " if len(curves) > 1 else ""
        draw_losses(ax, c.train, c.evals, color, color if label else "tab:orange", label)
    ax.set_xlabel(AXES[x])
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_title(
        "training loss (faint: each log step; solid: smoothed) and val loss at each eval (dashed)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    atomic_write_bytes(output, png.getvalue())
    return curves
