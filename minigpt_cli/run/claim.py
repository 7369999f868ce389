"""Making and locking run folders: the lock one ``train`` holds while it writes there, new and
reused folders, and the mark by which a group torchrun restarted finds its folder (the names are
:mod:`.folder`'s)."""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import stat
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

try:  # POSIX; elsewhere run folders are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

from ..errors import MinigptError
from ..fileio import (
    atomic_write_text,
    errors_as,
    open_regular,
    os_error,
    os_errors,
)
from .folder import ELASTIC, LOCK, check_name, has_checkpoint, made_here, named_pid

# ----------------------------------------------------------------------------- lock and folder


class RunLock:
    """An exclusive ``flock`` on ``runs/<name>/.lock`` while one process trains there. The kernel
    drops it when the process ends (SIGKILL included); the file holds the owner's pid and stays: it
    marks the folder."""

    FILE = LOCK

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / self.FILE
        self._fd: Optional[int] = None

    def acquire(self, fix: str, mark: bool = True) -> "RunLock":
        """Take the lock without waiting; ``fix``: what to do when another process holds it;
        ``mark``: write this process's pid now (else :meth:`mark` does, at the caller's first
        write). Raises MinigptError: another process holds it (naming its pid), or the lock file
        cannot be made or written."""
        if fcntl is None:
            return self
        kind = MinigptError(
            f"{self.path} is not a regular file (a link, folder or device where minigpt keeps its "
            "lock)",
            "remove it and try again",
            path=self.path,
        )
        # O_NOFOLLOW: a link planted as .lock must not make us truncate its target (ELOOP);
        # O_NONBLOCK: a FIFO there must not hang the open. A folder is EISDIR, a device without a
        # reader ENXIO.
        with errors_as(
            {
                OSError: lambda exc: (
                    kind
                    if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO)
                    else os_error(self.path, "create", in_run=True)(exc)
                )
            }
        ):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        with ExitStack() as on_failure:
            on_failure.callback(os.close, fd)
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
            if not (regular and _flock(fd)):
                raise (
                    kind
                    if not regular
                    else MinigptError(
                        f"{self.run_dir} is in use by another minigpt train (pid {self._owner()})",
                        fix,
                        path=self.run_dir,
                    )
                )
            self._fd = fd
            on_failure.callback(setattr, self, "_fd", None)
            if mark:
                self.mark()
            on_failure.pop_all()
        return self

    def mark(self) -> None:
        """Write this process's pid into the held lock file (only for the message another process
        shows). Raises MinigptError: it cannot be written."""
        if self._fd is not None:
            with os_errors(self.path, "write", in_run=True):  # say which file
                os.ftruncate(self._fd, 0)
                os.write(self._fd, f"{os.getpid()}\n".encode())

    def _owner(self) -> str:
        """The pid the lock file names, for the message."""
        return named_pid(self.path)

    def release(self) -> None:
        """Drop the lock (closing the file drops it); a second call does nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _flock(fd: int) -> bool:
    """Whether an exclusive lock on ``fd`` was taken without waiting (False: another process holds
    it)."""
    with suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    return False


def clear_unsaved(run_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """Empty a run folder minigpt made (:func:`made_here`) that never got a checkpoint (entries are
    removed, never followed), but for the entries named in ``keep``. Raises MinigptError when the
    folder holds files that are not minigpt's."""
    assert not has_checkpoint(run_dir), run_dir  # the callers keep a run that has one
    if _occupied(run_dir) and not made_here(run_dir):
        raise _not_ours(run_dir)
    for entry in Path(run_dir).iterdir():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


@dataclass
class RunFolder:
    """The run folder this process trains in, its lock, and whether this process made it."""

    path: Path
    lock: RunLock
    created: bool = False  # made by this process (or by its torchrun job's first group)
    was_empty: bool = False  # existed and was empty (a --run-name folder the user made)
    keep: bool = False  # kept after a failure even unsaved: torchrun restarts the job in it

    def discard_if_unsaved(self) -> None:
        """After a failure: remove a run folder this process made, or empty again one that was empty
        before, when it never got a checkpoint. Anything else is left alone, and so is a folder
        :attr:`keep` keeps."""
        if self.keep or not (self.created or self.was_empty) or has_checkpoint(self.path):
            return
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            clear_unsaved(self.path)


def _occupied(run_dir: Path) -> bool:
    return any(p.name != LOCK for p in run_dir.iterdir())


def _not_ours(run_dir: Path) -> MinigptError:
    return MinigptError(
        f"{str(run_dir)!r} holds files minigpt did not make",
        "move them away, or pick another name for the run",
        path=str(run_dir),
    )


def _taken(run_dir: Path) -> MinigptError:
    """Why ``run_dir``, which holds something, cannot be a new run's folder."""
    if has_checkpoint(run_dir):
        return MinigptError(
            f"run folder {str(run_dir)!r} already exists",
            f"pick another --run-name, or continue it with --resume {run_dir}",
            path=str(run_dir),
        )
    if made_here(run_dir):
        return MinigptError(
            f"run folder {str(run_dir)!r} holds a run that stopped before its first save",
            "delete the folder or pick another --run-name",
            path=str(run_dir),
        )
    return _not_ours(run_dir)


def _make(run_dir: Path) -> bool:
    """Make the folder ``run_dir``; False when something is there already."""
    with suppress(FileExistsError):
        run_dir.mkdir()
        return True
    return False


def check_run_name(out_dir: str | Path, run_name: str) -> Path:
    """The folder ``--run-name`` names, refused as :func:`new_run_dir` would refuse it, without
    making it. Raises MinigptError: not a plain folder name, or a path that holds something
    already."""
    run_dir = Path(out_dir) / check_name(run_name, "--run-name")
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError(
            f"{str(run_dir)!r} exists and is not a folder",
            "pick another --run-name",
            path=str(run_dir),
        )
    if run_dir.is_dir() and _occupied(run_dir):
        raise _taken(run_dir)
    return run_dir


def new_run_dir(
    out_dir: str | Path, name: str, run_name: Optional[str], keep: bool = False
) -> RunFolder:
    """Create and lock ``<out_dir>/<run_name>`` (which may exist only if empty), or
    ``<out_dir>/<name>-<YYYYmmdd-HHMMSS>[-N]``; the caller releases the lock. ``keep``: see
    :attr:`RunFolder.keep`. Raises MinigptError: a bad --run-name, a folder that already holds
    something, or one in use."""
    root = Path(out_dir)
    if run_name is not None:  # refused before the lock file is made in a folder of the user's
        check_run_name(root, run_name)
    root.mkdir(parents=True, exist_ok=True)
    if run_name is None:
        base = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        for n in itertools.count(
            1
        ):  # a free name comes soon: only runs started in the same second share a base
            run_dir = root / (base if n == 1 else f"{base}-{n}")
            if _make(run_dir):
                lock = RunLock(run_dir).acquire("pass --run-name")
                return RunFolder(run_dir, lock, created=True, keep=keep)
    run_dir = root / run_name
    created = _make(run_dir)
    lock = RunLock(run_dir).acquire("wait for it or pass another --run-name")
    with (
        ExitStack() as on_failure
    ):  # an empty folder check_run_name let through may have filled since
        on_failure.callback(lock.release)
        check_run_name(root, run_name)
        on_failure.pop_all()
    return RunFolder(run_dir, lock, created=created, was_empty=not created, keep=keep)


# ----------------------------------------------------------------------------- torchrun restarts


def mark_elastic(run_dir: Path, run_id: str) -> None:
    """Write :data:`ELASTIC` in ``run_dir`` (atomically): the torchrun job ``run_id`` trains
    there."""
    atomic_write_text(Path(run_dir) / ELASTIC, json.dumps({"run_id": run_id}) + "\n")


def _elastic_id(run_dir: Path) -> Optional[str]:
    """The run id :func:`mark_elastic` wrote in ``run_dir``; None: none, or not readable."""
    with suppress(OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError):
        with open_regular(Path(run_dir) / ELASTIC) as f:
            return json.loads(f.read().decode("utf-8")).get("run_id")
    return None


def find_elastic_run(out_dir: str | Path, run_id: str) -> Optional[Path]:
    """The run folder under ``out_dir`` that torchrun job ``run_id`` trains in
    (:func:`mark_elastic`; of several, the one marked last: an ``--rdzv-id`` used again by a later
    job); None: none."""
    root = Path(out_dir)
    found = []
    for run in root.iterdir() if root.is_dir() else ():
        if _elastic_id(run) == run_id:
            with suppress(OSError):
                found.append(((run / ELASTIC).stat().st_mtime_ns, run))
    return max(found)[1] if found else None


def reuse_run_dir(run_dir: Path, keep: bool = False) -> RunFolder:
    """Lock again the run folder a torchrun job's earlier group made (:func:`find_elastic_run`) and
    that got no checkpoint, and empty it but for its lock and :data:`ELASTIC`: the run starts over
    in it. The caller releases the lock; ``keep``: see :attr:`RunFolder.keep`. Raises MinigptError:
    another process holds it."""
    lock = RunLock(run_dir).acquire("wait for it to finish, or stop it")
    with ExitStack() as on_failure:
        on_failure.callback(lock.release)
        clear_unsaved(run_dir, keep=(LOCK, ELASTIC))
        on_failure.pop_all()
    return RunFolder(run_dir, lock, created=True, keep=keep)
