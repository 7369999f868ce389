"""The ledger: ``speedrun/records.md`` in the checkout (a Markdown table per track) and the recipe
of every record (``speedrun/recipes/<track>-NNN.yaml``), so each row can name what changed since
the record before it.

A record is only written from a clean git tree, so that the commit in its row describes the code
that ran; the recipe file is kept beside the ledger because a recipe given with ``--recipe`` may
live anywhere.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Optional

from ..errors import MinigptError

#: The ledger and the recipes' folder, from the checkout's root.
LEDGER = Path("speedrun") / "records.md"
RECIPES = Path("speedrun") / "recipes"

HEADER = """# Speedrun records

Written by `minigpt speedrun --record`; [docs/speedrun.md](../docs/speedrun.md) has the tracks, the
rule and how to enter a record. One table per track. Times are the median over the seeds of the
training time to the first eval at or below the target (evals included); the val is the mean over
the seeds of the whole val split's loss at the last step; p is the one-sided t-test that the mean
is below the target (a record needs p < 0.01). A `baseline` row is nanoGPT's CPU recipe
(`nanogpt-reference.sh`, its whole `train.py`) measured in the same sitting as the record below it.
Each record's recipe is in `speedrun/recipes/`.
"""

COLUMNS = [
    "#",
    "date",
    "commit",
    "recipe",
    "change from the previous record",
    "CPU",
    "threads",
    "torch",
    "seeds",
    "median time to target",
    "mean val",
    "p",
    "ratio to baseline",
]

#: Config keys that say where a run is, not how it trains: left out of the diff. ``seed``: the
#: speedrun sets it for each run.
_NOT_RECIPE = {"name", "seed", "data.data_dir", "train.out_dir", "data.fingerprint"}


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def checkout(folder: Path) -> Path:
    """The root of the git checkout that holds ``folder``.

    Raises:
        MinigptError: ``folder`` is in none.
    """
    try:
        done = _git(folder, "rev-parse", "--show-toplevel")
    except OSError:  # no git on the PATH
        done = None
    if done is None or done.returncode != 0:
        raise MinigptError(
            f"--record writes the ledger ({LEDGER}) of the git checkout it runs in, and "
            f"{folder.resolve()} is not in one",
            "run it from your minigpt checkout",
        )
    return Path(done.stdout.strip())


def clean_commit(root: Path) -> str:
    """The commit of a checkout with nothing changed or untracked (12 hex digits).

    Raises:
        MinigptError: files changed or untracked (naming some), or no commit yet.
    """
    status = _git(root, "status", "--porcelain", "--untracked-files=normal").stdout.splitlines()
    if status:
        names = ", ".join(line[3:] for line in status[:3]) + (", ..." if len(status) > 3 else "")
        raise MinigptError(
            f"--record needs a clean git tree, since the record's commit must describe its recipe "
            f"and code; {root} has {len(status)} changed or untracked path(s): {names}",
            "commit (or stash) them, then run the speedrun again",
        )
    head = _git(root, "rev-parse", "--short=12", "HEAD")
    if head.returncode != 0:
        raise MinigptError(
            f"--record needs a commit to name, and {root} has none yet", "commit the recipe first"
        )
    return head.stdout.strip()


def recipes(root: Path, track: str) -> list[Path]:
    """The recipes of ``track``'s records, oldest first."""
    pattern = re.compile(rf"^{re.escape(track)}-(\d{{3,}})\.yaml$")
    found = [p for p in (root / RECIPES).glob(f"{track}-*.yaml") if pattern.match(p.name)]
    return sorted(found, key=lambda p: int(pattern.match(p.name).group(1)))


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return {k.rstrip("."): v for k, v in out.items()}


def recipe_diff(old, new) -> list[str]:
    """The config keys whose resolved values differ between two recipes (configs), as
    ``key: old -> new``, sorted; where a run lives and its seed are not part of a recipe."""
    a, b = _flat(old.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    return [
        f"{key}: {a.get(key)} -> {b.get(key)}"
        for key in sorted(set(a) | set(b))
        if key not in _NOT_RECIPE and a.get(key) != b.get(key)
    ]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _seconds(s: Optional[float]) -> str:
    return "not reached" if s is None else f"{s:.1f} s"


def ratio_cell(report: dict) -> str:
    """The ratio column: the record's median time over the baseline's, naming the baseline."""
    base = report.get("baseline")
    if base is None:
        return "not measured"
    if report.get("ratio") is None:
        return f"- (baseline {base['seconds']:.1f} s)"
    how = "same sitting" if base["measured"] == "same sitting" else "by hand"
    return f"{report['ratio']:.3f}x of {base['seconds']:.1f} s ({how})"


def rows(report: dict, number: int, commit: str, recipe: str, change: str) -> list[str]:
    """The ledger rows of one record: the baseline's (when nanoGPT ran in this sitting), then the
    record's."""
    out = []
    base = report.get("baseline")
    if base is not None and base["measured"] == "same sitting":
        out.append(
            _row(
                [
                    "baseline",
                    report["date"],
                    commit,
                    "nanoGPT's CPU recipe (2,000 steps)",
                    "-",
                    report["cpu"],
                    base["threads"],
                    report["torch"],
                    1,
                    f"{base['seconds']:.1f} s (whole train.py)",
                    f"{base['val']:.4f}",
                    "-",
                    "1",
                ]
            )
        )
    out.append(
        _row(
            [
                number,
                report["date"],
                commit,
                recipe,
                change,
                report["cpu"],
                report["threads"],
                report["torch"],
                f"{len(report['seeds'])} ({report['hits']} hit)",
                _seconds(report["median_time_s"]),
                f"{report['mean_val']:.4f}",
                f"{report['p']:.2g}",
                ratio_cell(report),
            ]
        )
    )
    return out


def insert_rows(ledger: str, track: str, target: float, new_rows: list[str]) -> str:
    """``ledger`` (the file's text; empty: a new one) with ``new_rows`` at the end of ``track``'s
    table, which is made when missing."""
    lines = (ledger or HEADER).rstrip("\n").split("\n")
    heading = next((i for i, line in enumerate(lines) if line.startswith(f"## {track}: ")), None)
    if heading is None:
        lines += [
            "",
            f"## {track}: val <= {target}",
            "",
            _row(COLUMNS),
            "|" + "|".join(" --- " for _ in COLUMNS) + "|",
            *new_rows,
        ]
        return "\n".join(lines) + "\n"
    end = heading + 1
    while end < len(lines) and not lines[end].startswith("|"):
        end += 1  # the blank line between heading and table
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:end] + new_rows + lines[end:]) + "\n"


def record(root: Path, report: dict, recipe_file: Path, commit: str) -> tuple[Path, int]:
    """Append ``report``'s rows to the ledger of checkout ``root`` and keep its recipe, both written
    as a set (atomically); the ledger's path and the record's number.

    Raises:
        MinigptError: a file cannot be written.
    """
    from ..config.schema import load_config
    from ..errors import ConfigError
    from ..fileio import atomic_write_set

    track = report["track"]
    earlier = recipes(root, track)
    number = len(earlier) + 1
    kept = root / RECIPES / f"{track}-{number:03d}.yaml"
    if not earlier:
        change = "first record"
    else:
        try:
            diff = recipe_diff(load_config(earlier[-1]), load_config(recipe_file))
            change = "; ".join(diff) or "none (the same recipe)"
        except ConfigError as exc:  # a schema change since: say so rather than guess
            change = f"(the previous recipe no longer loads: {exc})"
    ledger = root / LEDGER
    text = ledger.read_text(encoding="utf-8") if ledger.is_file() else ""
    recipe_link = kept.relative_to(root / LEDGER.parent).as_posix()
    new = insert_rows(
        text, track, report["target"], rows(report, number, commit, recipe_link, change)
    )
    atomic_write_set({kept: recipe_file.read_bytes(), ledger: new.encode("utf-8")})
    return ledger, number
