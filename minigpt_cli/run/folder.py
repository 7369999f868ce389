"""The run folder: the one place that spells its names; finding, naming and locking runs; meta.json,
env.json.

runs/<name>/  config.yaml tokenizer.json env.json .lock (the lock, and the mark of a folder minigpt
  made) .torchelastic (under torchrun: the job's run id, by which a restarted group finds the
  folder) checkpoints/{last,best,step-0000500}/  model.safetensors trainer_state.pt config.yaml
  meta.json checkpoints/.<which>.old/  the previous copy while :mod:`.checkpoint` swaps one in
  (:func:`resolve`)
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

try:  # POSIX; elsewhere run folders are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

from ..errors import MinigptError
from ..fileio import (
    STATE_BOUNDS,
    atomic_write_text,
    check_regular,
    dangling_link,
    errors_as,
    link_problem,
    open_regular,
    os_error,
    os_errors,
    read_bytes,
    read_problem,
    schema_problem,
)

if (
    TYPE_CHECKING
):  # torch is imported where env.json is written, so the CLI can read these names without it
    import torch

CHECKPOINTS = "checkpoints"
LAST = "last"
BEST = "best"
#: A checkpoint folder's files.
WEIGHTS = "model.safetensors"
#: The moving average of the weights, beside them, in a run trained with ``train.ema_decay``.
EMA = "ema.safetensors"
STATE = "trainer_state.pt"
CONFIG = "config.yaml"
META = "meta.json"
#: The run folder's own files (besides the logs of :mod:`minigpt_cli.run.metrics`).
ENV = "env.json"
TOKENIZER = "tokenizer.json"
LOCK = ".lock"
#: The torchrun job (its run id) that trains in the folder: a restarted group finds it by this.
ELASTIC = ".torchelastic"
#: The state file of a sweep's folder (:mod:`minigpt_cli.experiments.sweep`): it holds runs, and is
#: none.
SWEEP = "sweep.json"
#: How many of a sweep's runs an error names before it counts the rest.
NAMED = 3
#: A name minigpt makes a file or folder of: one plain folder entry, never ``.``, ``..``, a path or
#: a separator.
NAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9._-]+")


def check_name(name: str, what: str) -> str:
    """``name`` when it is one plain folder entry (:data:`NAME`); ``what`` says where it was
    given."""
    if not NAME.fullmatch(name):
        raise MinigptError(
            f"{what} {name!r} is not a plain folder name",
            "use ASCII letters, digits, '.', '_' and '-' (not . or ..)",
        )
    return name


def checkpoint_dir(run_dir: str | Path, which: str) -> Path:
    """``<run_dir>/checkpoints/<which>`` (``last``, ``best`` or a kept ``step-NNNNNNN``)."""
    return Path(run_dir) / CHECKPOINTS / which


def keep_edited_config(run_dir: Path, new_text: str) -> Optional[Path]:
    """Before a resume rewrites ``<run_dir>/config.yaml`` with ``new_text``: an edit of it (neither
    the last checkpoint's config nor ``new_text``) copied to ``config.yaml.edited[-N]``, and that
    path; else None."""
    path = Path(run_dir) / CONFIG
    text = saved = None
    with suppress(
        OSError, UnicodeDecodeError
    ):  # either unreadable: nothing to compare, nothing kept
        # open_regular: a FIFO in their place would block a plain read forever.
        with open_regular(path) as f:
            text = f.read().decode("utf-8")
        with open_regular(checkpoint_dir(run_dir, LAST) / CONFIG) as f:
            saved = f.read().decode("utf-8")
    if saved is None or text in (saved, new_text):
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
    """Where :func:`~minigpt_cli.run.checkpoint.save` keeps the previous copy while it swaps:
    ``.<which>.old``."""
    return directory.parent / f".{directory.name}.old"


def _saving(directory: Path) -> bool:
    """Whether a save of checkpoint ``directory`` is under way: its temporary folder or its ``.old``
    copy is there (:func:`~minigpt_cli.run.checkpoint.save`), and a ``train`` holds the run (those a
    killed save left behind are no save)."""
    with suppress(OSError):
        left = old_copy(directory).exists() or any(
            directory.parent.glob(f".{glob_escape(directory.name)}.tmp-*")
        )
        return left and training_pid(directory.parent.parent) is not None
    return False


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _find(directory: Path) -> Optional[Path]:
    """``directory`` or its ``.old`` copy, whichever holds a weights file; None when neither does.

    A save swaps the new folder in with two renames (``last`` to ``.last.old``, the temporary to
    ``last``): a reader that looks at ``last`` before the first and at ``.last.old`` after the
    second finds neither. So while a save is under way (:func:`_saving`) it looks again, and once
    none is, a last time: a swap that ended between the looks left ``directory`` in place. Waits at
    most :data:`_SWAP_WAIT` seconds.
    """
    deadline = time.monotonic() + _SWAP_WAIT
    # A folder that cannot be looked into, or weights that are a link to nothing, are named as such
    # (:func:`~minigpt_cli.fileio.read_problem`), not taken for a missing checkpoint.
    with errors_as({OSError: lambda exc: read_problem(exc, directory, "checkpoint folder")}):
        weights = directory / WEIGHTS
        if weights.is_symlink() and not weights.exists():
            raise read_problem(FileNotFoundError(), weights, "checkpoint weights")
        while True:
            for candidate in (directory, old_copy(directory)):
                if (candidate / WEIGHTS).is_file():
                    return candidate
            if not _saving(directory):
                return directory if weights.is_file() else None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.002)


#: How long a reader waits for a save it meets mid-swap (a swap is two renames: microseconds, but a loaded
#: machine may pause the writer between them).
_SWAP_WAIT = 30.0


def has_weights(directory: str | Path) -> bool:
    """Whether the checkpoint folder ``directory``, or its ``.old`` copy, holds a weights file (a
    save under way is waited for: :func:`_find`). Raises MinigptError: a folder that cannot be
    looked into, weights that are a link to nothing."""
    return _find(Path(directory)) is not None


def resolve(directory: str | Path) -> Path:
    """The checkpoint folder to load: ``directory``, or its ``.old`` copy if a swap was cut short or
    is under way (:func:`_find`). Raises MinigptError when neither holds a weights file."""
    found = _find(Path(directory))
    if found is None:
        raise no_checkpoint(Path(directory), f"missing {WEIGHTS}")
    return found


def _identity(directory: Path) -> tuple[Optional[int], Optional[int]]:
    """The inodes of ``directory`` and its ``.old`` copy (None: absent): every save makes a new
    folder."""
    ids = []
    for candidate in (directory, old_copy(directory)):
        try:
            ids.append(os.stat(candidate).st_ino)
        except OSError:
            ids.append(None)
    return ids[0], ids[1]


def steady(directory: str | Path, read: Callable[[], Any]) -> Any:
    """``read()`` of checkpoint ``directory``'s files, read again when a save swapped the folder
    meanwhile (its files then come from two checkpoints, or vanish half-way): what a reader of a run
    in training gets is one checkpoint's. Raises what ``read`` raises when the folder stayed as it
    was."""
    directory = Path(directory)
    for _ in range(_STEADY_TRIES):
        before = _identity(directory)
        try:
            result = read()
        except MinigptError:
            if _identity(directory) == before:
                raise
            continue
        if _identity(directory) == before:
            return result
    return read()


#: Reads of one checkpoint a reader tries while saves keep replacing it.
_STEADY_TRIES = 50


def training_pid(run_dir: Path) -> Optional[str]:
    """The pid of the ``train`` that holds ``run_dir``'s lock now ("unknown" when the file names
    none); None when no process holds it (or there is no lock)."""
    if fcntl is None:
        return None
    lock = Path(run_dir) / LOCK
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:  # shared and released at once: a holder's exclusive lock refuses it
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return RunLock(run_dir)._owner()
        return None
    finally:
        os.close(fd)  # closing drops a lock taken here


def no_checkpoint(directory: Path, why: str) -> MinigptError:
    """The error for a checkpoint folder ``directory`` without weights (``why``): train first, or,
    while a ``train`` holds the run (it has not saved yet), wait for its first save."""
    run_dir = (
        directory.parent
        if directory.name == CHECKPOINTS
        else directory.parent.parent
        if directory.parent.name == CHECKPOINTS
        else directory
    )
    pid = training_pid(run_dir)
    if pid is not None:
        return MinigptError(
            f"no checkpoint at {str(directory)!r} yet ({why}): the run is training (pid {pid}) and has "
            "not saved one",
            "wait for its first save (train.eval_interval steps), then try again",
            path=str(directory),
        )
    return MinigptError(
        f"no checkpoint at {str(directory)!r} ({why})",
        "train first or pick another run",
        path=str(directory),
    )


class Meta(BaseModel):
    """``meta.json``'s schema: what readers rely on is typed; the trainer's other facts pass
    through."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: Optional[str] = None
    step: int = Field(0, ge=0)
    eval_step: Optional[int] = Field(None, ge=0)
    world_size: int = Field(1, ge=1)
    train_loss: Optional[float] = None
    val_loss: Optional[float] = None
    tokenizer_fingerprint: str = ""  # absent in checkpoints from before it was recorded; never null
    corpus: Optional[dict[str, Any]] = None
    sha256: Optional[dict[str, str]] = (
        None  # file name -> hex digest; absent in checkpoints of earlier versions
    )
    meta_sha256: Optional[str] = (
        None  # :func:`meta_digest` of the other fields; absent in earlier versions
    )


def meta_digest(fields: dict[str, Any]) -> str:
    """The sha256 of ``meta.json``'s fields but its own digest, as canonical JSON: an edited step or
    loss shows."""
    fields = {k: v for k, v in fields.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def read_meta(ckpt: str | Path) -> dict[str, Any]:
    """A checkpoint folder's ``meta.json`` (resolved as :func:`resolve` does, read as :func:`steady`
    reads), checked by :class:`Meta` and by the digest of its fields it was written with. Raises
    MinigptError: no checkpoint there; meta.json unreadable, damaged (naming the field) or edited
    since it was written."""
    return steady(ckpt, lambda: _read_meta(ckpt))


def _read_meta(ckpt: str | Path) -> dict[str, Any]:
    path = resolve(ckpt) / META
    other = {BEST: LAST, LAST: BEST}.get(Path(ckpt).name, "another checkpoint")
    # The fix names the other checkpoint only where there is one (best falls back to last before
    # any eval).
    has_other = other not in (BEST, LAST) or has_weights(Path(ckpt).parent / other)

    def damaged(why: str) -> MinigptError:
        if has_other:
            return MinigptError(
                f"{path} is missing or damaged ({why})",
                f"copy {other}'s meta.json there if its weights are intact, or read {other} "
                f"instead (generate, evaluate and export: --checkpoint {other})",
                path=path,
            )
        return MinigptError(
            f"{path} is missing or damaged ({why}); the run has no other checkpoint",
            "restore meta.json from a copy, or train the run again",
            path=path,
        )

    with errors_as({OSError: lambda exc: read_problem(exc, path, "checkpoint metadata")}):
        missing = not path.exists() and not path.is_symlink()  # a dangling link is read_problem's
    if missing:
        raise damaged(os.strerror(errno.ENOENT))
    data = read_bytes(path, "checkpoint metadata", STATE_BOUNDS)  # unreadable: not damaged
    with errors_as({ValidationError: lambda exc: damaged(schema_problem(exc))}):
        meta = Meta.model_validate_json(data).model_dump(exclude_unset=True)
    if meta.get("meta_sha256", meta_digest(meta)) != meta_digest(meta):
        raise damaged("its fields differ from the digest they were written with")
    return meta


def refuse_sweep(folder: Path) -> None:
    """Raise MinigptError naming its runs (how many, the first :data:`NAMED`) when ``folder``, given
    where a run folder is wanted, is a sweep's (it holds :data:`SWEEP`)."""
    if (folder / SWEEP).is_file():
        held = sorted(p.name for p in folder.iterdir() if (p / CONFIG).is_file())
        count = "no run yet" if not held else "1 run" if len(held) == 1 else f"{len(held)} runs"
        more = f" and {len(held) - NAMED} more" if len(held) > NAMED else ""
        held_text = f"{count} ({', '.join(held[:NAMED])}{more})" if held else count
        first = folder / (held[0] if held else "VARIANT-sSEED")
        raise MinigptError(
            f"{str(folder)!r} is a sweep's folder, not a run: it holds {held_text}",
            f"pass one of its runs, e.g. {first}, or compare them: minigpt compare {folder}",
            path=str(folder),
        )


def open_checkpoint(
    run: Optional[str | Path], which: str, runs_dir: str | Path = "runs"
) -> tuple[Path, Path]:
    """The run folder (``run``, or the newest under ``runs_dir``) and its checkpoint folder
    ``which`` (``best`` falls back to ``last`` before the first eval; ``step-N`` is the copy
    ``train.keep_every`` kept). Raises MinigptError: ``which`` is none of those, no run there, no
    such folder, a sweep's folder (:func:`refuse_sweep`), or no checkpoint in it."""
    newest = newest_run(runs_dir) if run is None else None
    run_dir = Path(run) if run is not None else newest or Path(runs_dir)
    kept = re.fullmatch(
        r"step-(\d{1,12})", which
    )  # a train.keep_every copy: step-15 or step-0000015
    name = kept_name(int(kept[1])) if kept else which
    ckpt = checkpoint_dir(
        run_dir, name if has_weights(checkpoint_dir(run_dir, name)) or kept else LAST
    )
    tried = {BEST: f"neither {BEST} nor {LAST} holds", LAST: f"{LAST} holds no"}.get(
        which, f"{name} holds no"
    )
    if run_dir.is_dir() and not has_weights(ckpt):
        refuse_sweep(run_dir)
    if which not in (BEST, LAST) and not kept:
        raise MinigptError(
            f"--checkpoint {which!r}: use {BEST}, {LAST} or a kept step-N (train.keep_every)"
        )
    if run is None and newest is None:
        raise MinigptError(
            f"no trained run found under {str(runs_dir)!r}",
            "train one first (minigpt train configs/shakespeare-cpu.yaml) or pass --run runs/NAME",
            path=str(runs_dir),
        )
    if not run_dir.is_dir():
        raise MinigptError(
            f"run folder {str(run_dir)!r} not found",
            "pass a run folder (runs/NAME) of a trained run",
            path=str(run_dir),
        )
    if kept and not ckpt.exists():  # a step never kept: name those there are, not "train first"
        steps = sorted(p.name for p in (run_dir / CHECKPOINTS).glob("step-*") if has_weights(p))
        there = f"the kept steps are {', '.join(steps)}" if steps else "it keeps no step-N"
        raise MinigptError(
            f"--checkpoint {which!r}: {str(run_dir)!r} kept no checkpoint at step {int(kept[1])}; "
            f"{there}",
            f"pass one of those, or {BEST} or {LAST}" if steps else f"pass {BEST} or {LAST}",
            path=str(ckpt),
        )
    weights = ckpt / WEIGHTS
    with errors_as({OSError: lambda exc: read_problem(exc, weights, "checkpoint weights")}):
        check_regular(weights)  # a FIFO there is no missing file (has_weights says only that)
    if not has_weights(ckpt):
        raise no_checkpoint(run_dir / CHECKPOINTS, f"{tried} {WEIGHTS}")
    return run_dir, ckpt


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a loadable ``last`` or ``best`` checkpoint."""
    return any(has_weights(checkpoint_dir(run_dir, which)) for which in (LAST, BEST))


def made_here(run_dir: Path) -> bool:
    """Whether minigpt made ``run_dir``: it holds the lock every run takes, or a checkpoint (older
    versions)."""
    return (Path(run_dir) / LOCK).is_file() or has_checkpoint(run_dir)


def newest_run(
    root: str | Path, name: Optional[str] = None, keep: Callable[[Path], bool] = lambda run: True
) -> Optional[Path]:
    """The run under ``root`` whose ``last`` checkpoint was written most recently (of config
    ``name``, and that ``keep`` keeps); or None."""
    found = []
    for run in Path(root).iterdir() if Path(root).is_dir() else ():
        if not has_weights(checkpoint_dir(run, LAST)) or not keep(run):
            continue
        ckpt = resolve(checkpoint_dir(run, LAST))
        with suppress(MinigptError):  # a damaged meta.json: not a run of that name
            if name is None or read_meta(ckpt).get("name") == name:
                found.append(((ckpt / WEIGHTS).stat().st_mtime, run))
    return max(found)[1] if found else None


def latest_run(runs_dir: str | Path = "runs") -> Path:
    """The most recently written run under ``runs_dir`` (:func:`newest_run`); MinigptError when
    there is none."""
    return open_checkpoint(None, LAST, runs_dir)[0]


def find_resume_dir(
    out_dir: str | Path, name: str, resume: str, keep: Callable[[Path], bool] = lambda run: True
) -> Optional[Path]:
    """The run folder ``--resume`` names: ``auto`` (the newest run of config ``name`` that ``keep``
    keeps, or None) or a path. Raises MinigptError when a given path has no resumable checkpoint
    (offering ``best`` when only it is left)."""
    if resume == "auto":
        return newest_run(out_dir, name, keep)
    run_dir = Path(resume)
    last, best = checkpoint_dir(run_dir, LAST), checkpoint_dir(run_dir, BEST)
    only_best = run_dir.is_dir() and not has_weights(last) and has_weights(best)
    if run_dir.is_file():
        raise MinigptError(
            f"--resume {resume} is a file, not a run folder",
            "pass the run's folder (runs/NAME), or auto",
            path=resume,
        )
    if not run_dir.is_dir():
        raise MinigptError(f"--resume {resume}: no such run folder", path=resume)
    link = dangling_link(last) if run_dir.is_dir() else None
    if link is not None:  # not a failed write: a link that leads nowhere, which cp -r would follow
        raise MinigptError(
            f"--resume {resume}: {str(link)!r} {link_problem(link)}",
            f"point the link at a checkpoint folder, or remove it (rm {link})",
            path=str(link),
        )
    if only_best:
        raise MinigptError(
            f"{str(run_dir / CHECKPOINTS)!r} has no last checkpoint (its write failed) but best, "
            f"step {read_meta(best).get('step')}, is intact",
            f"resume from best: cp -r {best} {last} && minigpt train ... --resume {run_dir}",
            path=str(run_dir / CHECKPOINTS),
        )
    resolve(last)  # a clear error when there is none
    return run_dir


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
        with suppress(OSError, UnicodeDecodeError):
            return self.path.read_text(encoding="utf-8").strip() or "unknown"
        return "unknown"

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
