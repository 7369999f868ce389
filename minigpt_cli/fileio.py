"""Atomic file writes: a temporary file in the same folder, fsync, then a rename.

A reader (or a process killed half-way) sees either the old file or the new
one, never a half-written one. The file gets the mode a plain ``open()`` would
give it (an existing file keeps its mode, a new one gets ``0o666`` less the
umask), not the ``0o600`` of :func:`tempfile.mkstemp`. A write that fails
(disk full, read-only folder, a path through a file) is a one-line
:class:`~minigpt_cli.errors.MinigptError` naming the path, and leaves the old
file and no temporary file behind.

:func:`read_text_file` reads a text file a user names with an option
(``generate --prompt-file``, ``evaluate --text-file``) the same way for every
option (universal newlines, a leading byte-order mark dropped), with the same
one-line errors.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from .errors import MinigptError

#: What to do about an OSError, by errno: for a path the user gave, and for a path inside a run folder (which
#: the user did not name, so cannot "choose another" of); the messages of :func:`os_error_message`.
_FIXES = {
    errno.ENOSPC: ("free some disk space or choose another location", "free some disk space"),
    errno.EDQUOT: ("free some space in your quota or choose another location", "free some space in your quota"),
    errno.EFBIG: ("choose a location on a file system that takes larger files",
                  "copy the run folder to a file system that takes larger files and resume the copy"),
    errno.EROFS: ("choose a location on a writable file system",
                  "the run folder is on a read-only file system; copy it to a writable one and resume the copy"),
    errno.EACCES: ("check the permissions of the folder or choose another location",
                   "check the permissions of the run folder and of its files"),
    errno.EPERM: ("check the permissions of the folder or choose another location",
                  "check the permissions of the run folder and of its files"),
    errno.EISDIR: ("give the path of a file, not of a folder",
                   "a folder is in the way of that file; remove or rename the folder"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder; choose another path",
                    "a file is in the way of a folder on that path; remove or rename the file"),
    errno.EEXIST: ("a file is in the way of a folder there; move it or choose another path",
                   "a file is in the way of that folder; remove or rename the file"),
    errno.ENOENT: ("check that the folder exists", "check that the run folder exists"),
    errno.ENAMETOOLONG: ("choose a shorter name", "choose a shorter name"),
}


def os_error_message(exc: OSError, path: str | Path | None = None, action: str | None = None,
                     in_run: bool = False) -> str:
    """One line for an OSError: ``cannot <action> PATH: <strerror>; <fix>``.

    Args:
        exc: the error.
        path: the path the user knows (default: the error's ``filename2``, the
            target of a rename, else its ``filename``).
        action: ``"write"``, ``"read"``, ...; None: ``"access"`` for a missing
            file, else ``"write"`` (reads are reported where they happen).
        in_run: the path is one minigpt keeps inside a run folder, not one the user gave: the fix says what
            to do about what is in its way instead of asking for another path.
    """
    if path is None:
        path = exc.filename2 if exc.filename2 is not None else exc.filename
    if action is None:
        action = "access" if exc.errno == errno.ENOENT else "write"
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = _FIXES[exc.errno][in_run] if exc.errno in _FIXES else "check the path"
    if isinstance(path, (str, bytes, os.PathLike)):
        path = os.fsdecode(path)
    where = f" {path}" if path is not None else ""
    return " ".join(f"cannot {action}{where}: {reason}; {fix}".split())


#: What :func:`read_text_file` says about a text file the user named that cannot be read.
_READ = {
    "not_found": "{option} {path!r} not found",
    "folder": "{option} {path!r} is a folder; give a text file",
    "not_utf8": "{option} {path!r} is not UTF-8 text; convert it (e.g. with iconv)",
    "unreadable": "{option} {path!r} cannot be read ({reason})",
}


def read_text_file(path: str | Path, option: str) -> str:
    """The text of a UTF-8 file the user named with ``option`` (``--prompt-file``, ``--text-file``), read
    alike for every option: universal newlines (``\r\n`` and ``\r`` become ``\n``, as a text editor shows
    them) and a leading byte-order mark dropped (``utf-8-sig``: Windows editors write one).

    Raises:
        MinigptError: ``{option} 'PATH' ...``: not found, a folder, not UTF-8, or unreadable (permissions, ...).
    """
    fields = {"option": option, "path": str(path)}
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except FileNotFoundError:
        raise MinigptError(_READ["not_found"].format(**fields)) from None
    except IsADirectoryError:
        raise MinigptError(_READ["folder"].format(**fields)) from None
    except UnicodeDecodeError:
        raise MinigptError(_READ["not_utf8"].format(**fields)) from None
    except OSError as exc:
        raise MinigptError(_READ["unreadable"].format(reason=exc.strerror or exc, **fields)) from None


def _umask() -> int:
    # /proc avoids os.umask's set-and-restore, which races with other threads.
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(path: str | Path) -> int:
    """The permission bits a plain ``open(path, "w")`` leaves: the existing file's, else ``0o666`` less the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def new_file_mode() -> int:
    """The permission bits a plain ``open(path, "w")`` gives a new file: ``0o666`` less the umask."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """The permission bits a plain ``os.mkdir`` leaves: ``0o777`` less the umask."""
    return 0o777 & ~_umask()


def chmod_quietly(path: str | Path | int, mode: int) -> None:
    """``chmod`` a path (or ``fchmod`` a file descriptor), ignoring file systems without modes."""
    try:
        if isinstance(path, int):
            os.fchmod(path, mode)
        else:
            os.chmod(path, mode)
    except OSError:
        pass


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, creating the parent folder if needed.

    A symbolic link is written through (its target is replaced, the link
    stays); a device, FIFO or socket at ``path`` is refused, never replaced.

    Raises:
        MinigptError: the file cannot be written (``cannot write PATH: <reason>;
            <fix>``); the old file, if any, is untouched and no temporary file is left.
    """
    atomic_write_set({path: data})


def atomic_write_set(files: dict[str | Path, bytes]) -> None:
    """Write several files as a set: each to a temporary file beside it first, then all renamed into place.

    A failure or an interrupt (Ctrl-C, SIGTERM unwinding) while the temporary files are written leaves the
    old files as they were and no temporary file; one while they are renamed (a moment) removes the files of
    the set, so the set is the old one, the new one, or none, never a mix. Each file as
    :func:`atomic_write_bytes` writes it.

    Raises:
        MinigptError: a file cannot be written, as :func:`atomic_write_bytes` says it.
    """
    temps: dict[Path, str] = {}
    path = None
    try:
        for given, data in files.items():
            path = _target(Path(given))
            temps[path] = _write_temp(path, data)
        placed = []
        try:
            for path, tmp in temps.items():
                os.replace(tmp, path)
                placed.append(path)
        except BaseException:
            if placed:  # a mix of new and old files: leave none
                for target in temps:
                    target.unlink(missing_ok=True)
            raise
        temps = {}
    except OSError as exc:
        raise MinigptError(os_error_message(exc, path, "write")) from None
    finally:
        for tmp in temps.values():
            Path(tmp).unlink(missing_ok=True)


def _target(path: Path) -> Path:
    """Where :func:`atomic_write_set` writes ``path``: a symbolic link's target (written through, as open()
    would, instead of replacing the link)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _write_temp(path: Path, data: bytes) -> str:
    """``data`` in a new temporary file beside ``path`` (its folder made if needed), with the mode ``path``
    has or a new file would get, flushed to disk; returns its name. Removes it if the write fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if path.exists() and not path.is_file():
        # A device, FIFO or socket: renaming over it would replace it (as root, /dev/null for everyone).
        raise MinigptError(f"cannot write {path}: it is not a regular file (a device, FIFO or socket); "
                           "give the path of a file")
    mode = file_mode(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                os.fchmod(f.fileno(), mode)
            except OSError:  # a file system without modes (FAT, some network mounts)
                pass
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


#: How much longer than its file's name the temporary name of :func:`atomic_write_bytes` is: ``.NAME.`` and
#: :func:`tempfile.mkstemp`'s 8 random characters and ``.tmp``.
_TEMP_EXTRA = len("..") + 8 + len(".tmp")


def _limit(path: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(path, name)
    except (OSError, ValueError):
        return default


def write_problem(path: str | Path, folder: bool, append: bool = False) -> OSError | None:
    """The OSError that writing at ``path`` would end with, found without writing anything; None when none
    is expected.

    ``folder``: ``path`` is a folder to make if missing and write into (``Path.mkdir(parents=True,
    exist_ok=True)``, then new entries in it); else a file written by :func:`atomic_write_bytes` (its folder
    made if missing, a temporary file beside it renamed over it). The error is the one those calls would
    raise: a name longer than the file system takes (``ENAMETOOLONG``; for a file, counting the temporary
    name's extra characters), a file where a folder must be (``EEXIST`` for the folder itself, ``ENOTDIR``
    further up), a folder where the file must be (``EISDIR``), a folder that cannot be written into
    (``EACCES``, or ``EROFS`` on a read-only file system). It names the path the failing call names (a
    folder: the first one ``mkdir`` could not make; a file: the file, as :func:`atomic_write_bytes` does).
    Permissions are judged by :func:`os.access`, so what root may write passes.

    ``append``: the file is opened and written in place (``open(path, "a")``), not replaced: an existing one
    must itself be writable (not read-only, nor on a read-only mount), its folder need not be.
    """
    path = Path(path)
    if folder:
        return _folder_problem(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a file on the way (ENOTDIR), a name too long, a folder that cannot be searched
        st = None
        if exc.errno != errno.ENOTDIR:
            return _error(exc.errno, path)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return _error(errno.EISDIR, path)
        if append:
            return None if os.access(path, os.W_OK) else _denied(path, path)
        return None if _can_write(path.parent) else _denied(path.parent, path)
    problem = _folder_problem(path.parent)
    if problem is not None:
        return _error(problem.errno, path)
    if len(os.fsencode(path.name)) + _TEMP_EXTRA > _limit(path.parent, "PC_NAME_MAX", 255):
        return _error(errno.ENAMETOOLONG, path)
    return None


def _folder_problem(path: Path) -> OSError | None:
    """:func:`write_problem` of a folder."""
    missing: list[Path] = []  # the folders mkdir would make, deepest first
    at = path
    while True:
        try:
            st = os.stat(at)
            break
        except FileNotFoundError:
            if at == at.parent:
                return None
            missing.append(at)
            at = at.parent
        except OSError as exc:  # a file on the way (ENOTDIR), a name too long, a folder that cannot be searched
            return _error(exc.errno, path)
    if not stat.S_ISDIR(st.st_mode):
        return _error(errno.EEXIST if not missing else errno.ENOTDIR, path)
    name_max = _limit(at, "PC_NAME_MAX", 255)
    if any(len(os.fsencode(p.name)) > name_max for p in missing) or \
            len(os.fsencode(str(path))) >= _limit(at, "PC_PATH_MAX", 4096):
        return _error(errno.ENAMETOOLONG, path)
    if not _can_write(at):  # mkdir stops at the first folder it cannot make; an existing one takes no entry
        return _denied(at, missing[-1] if missing else path)
    return None


def _can_write(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _denied(folder: Path, named: Path) -> OSError:
    try:
        readonly = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        readonly = False
    return _error(errno.EROFS if readonly else errno.EACCES, named)


def _error(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


def check_writable(path: str | Path, folder: bool, append: bool = False, in_run: bool = False) -> None:
    """Refuse a path that :func:`write_problem` says cannot be written, with the line writing it would give.

    ``append`` as :func:`write_problem` takes it; ``in_run`` as :func:`os_error_message` does (a path inside a
    run folder: the fix says what to remove or rename rather than ask for another path).

    Raises:
        MinigptError: ``cannot write PATH: <reason>; <fix>`` (:func:`os_error_message`).
    """
    problem = write_problem(path, folder, append)
    if problem is not None:
        raise MinigptError(os_error_message(problem, action="write", in_run=in_run))
