"""Where a run reports: metrics.jsonl (one event a line, as the README documents), train.log,
loss.png, samples.txt."""

from __future__ import annotations

import io
import json
import time
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..errors import MinigptError
from ..fileio import (
    NotRegularFile,
    atomic_write_bytes,
    atomic_write_text,
    errors_as,
    open_regular,
    os_errors,
    read_problem,
    schema_problem,
)

METRICS = "metrics.jsonl"


#: A cross-entropy in nats per token: never negative, and never NaN (the trainer skips non-finite
#: steps).
Loss = Annotated[float, Field(ge=0)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    step: int = Field(ge=0)
    elapsed_s: float = Field(ge=0)


class TrainEvent(_Event):
    event: Literal["train"]
    loss: Loss
    lr: Optional[float] = None
    tokens_per_sec: Optional[float] = None


class EvalEvent(_Event):
    event: Literal["eval"]
    train_loss: Loss
    val_loss: Loss


_EVENT = TypeAdapter(Annotated[Union[TrainEvent, EvalEvent], Field(discriminator="event")])


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of a ``metrics.jsonl``, each checked by its schema; none when the file is absent;
    a last line cut short by a kill (no newline after it) is dropped. Raises MinigptError: the file
    is unreadable, or a line is not an event (naming the file, the line and the field)."""
    path = Path(path)
    if not path.exists():
        return []
    with (
        os_errors(path, "read", in_run=True),
        errors_as({NotRegularFile: lambda exc: read_problem(exc, path, "metrics file")}),
        open_regular(path) as f,
    ):
        *lines, tail = f.read().split(b"\n")  # tail: after the last newline
    events, n = [], 0
    # A tagged union's errors are located under the tag first: the field is what follows it.
    with errors_as(
        {
            ValidationError: lambda exc: MinigptError(
                f"{path} line {n} is not a metrics event ({schema_problem(exc, skip=1)})",
                "fix or remove that line",
                path=path,
            )
        }
    ):
        for n, line in enumerate(lines, 1):
            if line.strip():
                _EVENT.validate_json(line)
                events.append(
                    json.loads(line)
                )  # as written: a resume writes the kept lines back unchanged
    with suppress(
        ValidationError
    ):  # a last line without its newline: whole, or a write cut short (dropped)
        _EVENT.validate_json(tail)
        events.append(json.loads(tail))
    return events


def _append(path: Path, text: str) -> None:
    """Append ``text`` to ``path``; an OSError names the file even when it comes from the write or
    the close (a full disk), so the CLI's one-line error says which file failed."""
    with (
        errors_as(
            {OSError: lambda exc: OSError(exc.errno, exc.strerror, exc.filename or str(path))}
        ),
        open(path, "a", encoding="utf-8") as f,
    ):
        f.write(text)


class RunLogger:
    """Appends events to the run folder's files; redraws ``loss.png`` at each eval."""

    def __init__(self, run_dir: Path, echo=None, enabled: bool = True):
        self.enabled = enabled  # False on DDP ranks other than 0: they write nothing
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / METRICS
        self.log_path = self.run_dir / "train.log"
        self.samples_path = self.run_dir / "samples.txt"
        self.plot_path = self.run_dir / "loss.png"
        self.echo = echo
        self.train_points: list[tuple[int, float]] = []
        self.eval_points: list[tuple[int, float, float]] = []
        self._last_elapsed = 0.0

    def truncate_to(self, step: int, evaluated: bool) -> None:
        """On resume from ``step``: keep only events up to it (the eval at ``step`` if it ran),
        reload the curves; the later ones belong to the lost stretch of the run, logged again as
        training repeats it."""
        keep = [
            r
            for r in read_events(self.metrics_path)
            if r["step"] < step or (r["step"] == step and (r["event"] != "eval" or evaluated))
        ]
        self.train_points = [(r["step"], r["loss"]) for r in keep if r["event"] == "train"]
        self.eval_points = [
            (r["step"], r["train_loss"], r["val_loss"]) for r in keep if r["event"] == "eval"
        ]
        self._last_elapsed = max((r["elapsed_s"] for r in keep), default=0.0)
        if not self.enabled:
            return
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in keep))

    #: Temporary files of :mod:`minigpt_cli.fileio`'s atomic writes (and the names earlier versions
    #: used).
    TEMP_PATTERNS = (".metrics.*.jsonl", ".loss.*.png", ".*.tmp")

    def sweep_temps(self) -> list[Path]:
        """Remove (and return) the temporary files a killed process left in the run folder; only
        under its lock."""
        removed = []
        for pattern in self.TEMP_PATTERNS:
            for path in sorted(self.run_dir.glob(pattern)):
                if path.is_file():
                    path.unlink(missing_ok=True)
                    removed.append(path)
        return removed

    def elapsed_offset(self) -> float:
        """Seconds of training already logged (non-zero after a resume), so elapsed_s continues."""
        return self._last_elapsed

    def log(self, message: str) -> None:
        """A human-readable line in train.log (and on the console, if echo is set)."""
        if not self.enabled:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        _append(self.log_path, f"{stamp} {message}\n")
        if self.echo is not None:
            self.echo(message)

    def event(self, record: dict[str, Any]) -> None:
        """One JSON object per line in metrics.jsonl."""
        if not self.enabled:
            return
        _append(self.metrics_path, json.dumps(record) + "\n")
        if record["event"] == "train":
            self.train_points.append((record["step"], record["loss"]))
        elif record["event"] == "eval":
            self.eval_points.append((record["step"], record["train_loss"], record["val_loss"]))

    def sample(self, step: int, text: str) -> None:
        if not self.enabled:
            return
        _append(self.samples_path, f"===== step {step} =====\n{text}\n\n")

    def plot(self) -> None:
        """Redraw loss.png (:func:`draw_losses`): a bare Agg ``Figure`` (no pyplot, so a notebook's
        backend is left alone) with fixed margins (a layout pass cost most of a redraw)."""
        if not self.enabled:
            return
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 4.5), dpi=100)
        FigureCanvasAgg(fig)
        fig.subplots_adjust(left=0.1, right=0.97, bottom=0.11, top=0.93)
        ax = fig.add_subplot()
        draw_losses(ax, self.train_points, self.eval_points)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("cross-entropy loss (nats/token)")
        ax.set_title(self.run_dir.name)
        ax.grid(alpha=0.3)
        ax.legend()
        png = io.BytesIO()
        fig.savefig(png, format="png")
        atomic_write_bytes(self.plot_path, png.getvalue())


def ema(values: list[float]) -> list[float]:
    """An exponential moving average of ``values``, debiased as Adam's moments are (Kingma & Ba
    2015, §3) so that its start is not pulled toward 0, with a span of a tenth of the points: weight
    1 - 2 / (span + 1), the pandas ``ewm(span=...)`` convention (30 log steps: span 3; 1,000: span
    100)."""
    span = max(1.0, len(values) / 10)
    weight, avg, out = 1 - 2 / (span + 1), 0.0, []
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i) if weight else v)
    return out


def draw_losses(
    ax: Any,
    train: list[tuple[float, float]],
    evals: list[tuple[float, float, float]],
    color: str = "tab:blue",
    val_color: str = "tab:orange",
    label: str = "",
) -> None:
    """Draw one run's curves on ``ax``: the training loss at every log step (x, loss), faint, its
    :func:`ema` over it, and the evals (x, train loss, val loss) as points on top; ``label`` goes
    before each curve's name."""
    if train:
        xs, losses = zip(*train)
        ax.plot(xs, losses, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(xs, ema(list(losses)), color=color, linewidth=1.8, label=f"{label}train (smoothed)")
    if evals:
        xs, train_eval, val = zip(*evals)
        if not label:  # one run: the eval's train loss too; several: val only, one color each
            ax.plot(xs, train_eval, "s", color=color, markersize=4, label="train (eval)")
        ax.plot(
            xs, val, "o--", color=val_color, markersize=4, linewidth=1, label=f"{label}val (eval)"
        )
