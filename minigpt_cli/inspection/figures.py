"""What every inspect topic shares: a figure without pyplot and its atomic PNG write, JSON, numbers,
a seeded RNG.

Figures are drawn on a bare Figure with the Agg canvas (the process's matplotlib backend is left
alone).
"""

from __future__ import annotations

import io
import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..errors import MinigptError


def check_heads(n_embd: int, n_head: int) -> None:
    """Refuse (MinigptError) a width that whole heads do not divide, suggesting the nearest that
    they do."""
    if n_embd % n_head:
        raise MinigptError(
            f"--n-embd {n_embd} is not divisible by --n-head {n_head}; "
            f"e.g. --n-embd {n_head * max(1, round(n_embd / n_head))}"
        )


def new_figure(width: float, height: float):
    """A matplotlib Figure of ``width`` x ``height`` inches at 100 dpi on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def widen_to_fit(fig, text, margin: float = 0.2) -> None:
    """Widen ``fig`` so that ``text`` (a title: it does not wrap) fits with ``margin`` inches on
    each side."""
    width = text.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi + 2 * margin
    if width > fig.get_figwidth():
        fig.set_figwidth(width)


def decorate(ax, xlabel: str, ylabel: Optional[str], title: str, **legend) -> None:
    """Name ``ax``'s axes (``ylabel`` None: left unnamed) and title it, then draw its legend
    (``legend``: the keywords of ``ax.legend``) and a light grid."""
    ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(**legend)
    ax.grid(alpha=0.3)


def drawn(result: dict, output: Optional[Path], plot: Callable[..., str], *data) -> dict:
    """``result`` with its ``png`` set to ``plot(result, *data, folder)`` when ``output`` names a
    folder."""
    if output is not None:
        result["png"] = plot(result, *data, Path(output))
    return result


def save_png(fig, folder: Path, name: str) -> str:
    """Write ``fig`` to ``folder/name`` atomically (the folder is created); returns the path as a
    string."""
    from ..fileio import atomic_write_bytes

    png = io.BytesIO()
    fig.savefig(png, format="png")
    path = Path(folder) / name
    atomic_write_bytes(path, png.getvalue())
    return str(path)


def to_json(result: dict) -> str:
    """``result`` as indented JSON; non-finite floats become null (JSON has no NaN)."""
    return json.dumps(_finite(result), indent=1, ensure_ascii=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def num(x: float, digits: int = 4) -> str:
    """A number as a learner would write it: ``2``, ``-1.5``, ``0.0278``, ``4.73e-04``."""
    if x == 0:
        return "0"
    if abs(x) < 10 ** -(digits - 1) or abs(x) >= 1e7:
        return f"{x:.{max(digits - 2, 1)}e}"
    text = f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def vector(values: Iterable[float], digits: int = 4) -> str:
    """``[1, -0.5, 2]``."""
    return "[" + ", ".join(num(float(v), digits) for v in values) + "]"


def shape(values) -> tuple[int, ...]:
    """The shape of a nested list of numbers (rows must be of one length; else the first row's)."""
    dims = []
    while isinstance(values, (list, tuple)):
        dims.append(len(values))
        values = values[0] if values else None
    return tuple(dims)


def report(lines: list[str], result: dict) -> str:
    """A text report: ``lines``, then where the picture went when one was drawn."""
    return "\n".join(lines + ([f"picture: {result['png']}"] if result["png"] else []))


@contextmanager
def seeded(seed: int):
    """torch's global RNG seeded with ``seed`` inside the block and put back as it was after it: the
    model's init draws from the global RNG, and a caller's own random stream must not move."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
