"""The baseline a record is measured against: nanoGPT's CPU recipe, run in the same sitting by
``shared/tools/nanogpt-reference.sh`` (its README's "I only have a macbook" command), or a wall
time a user measured by hand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from ..errors import MinigptError

#: Where the reference script lives, from a checkout's root (the project's shared folder beside it).
SCRIPT = Path("..") / "shared" / "tools" / "nanogpt-reference.sh"

#: nanoGPT's eval line (``train.py``): ``step 2000: train loss 1.7600, val loss 1.8857``.
_VAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", re.MULTILINE)
#: The script's last line: ``wall_s 89.7  median_ms_per_iter 42.1  (tokens per iter 768)``.
_WALL = re.compile(r"^wall_s ([\d.]+)", re.MULTILINE)


def find_script(given: Optional[Path], roots: list[Path]) -> Path:
    """The reference script: ``given``, else :data:`SCRIPT` from the first of ``roots`` (checkouts)
    that has it.

    Raises:
        MinigptError: none found.
    """
    if given is not None:
        if not given.is_file():
            raise MinigptError(
                f"--baseline-script {given}: no such file",
                "give the path of shared/tools/nanogpt-reference.sh",
            )
        return given
    roots = list(dict.fromkeys(r.resolve() for r in roots))
    for root in roots:
        if (root / SCRIPT).is_file():
            return (root / SCRIPT).resolve()
    raise MinigptError(
        f"--baseline-nanogpt needs nanoGPT's reference script, {SCRIPT} beside a checkout, and "
        f"found none (looked from {', '.join(str(r) for r in roots)})",
        "give its path with --baseline-script, or time nanoGPT's recipe yourself and pass "
        '--baseline-seconds (docs/speedrun.md, "Entering a record")',
    )


def parse_reference(text: str) -> tuple[float, float, int]:
    """The wall time in seconds, the last val loss and its step from the script's output.

    Raises:
        MinigptError: either is missing.
    """
    wall, vals = _WALL.search(text), _VAL.findall(text)
    if wall is None or not vals:
        raise MinigptError(
            "nanoGPT's reference run printed no "
            + ("wall_s line" if wall is None else "val loss")
            + "; is NANOGPT_GIT_DIR a nanoGPT snapshot?",
            "run the script by hand to see why",
        )
    return float(wall.group(1)), float(vals[-1][1]), int(vals[-1][0])


#: What the reference script runs from a nanoGPT snapshot (its HEAD): the training script and the
#: recipe's config.
NANOGPT_FILES = ("train.py", "config/train_shakespeare_char.py")


def check_nanogpt(nanogpt: Path) -> None:
    """Refuse a ``--baseline-nanogpt`` that is not a git snapshot of nanoGPT (a clone, or a bare
    repository, which the reference script clones), before the speedrun writes anything: its HEAD
    must hold :data:`NANOGPT_FILES`.

    Raises:
        MinigptError: naming it, and what it lacks.
    """
    fix = "give a clone or git snapshot of karpathy/nanoGPT"
    if not nanogpt.is_dir():
        raise MinigptError(f"--baseline-nanogpt {nanogpt}: no such folder", fix)
    for name in NANOGPT_FILES:
        try:
            held = (
                subprocess.run(
                    ["git", "-C", str(nanogpt), "cat-file", "-e", f"HEAD:{name}"],
                    capture_output=True,
                ).returncode
                == 0
            )
        except OSError:  # no git: the reference script clones with it too
            raise MinigptError(
                "--baseline-nanogpt needs git, which the reference script clones nanoGPT with",
                "install git",
            ) from None
        if not held:
            raise MinigptError(
                f"--baseline-nanogpt {nanogpt}: not a git snapshot of nanoGPT (no {name} at its HEAD)",
                fix,
            )


def run_nanogpt(
    script: Path, nanogpt: Path, threads: int, echo: Callable[[str], None]
) -> dict[str, object]:
    """Run nanoGPT's CPU recipe through ``script`` on ``threads`` threads; its wall time (the whole
    ``train.py``, start-up included), final val, and the cores other processes kept busy meanwhile
    (``other_cores_busy``, as a seed's: None where unknown).

    Raises:
        MinigptError: ``nanogpt`` is not a snapshot of nanoGPT, or the script failed or printed no
            result.
    """
    import torch

    from ..runtime.device import CpuThreads
    from .runner import cpu_with_children

    check_nanogpt(nanogpt)
    echo(f"baseline: nanoGPT's CPU recipe ({script}), 1.5 to 4 minutes on 2 cores ...")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    meter = CpuThreads(torch.device("cpu"), read_own=cpu_with_children)
    mark = meter.mark()  # the machine's busy time, less this process's and the script's
    done = subprocess.run(
        ["bash", str(script), str(nanogpt), sys.executable], env=env, capture_output=True, text=True
    )
    others = meter.others_since(mark)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MinigptError(
            f"nanoGPT's reference run failed (exit status {done.returncode}): {last}",
            f"run bash {script} {nanogpt} by hand to see why",
        )
    seconds, val, step = parse_reference(done.stdout)
    echo(f"baseline: nanoGPT took {seconds:.1f} s to val {val:.4f} at step {step}")
    return {
        "label": "nanoGPT's CPU recipe",
        "seconds": seconds,
        "val": val,
        "step": step,
        "threads": threads,
        "measured": "same sitting",
        "other_cores_busy": others,
    }


def by_hand(seconds: float) -> dict[str, object]:
    """A baseline wall time a user measured and gave with ``--baseline-seconds``."""
    return {"label": "given with --baseline-seconds", "seconds": seconds, "measured": "by hand"}
