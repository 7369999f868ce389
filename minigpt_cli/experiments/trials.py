"""``minigpt compare --storage``: a study's trials as a table, one row per trial (a sweep's worker
adds them to its summary); the files and cells as :mod:`.compare` writes a summary's."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..errors import MinigptError
from ..fileio import atomic_write_set
from .compare import CELL, check_output, csv_cell, short_text, table_lines, value_text

if TYPE_CHECKING:  # optuna is imported where it is used
    import optuna

#: The trials table's columns: its header, and the key of :func:`study_trials`'s rows.
TRIAL_COLUMNS = (
    ("trial", "trial"),
    ("state", "state"),
    ("variant or params", "variant"),
    ("seed", "seed"),
    ("value", "value"),
    ("host", "host"),
    ("run folder", "folder"),
)


def study_trials(study: "optuna.Study") -> dict:
    """The study's trials as rows (:data:`TRIAL_COLUMNS`), each worker's as its user attrs record
    them (the host and folder that took it); the copies that were failed unrun (``duplicate``,
    ``surplus``) are left out."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        if attrs.get("duplicate") or attrs.get("surplus"):
            continue
        seeds = [m.group(1) for r in attrs.get("runs", []) if (m := re.search(r"-s(\d+)$", r))]
        variant = attrs.get("variant") or ", ".join(
            f"{k}={value_text(v)}" for k, v in t.params.items()
        )
        folder = attrs.get("folder")
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name.lower(),
                "variant": variant,
                "params": {} if attrs.get("variant") else t.params,
                "seed": attrs.get("seed", ", ".join(seeds) or None),
                "value": t.value,
                "host": attrs.get("host"),
                "folder": str(Path(folder) / attrs["run"]) if "run" in attrs and folder else folder,
            }
        )
    return {"study": study.study_name, "trials": rows}


def load_trials(url: str, name: Optional[str], paths: list[Path]) -> dict:
    """:func:`study_trials` of study ``name`` in the storage at ``url`` (None: its only study).
    Raises MinigptError: run folder ``paths`` given too, a storage that cannot be opened, no such
    study (the names)."""
    import optuna

    from .search import open_storage

    if paths:
        raise MinigptError("give run folders (or a sweep's folder), or --storage URL, not both")
    storage = open_storage(url, None, existing=True)
    names = optuna.get_all_study_names(storage)
    listed = ", ".join(sorted(names))
    if not names:
        raise MinigptError(
            f"--storage {url} holds no study yet", "start a sweep's workers on it first"
        )
    if name is None and len(names) > 1:
        raise MinigptError(
            f"--storage {url} holds {len(names)} studies", f"give --study one of: {listed}"
        )
    if name is not None and name not in names:
        raise MinigptError(
            f"--storage {url}: no study {name!r} in it", f"give --study one of: {listed}"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return study_trials(optuna.load_study(study_name=name or names[0], storage=storage))


def _trial_cell(row: dict, key: str, clip: bool = False) -> str:
    value = row[key]
    if key == "variant" and row.get("params"):
        # Searched values to 4 significant digits (summary.csv and .json keep them whole); the
        # terminal's cell names each key by its last part.
        return ", ".join(
            f"{k.rsplit('.', 1)[-1] if clip else k}={short_text(v)}"
            for k, v in row["params"].items()
        )
    return "" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def format_trials(result: dict, clip: bool = True) -> str:
    """The study's trials as a Markdown table, and a count by state; ``clip``: cells cut to
    :data:`CELL` (the terminal's; summary.md has them whole)."""

    # A folder keeps its end, which names the run.
    def cut(text: str, key: str, room: int = CELL) -> str:
        if not clip or len(text) <= room:
            return text
        return "…" + text[1 - room :] if key == "folder" else text[: room - 1] + "…"

    def cell(row: dict, key: str) -> str:  # searched values, already short, get two cells' room
        return cut(
            _trial_cell(row, key, clip),
            key,
            2 * CELL if key == "variant" and row.get("params") else CELL,
        )

    spec = [(head, [key], lambda r, key=key: cell(r, key)) for head, key in TRIAL_COLUMNS]
    states = [r["state"] for r in result["trials"]]
    counts = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
    return (
        "\n".join(
            [
                f"study {result['study']}: {len(states)} trials"
                + (f" ({counts})" if states else ""),
                "",
                *table_lines(spec, result["trials"]),
            ]
        )
        + "\n"
    )


def write_trials(result: dict, out: Path) -> None:
    """summary.md, .csv and .json of a study's trials into ``out``, renamed into place as a set."""
    check_output(out)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    csv.writer(buf).writerows(
        [
            [k for _, k in TRIAL_COLUMNS],
            *([csv_cell(r[k]) for _, k in TRIAL_COLUMNS] for r in result["trials"]),
        ]
    )
    summary = {
        "columns": [k for _, k in TRIAL_COLUMNS],
        "rows": result["trials"],
        "metric": "value",
        **result,
    }
    atomic_write_set(
        {
            out / "summary.md": format_trials(result, clip=False).encode("utf-8"),
            out / "summary.csv": buf.getvalue().encode("utf-8"),
            out / "summary.json": (json.dumps(summary, indent=1) + "\n").encode("utf-8"),
        }
    )
