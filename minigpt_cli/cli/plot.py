"""``minigpt plot``: any runs' loss curves overlaid, by step, wall time or training FLOPs."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .base import Command, app, echo


@app.command(cls=Command)
def plot(
    paths: Optional[List[Path]] = typer.Argument(
        None, metavar="RUN...", help="Run folders, or folders of runs (a sweep's)."
    ),
    x: str = typer.Option(
        "step",
        "--x",
        metavar="step|time|flops",
        help="The x axis: optimizer step, wall time in seconds (evals included), or training "
        "FLOPs (steps x tokens per step x FLOPs per token of the run's config).",
    ),
    output: Optional[Path] = typer.Option(
        None,
        "--output",
        "-o",
        metavar="FILE",
        help="The PNG to write (default: curves.png here); an existing file that is not a PNG "
        "is refused.",
    ),
) -> None:
    """Overlay the loss curves of any runs on one figure.

    Each run's training loss at every log step (faint) with its moving
    average (solid), and its val loss at each eval (dashed, with points),
    read from the runs' metrics.jsonl. Runs that differ in batch or model
    size compare fairly by --x flops; runs on different machines by --x step.

    \b
    Examples:
      minigpt plot runs/quick runs/quick-rope
      minigpt plot runs/optimizer --x time --output optimizer.png
    """
    from ..experiments.plot import DEFAULT_OUTPUT, plot_runs

    out = output or DEFAULT_OUTPUT
    curves = plot_runs(paths or [], x, out)
    echo(f"wrote {out}: {len(curves)} run{'s' if len(curves) != 1 else ''} by {x}")
