"""env.json: the machine, the versions and the commit a run trained with (the names are
:mod:`.folder`'s)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import MinigptError
from ..fileio import (
    STATE_BOUNDS,
    atomic_write_text,
    read_bytes,
)
from .folder import ENV

if TYPE_CHECKING:  # torch is imported where env.json is written
    import torch


# ----------------------------------------------------------------------------- env.json


def git_commit() -> Optional[str]:
    """The project's git commit, if the package runs from a checkout."""
    with suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return (out.stdout.strip() or None) if out.returncode == 0 else None
    return None


def env_info(
    device: torch.device,
    dtype: torch.dtype,
    world_size: int = 1,
    linear_kernel: str = "torch.mm",
    dropout_kernel: str = "torch",
) -> dict:
    """Versions, device, git commit and the training step's linear and dropout kernels, for
    env.json."""
    import importlib.metadata as md

    import numpy as np
    import torch

    minigpt = None
    with suppress(md.PackageNotFoundError):
        minigpt = md.version("minigpt-cli")
    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "minigpt": minigpt,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "world_size": world_size,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "linear_kernel": linear_kernel,
        "dropout_kernel": dropout_kernel,
        "cuda": torch.version.cuda,
        "git_commit": git_commit(),
        "argv": sys.argv,
        # The folder train ran in: argv's and the config's relative paths (data.data_dir, ...) are
        # relative to it.
        "cwd": os.getcwd(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def write_env(run_dir: Path, env: dict[str, Any]) -> None:
    """Write ``env.json`` (atomically)."""
    atomic_write_text(Path(run_dir) / ENV, json.dumps(env, indent=1))


class Env(BaseModel):
    """``env.json``'s schema: what readers rely on is typed; the other facts pass through."""

    model_config = ConfigDict(extra="allow")
    cwd: Optional[str] = None
    earlier_sessions: list[Any] = []


def _read_env(run_dir: Path) -> dict[str, Any]:
    """A run's ``env.json``; a missing or damaged one (it only informs) reads as empty."""
    with suppress(MinigptError, ValidationError):  # read within STATE_BOUNDS, as meta.json is
        data = read_bytes(Path(run_dir) / ENV, ENV, STATE_BOUNDS)
        return Env.model_validate_json(data).model_dump(exclude_unset=True)
    return {}


def training_dirs(run_dir: Path, out_dir: str | Path) -> list[Path]:
    """Where the folder ``train`` ran in may be now, most likely first: ``env.json``'s ``cwd``, then
    the folder a relative ``train.out_dir`` hangs from, where the run folder is now
    ``<that>/<out_dir>/<run>`` (the same folder unless the project was moved, with its runs, after
    training)."""
    cwd = _read_env(run_dir).get("cwd")
    out_found = [Path(cwd)] if cwd else []
    out = Path(os.path.normpath(out_dir))
    if not out.is_absolute() and ".." not in out.parts:
        parent = Path(os.path.normpath(Path(run_dir).absolute())).parent  # <that folder>/<out_dir>
        n = len(out.parts)  # 0 for "."
        if not n or parent.parts[-n:] == out.parts:
            hung = Path(*parent.parts[: len(parent.parts) - n])
            if hung not in out_found:
                out_found.append(hung)
    return out_found


def earlier_sessions(run_dir: Path) -> list[dict[str, Any]]:
    """The sessions recorded in a run's ``env.json`` so far, oldest first (none when it is missing
    or damaged)."""
    before = _read_env(run_dir)
    if not before:
        return []
    return before.pop("earlier_sessions", []) + [before]
