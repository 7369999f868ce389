"""Where a download writes: a locked partial file, the sweep of stale ones, the final rename.

A download streams into ``.input.txt.<random>.part`` beside its target, holding an exclusive ``flock`` on
it; a later download removes only partial files that are unlocked and stale. The verified file is renamed
over the target, a user's own differing file there kept under a backup name first.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time
from contextlib import suppress
from itertools import count
from pathlib import Path
from typing import IO, Callable

# Not on Windows: stale partial files are then judged by age alone.
fcntl = None if sys.platform == "win32" else importlib.import_module("fcntl")

from ..fileio import new_file_mode
from ..paths import CORPUS_FILE

#: Glob of the partial files a download streams into (``NamedTemporaryFile`` names).
PART_GLOB = f".{CORPUS_FILE}.*.part"
#: A partial file modified this recently may belong to a download still running.
_STALE_AFTER_S = 5.0 if fcntl is not None else 3600.0


def sweep_partial_files(folder: Path) -> list[Path]:
    """Delete the partial downloads (:data:`PART_GLOB`) a killed earlier download left in ``folder``: those
    unlocked and unmodified for a few seconds (without ``fcntl``: an hour). Returns the files removed."""
    removed = []
    with suppress(OSError):
        candidates = sorted(folder.glob(PART_GLOB))
        now = time.time()
        for part in candidates:
            with suppress(OSError):
                if not part.is_file() or part.is_symlink() or now - part.stat().st_mtime < _STALE_AFTER_S:
                    continue
                with open(part, "rb") as f:
                    if fcntl is not None:
                        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a download holds it
                    part.unlink()
                removed.append(part)
    return removed


def open_part(dest: Path) -> IO[bytes]:
    """A new partial file beside ``dest`` (:data:`PART_GLOB`), locked to tell
    :func:`sweep_partial_files` of a later download that this one is alive."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, prefix=f".{CORPUS_FILE}.", suffix=".part")
    with suppress(OSError):
        if fcntl is not None:
            fcntl.flock(part.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    return part


def back_up(path: Path, genuine: Callable[[Path], bool]) -> Path | None:
    """Keep the user's own file at ``path`` (one that fails the checksum) under a backup name; return it.

    It is hard-linked to ``input.txt.bak`` (else the first free ``.bak-N``), so ``path`` stays in place until
    the verified download replaces it; where links are not possible it is renamed. Nothing is kept (None)
    for an absent, empty or genuine file, or a symlink (replacing a link leaves its target untouched).
    """
    if path.is_symlink() or not path.is_file() or path.stat().st_size == 0 or genuine(path):
        return None
    names = (path.with_name(f"{path.name}.bak{f'-{n}' if n else ''}") for n in count())
    for bak in (b for b in names if not os.path.lexists(b)):
        try:
            os.link(path, bak, follow_symlinks=False)
        except OSError:
            if os.path.lexists(bak):
                continue  # taken meanwhile: the next free name
            os.rename(path, bak)  # no hard links on this file system
        return bak


def install(part: str, dest: Path, genuine: Callable[[Path], bool]) -> Path | None:
    """Rename the verified ``part`` over ``dest``, keeping a differing file there (:func:`back_up`).

    Returns the backup, or None. On failure the user's file stays where it was.
    """
    os.chmod(part, new_file_mode())  # NamedTemporaryFile creates mode 0600; give the corpus the usual mode
    backup = back_up(dest, genuine)
    try:
        os.replace(part, dest)
    except OSError:
        if backup is not None and not os.path.lexists(dest):  # undo the backup
            os.rename(backup, dest)
        elif backup is not None:
            os.remove(backup)
        raise
    return backup
