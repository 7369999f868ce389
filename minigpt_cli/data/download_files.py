"""Where a download writes: a partial file locked by ``flock``, the sweep of stale ones, the final
rename."""

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

from ..fileio import new_file_mode
from ..paths import CORPUS_FILE

# Not on Windows: stale partial files are then judged by age alone.
fcntl = None if sys.platform == "win32" else importlib.import_module("fcntl")

#: Glob of the partial files a download streams into (``NamedTemporaryFile`` names).
PART_GLOB = f".{CORPUS_FILE}.*.part"
#: A partial file modified this recently may belong to a download still running.
_STALE_AFTER_S = 5.0 if fcntl is not None else 3600.0


def sweep_partial_files(
    folder: Path, pattern: str = PART_GLOB, stale_after: float = _STALE_AFTER_S
) -> list[Path]:
    """Delete (and return) the partial files (a download's, or ``pattern``) a killed process left in
    ``folder``: unlocked and untouched for ``stale_after`` seconds."""
    removed = []
    with suppress(OSError):
        candidates = sorted(folder.glob(pattern))
        now = time.time()
        for part in candidates:
            with suppress(OSError):
                if (
                    not part.is_file()
                    or part.is_symlink()
                    or now - part.stat().st_mtime < stale_after
                ):
                    continue
                with open(part, "rb") as f:
                    if fcntl is not None:
                        fcntl.flock(
                            f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB
                        )  # fails while a download holds it
                    part.unlink()
                removed.append(part)
    return removed


def open_part(dest: Path) -> IO[bytes]:
    """A new partial file beside ``dest``, locked to tell a later download's sweep that this one is
    alive."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = tempfile.NamedTemporaryFile(
        dir=dest.parent, delete=False, prefix=f".{CORPUS_FILE}.", suffix=".part"
    )
    with suppress(OSError):
        if fcntl is not None:
            fcntl.flock(part.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    return part


def back_up(path: Path, genuine: Callable[[Path], bool]) -> Path | None:
    """Keep the user's own file at ``path`` (failing the checksum) as ``input.txt.bak``
    (``.bak-N``): hard-linked, so it stays in place until replaced, else renamed. None for an
    absent, empty or genuine file, or a symlink."""
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
    """Rename the verified ``part`` over ``dest``, keeping a differing file there; return the
    backup, or None."""
    os.chmod(
        part, new_file_mode()
    )  # NamedTemporaryFile creates mode 0600; give the corpus the usual mode
    backup = back_up(dest, genuine)
    replaced = False
    try:
        os.replace(part, dest)
        replaced = True
    finally:
        if not replaced and backup is not None and not os.path.lexists(dest):  # undo the backup
            os.rename(backup, dest)
        elif not replaced and backup is not None:
            os.remove(backup)
    return backup
