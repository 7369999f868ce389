"""The run folder: the one place that spells its names; finding runs and their checkpoints;
meta.json (:mod:`.claim` makes and locks run folders, :mod:`.env` writes env.json).

runs/<name>/  config.yaml tokenizer.json env.json .lock (the lock, and the mark of a folder minigpt
  made) .torchelastic (under torchrun: the job's run id, by which a restarted group finds the
  folder) checkpoints/{last,best,step-0000500}/  model.safetensors trainer_state.pt config.yaml
  meta.json checkpoints/.<which>.old/  the previous copy while :mod:`.checkpoint` swaps one in
  (:func:`resolve`)
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import time
from contextlib import suppress
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
    check_regular,
    dangling_link,
    errors_as,
    link_problem,
    open_regular,
    read_bytes,
    read_problem,
    schema_problem,
)

if (
    TYPE_CHECKING
):  # torch is imported where env.json is written, so the CLI can read these names without it
    pass

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
            return named_pid(lock)
        return None
    finally:
        os.close(fd)  # closing drops a lock taken here


def named_pid(lock: Path) -> str:
    """The pid a lock file names, for messages ("unknown" when it names none or cannot be read)."""
    with suppress(OSError, UnicodeDecodeError):
        return lock.read_text(encoding="utf-8").strip() or "unknown"
    return "unknown"


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
