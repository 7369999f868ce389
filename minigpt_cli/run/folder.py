"""The run folder: its layout, its lock, finding runs, ``meta.json`` and ``env.json``.

This module is the one place that spells the run folder's names::

    runs/<name>/
      config.yaml  tokenizer.json  env.json  .lock   (metrics.py names its logs)
      checkpoints/last/  checkpoints/best/  checkpoints/step-0000500/
        model.safetensors  trainer_state.pt  config.yaml  meta.json

A checkpoint folder is replaced atomically by :mod:`minigpt_cli.run.checkpoint`;
while the swap runs the previous copy is ``checkpoints/.<which>.old``, which
:func:`resolve` falls back to. One process at a time trains in a run folder
(:class:`RunLock`).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

try:  # POSIX; elsewhere run folders are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

from ..errors import MinigptError
from ..fileio import atomic_write_text

if TYPE_CHECKING:  # torch is imported where env.json is written, so the CLI can read these names without it
    import torch

CHECKPOINTS = "checkpoints"
LAST = "last"
BEST = "best"
#: A checkpoint folder's files.
WEIGHTS = "model.safetensors"
STATE = "trainer_state.pt"
CONFIG = "config.yaml"
META = "meta.json"
#: The run folder's own files (besides the logs of :mod:`minigpt_cli.run.metrics`).
ENV = "env.json"
TOKENIZER = "tokenizer.json"
LOCK = ".lock"


def checkpoint_dir(run_dir: str | Path, which: str) -> Path:
    """``<run_dir>/checkpoints/<which>`` (``last``, ``best`` or a kept ``step-NNNNNNN``)."""
    return Path(run_dir) / CHECKPOINTS / which


def keep_edited_config(run_dir: Path, new_text: str) -> Optional[Path]:
    """Before a resume rewrites ``<run_dir>/config.yaml`` with ``new_text``: when the file holds an edit (it
    is neither the last checkpoint's config nor ``new_text``), copy it to ``config.yaml.edited`` (or
    ``.edited-N``) and return that path; else None."""
    path = Path(run_dir) / CONFIG
    try:
        text = path.read_text(encoding="utf-8")
        saved = (checkpoint_dir(run_dir, LAST) / CONFIG).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if text in (saved, new_text):
        return None
    keep = path.with_name(CONFIG + ".edited")
    n = 1
    while keep.exists():
        keep, n = path.with_name(f"{CONFIG}.edited-{n}"), n + 1
    keep.write_text(text, encoding="utf-8")
    return keep


def kept_name(step: int) -> str:
    """The folder name of a checkpoint kept every ``train.keep_every`` steps: ``step-0000500``."""
    return f"step-{step:07d}"


def old_copy(directory: Path) -> Path:
    """Where :func:`~minigpt_cli.run.checkpoint.save` keeps the previous copy while it swaps: ``.<which>.old``."""
    return directory.parent / f".{directory.name}.old"


def has_weights(directory: str | Path) -> bool:
    """Whether the checkpoint folder ``directory``, or its ``.old`` copy, holds a weights file."""
    directory = Path(directory)
    return (directory / WEIGHTS).is_file() or (old_copy(directory) / WEIGHTS).is_file()


def resolve(directory: str | Path) -> Path:
    """The checkpoint folder to load: ``directory``, or its ``.old`` copy if a swap was cut short.

    Raises:
        MinigptError: neither holds a weights file.
    """
    directory = Path(directory)
    if (directory / WEIGHTS).is_file():
        return directory
    old = old_copy(directory)
    if (old / WEIGHTS).is_file():
        return old
    raise MinigptError(f"no checkpoint at {str(directory)!r} (missing {WEIGHTS}); train first or pick another run")


def read_meta(ckpt: str | Path) -> dict[str, Any]:
    """A checkpoint folder's ``meta.json``: name, step, the latest eval's losses and ``eval_step``,
    the tokenizer's fingerprint (resolved as :func:`resolve` does).

    Raises:
        MinigptError: no checkpoint there.
        OSError, ValueError: meta.json missing, unreadable, not JSON, or not a JSON object.
    """
    meta = json.loads((resolve(ckpt) / META).read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    return meta


def open_checkpoint(run: Optional[str | Path], which: str) -> tuple[Path, Path]:
    """The run folder (``run``, or the newest under ``runs/``) and its checkpoint folder ``which``, for
    generate, evaluate, export and inspect: ``best`` falls back to ``last`` when the run has no best yet.

    Raises:
        MinigptError: ``which`` is not best or last, no such folder, or no checkpoint in it.
    """
    if which not in (BEST, LAST):
        raise MinigptError(f"--checkpoint {which!r}: use {BEST} or {LAST}")
    run_dir = Path(run) if run is not None else latest_run()
    if not run_dir.is_dir():
        raise MinigptError(f"run folder {str(run_dir)!r} not found; pass a run folder (runs/NAME) of a trained run")
    ckpt = checkpoint_dir(run_dir, which)
    if which == BEST and not has_weights(ckpt):
        ckpt = checkpoint_dir(run_dir, LAST)
    if not has_weights(ckpt):
        tried = f"neither {BEST} nor {LAST} holds" if which == BEST else f"{LAST} holds no"
        raise MinigptError(f"no checkpoint at {str(run_dir / CHECKPOINTS)!r} ({tried} {WEIGHTS}); "
                           "train first or pick another run")
    return run_dir, ckpt


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a loadable ``last`` or ``best`` checkpoint."""
    for which in (LAST, BEST):
        try:
            resolve(checkpoint_dir(run_dir, which))
            return True
        except MinigptError:
            pass
    return False


def newest_run(root: str | Path, name: Optional[str] = None) -> Optional[Path]:
    """The run under ``root`` whose ``last`` checkpoint (or its ``.old`` copy) was written most recently.

    With ``name``, only runs whose checkpoint's ``meta.json`` carries that
    config name count. None when there is none.
    """
    root = Path(root)
    found = []
    if root.is_dir():
        for run in root.iterdir():
            try:
                ckpt = resolve(checkpoint_dir(run, LAST))
            except MinigptError:
                continue
            if name is not None:
                try:
                    if read_meta(ckpt).get("name") != name:
                        continue
                except (OSError, ValueError):
                    continue
            found.append(((ckpt / WEIGHTS).stat().st_mtime, run))
    return max(found)[1] if found else None


def latest_run(runs_dir: str | Path = "runs") -> Path:
    """The most recently written run under ``runs_dir`` that has a checkpoint (:func:`newest_run`).

    Raises:
        MinigptError: no run with a checkpoint exists there.
    """
    run = newest_run(runs_dir)
    if run is None:
        raise MinigptError(
            f"no trained run found under {str(runs_dir)!r}; train one first "
            f"(minigpt train configs/shakespeare-cpu.yaml) or pass --run runs/NAME"
        )
    return run


def find_resume_dir(out_dir: str | Path, name: str, resume: str) -> Optional[Path]:
    """The run folder ``--resume`` names: ``auto`` (the newest run of config name ``name``) or a path.

    Returns None for ``auto`` when no run of that name has a checkpoint yet.

    Raises:
        MinigptError: a given path has no resumable checkpoint.
    """
    if resume != "auto":
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise MinigptError(f"--resume {resume}: no such run folder")
        resolve(checkpoint_dir(run_dir, LAST))  # raises a clear error when there is none
        return run_dir
    return newest_run(out_dir, name)


# ----------------------------------------------------------------------------- lock and folder


class RunLock:
    """An exclusive ``flock`` on ``runs/<name>/.lock``, held while one process trains in the folder.

    Two processes writing one run folder would interleave metrics and
    checkpoints; the second one is refused instead. The lock goes with the
    process (the kernel drops it on exit, SIGKILL included), so a crashed run
    never leaves its folder locked. The file holds the owner's pid, for the
    message, and is left in place (removing it would race with a new owner).
    """

    FILE = LOCK

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / self.FILE
        self._fd: Optional[int] = None

    def acquire(self, fix: str) -> "RunLock":
        """Take the lock without waiting.

        Args:
            fix: what the user should do when another process holds it.

        Raises:
            MinigptError: another process holds it (the message names its pid
                and ``fix``), or the lock file cannot be created.
        """
        if fcntl is None:
            return self
        not_a_file = (f"{self.path} is not a regular file (a link, folder or device where minigpt keeps its "
                      f"lock); remove it and try again")
        try:
            # O_NOFOLLOW: a link planted as .lock must not make us truncate its target;
            # O_NONBLOCK: a FIFO there must not hang the open.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise MinigptError(not_a_file) from None
            raise MinigptError(
                f"cannot create the lock file {str(self.path)!r} ({exc.strerror}); "
                "check the run folder's permissions"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise MinigptError(not_a_file)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            try:
                pid = self.path.read_text(encoding="utf-8").strip() or "unknown"
            except OSError:
                pid = "unknown"
            raise MinigptError(f"{self.run_dir} is in use by another minigpt train (pid {pid}); {fix}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (closing the file drops it); a second call does nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class RunFolder:
    """The run folder this process trains in, its lock, and whether this process made it."""

    path: Path
    lock: RunLock
    created: bool = False  # made by this process
    was_empty: bool = False  # existed and was empty (a --run-name folder the user made)

    def discard_if_unsaved(self) -> None:
        """After a failure: undo a new run folder that never got a checkpoint.

        A folder this process created is removed; one that was empty before is
        emptied again. A folder with a checkpoint, or one that held anything
        before, is left alone.
        """
        if not (self.created or self.was_empty) or has_checkpoint(self.path):
            return
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for entry in self.path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def check_run_name(out_dir: str | Path, run_name: str) -> Path:
    """The folder ``--run-name`` names, refused as :func:`new_run_dir` would refuse it, without making it.

    A folder may be named only by a plain name, and may already exist only if
    it is an empty folder (one the user made for the run).

    Raises:
        MinigptError: a name that is not a plain folder name, or a path that holds something already.
    """
    _check_name(run_name)
    run_dir = Path(out_dir) / run_name
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError(f"{str(run_dir)!r} exists and is not a folder; pick another --run-name")
    if run_dir.is_dir() and _occupied(run_dir):
        raise _taken(run_dir)
    return run_dir


def _check_name(run_name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run_name) or run_name in (".", ".."):
        raise MinigptError(f"--run-name {run_name!r}: use letters, digits, '.', '_' and '-' only "
                           "(a plain folder name that needs no quoting), e.g. --run-name my-run")


def _occupied(run_dir: Path) -> bool:
    return any(p.name != RunLock.FILE for p in run_dir.iterdir())


def _taken(run_dir: Path) -> MinigptError:
    if has_checkpoint(run_dir):
        return MinigptError(f"run folder {str(run_dir)!r} already exists; pick another --run-name, "
                            f"or continue it with --resume {run_dir}")
    return MinigptError(f"run folder {str(run_dir)!r} already exists and holds no checkpoint (a run that stopped "
                        f"before its first save); delete the folder or pick another --run-name")


def new_run_dir(out_dir: str | Path, name: str, run_name: Optional[str]) -> RunFolder:
    """Create and lock ``<out_dir>/<run_name>``, or ``<out_dir>/<name>-<YYYYmmdd-HHMMSS>``.

    Race-free: the folder is made with ``mkdir(exist_ok=False)``, and an
    unnamed run that meets a folder of the same name (two runs started in the
    same second) takes the next free one, ``<name>-<date>-<time>-2``, ``-3``, ...
    A folder named by ``--run-name`` may already exist only if it is empty.
    The caller releases the lock.

    Raises:
        MinigptError: a bad --run-name, a folder that already holds something,
            or one another process is training in.
    """
    root = Path(out_dir)
    if run_name is not None:
        _check_name(run_name)
    root.mkdir(parents=True, exist_ok=True)
    if run_name is None:
        base = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        for n in range(1, 1000):
            run_dir = root / (base if n == 1 else f"{base}-{n}")
            try:
                run_dir.mkdir()
            except FileExistsError:
                continue
            return RunFolder(run_dir, RunLock(run_dir).acquire("pass --run-name"), created=True)
        raise MinigptError(f"999 run folders named {base}* already exist under {root}; pass --run-name")
    run_dir = root / run_name
    try:
        run_dir.mkdir()
        created = True
    except FileExistsError:
        created = False
        if not run_dir.is_dir():
            raise MinigptError(f"{str(run_dir)!r} exists and is not a folder; pick another --run-name") from None
    if not created and _occupied(run_dir) and not (run_dir / RunLock.FILE).exists():
        raise _taken(run_dir)  # an old run: no lock file to create in it
    lock = RunLock(run_dir).acquire("wait for it or pass another --run-name")
    if not created and _occupied(run_dir):
        lock.release()
        raise _taken(run_dir)
    return RunFolder(run_dir, lock, created=created, was_empty=not created)


# ----------------------------------------------------------------------------- env.json


def git_commit() -> Optional[str]:
    """The project's git commit, if the package runs from a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
        return (out.stdout.strip() or None) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def env_info(device: torch.device, dtype: torch.dtype, world_size: int = 1, linear_kernel: str = "torch.mm",
             dropout_kernel: str = "torch") -> dict:
    """Versions, device, git commit and the kernels of the training step's linear layers
    (:func:`~minigpt_cli.runtime.kernels.onednn.linear_kernel`) and dropout
    (:func:`~minigpt_cli.runtime.kernels.dropout.dropout_kernel`), for env.json."""
    import importlib.metadata as md

    import numpy as np
    import torch

    def ver(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "minigpt": ver("minigpt-cli"),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "world_size": world_size,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # The kernel behind the training step's linear layers (model.linear); results differ by float32 rounding.
        "linear_kernel": linear_kernel,
        # minigpt's CPU dropout masks (kernels.dropout), PyTorch's, or none (dropout 0); their masks differ.
        "dropout_kernel": dropout_kernel,
        "cuda": torch.version.cuda,
        "git_commit": git_commit(),
        "argv": sys.argv,
        # The folder train ran in: argv's and the config's relative paths (data.data_dir, ...) are relative to it.
        "cwd": os.getcwd(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def write_env(run_dir: Path, env: dict[str, Any]) -> None:
    """Write ``env.json`` (atomically)."""
    atomic_write_text(Path(run_dir) / ENV, json.dumps(env, indent=1))


def training_dirs(run_dir: Path, out_dir: str | Path) -> list[Path]:
    """Where the folder ``train`` ran in may be now, most likely first: ``env.json``'s ``cwd``, then the
    folder a relative ``train.out_dir`` hangs from, where the run folder is now ``<that>/<out_dir>/<run>``
    (the same folder unless the project was moved, with its runs, after training)."""
    out_found: list[Path] = []
    try:
        cwd = json.loads((Path(run_dir) / ENV).read_text(encoding="utf-8")).get("cwd")
    except (OSError, ValueError, AttributeError):
        cwd = None
    if isinstance(cwd, str) and cwd:
        out_found.append(Path(cwd))
    out = Path(os.path.normpath(out_dir))
    if not out.is_absolute() and ".." not in out.parts:
        parent = Path(os.path.normpath(Path(run_dir).absolute())).parent  # <that folder>/<out_dir>
        n = len(out.parts)  # 0 for "."
        if not n or parent.parts[-n:] == out.parts:
            hung = Path(*parent.parts[:len(parent.parts) - n])
            if hung not in out_found:
                out_found.append(hung)
    return out_found


def earlier_sessions(run_dir: Path) -> list[dict[str, Any]]:
    """The sessions recorded in a run's ``env.json`` so far, oldest first (for a resumed run's env.json).

    A missing or damaged file gives none.
    """
    try:
        before = json.loads((Path(run_dir) / ENV).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(before, dict):
        return []
    earlier = before.pop("earlier_sessions", [])
    return (earlier if isinstance(earlier, list) else []) + [before]
