"""Atomic file writes (a temporary file beside the target, fsync, rename) and the one line for an
OSError; bounded reads (:class:`Bounds`) of regular files only (:func:`open_regular`: a FIFO
would block forever) whose failures, by cause, become one line (:func:`read_problem`); the check
of an output before it is written (:func:`check_writable`: a dangling link, a FIFO refused).

A reader (or a process killed half-way) sees the old file or the new one, never a half-written one;
the file gets the mode a plain ``open()`` would give it, not :func:`tempfile.mkstemp`'s ``0o600``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .errors import MinigptError

#: What to do about an OSError, by errno: for a path the user gave, and for a path inside a run folder (which
#: the user did not name, so cannot "choose another" of); the messages of :func:`os_error_message`.
_FIXES = {
    errno.ENOSPC: ("free some disk space or choose another location", "free some disk space"),
    errno.EDQUOT: (
        "free some space in your quota or choose another location",
        "free some space in your quota",
    ),
    errno.EFBIG: (
        "choose a location on a file system that takes larger files",
        "copy the run folder to a file system that takes larger files and resume the copy",
    ),
    errno.EROFS: (
        "choose a location on a writable file system",
        "the run folder is on a read-only file system; copy it to a writable one and resume the copy",
    ),
    errno.EACCES: (
        "check the permissions of the folder or choose another location",
        "check the permissions of the run folder and of its files",
    ),
    errno.EISDIR: (
        "give the path of a file, not of a folder",
        "a folder is in the way of that file; remove or rename the folder",
    ),
    errno.ENOTDIR: (
        "a part of the path is a file, not a folder; choose another path",
        "a file is in the way of a folder on that path; remove or rename the file",
    ),
    errno.EEXIST: (
        "a file is in the way of a folder there; move it or choose another path",
        "a file is in the way of that folder; remove or rename the file",
    ),
    errno.ENOENT: ("check that the folder exists", "check that the run folder exists"),
    errno.ENAMETOOLONG: ("choose a shorter name", "choose a shorter name"),
    errno.EINVAL: ("give the path of a regular file", "remove it and try again"),
}
_FIXES[errno.EPERM] = _FIXES[
    errno.EACCES
]  # an operation not permitted: the same permissions to check


def os_error_message(
    exc: OSError, path: str | Path | None = None, action: str | None = None, in_run: bool = False
) -> str:
    """One line for an OSError: ``cannot <action> PATH: <strerror>; <fix>``. ``path``: default the
    error's ``filename2`` (a rename's target), else its ``filename``; ``in_run``: a path minigpt
    keeps in a run folder, so the fix says what is in its way instead of asking for another path."""
    if path is None:
        path = exc.filename2 if exc.filename2 is not None else exc.filename
    if action is None:
        action = "access" if exc.errno == errno.ENOENT else "write"
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = _FIXES[exc.errno][in_run] if exc.errno in _FIXES else "check the path"
    if isinstance(exc, NotRegularFile):
        fix = "replace it with a regular file" if in_run else "give a file"
    if isinstance(path, (str, bytes, os.PathLike)):
        path = os.fsdecode(path)
        # What mkdir or rename through a link to nothing report: exists, not a folder, missing.
        dangles = exc.errno in (errno.ENOENT, errno.EEXIST, errno.ENOTDIR, errno.ELOOP)
        link = dangling_link(path) if dangles else None
        if link is not None:
            reason = f"{link} {link_problem(link)}"
            fix = "point the link at an existing folder, or remove it"
    where = f" {path}" if path is not None else ""
    return " ".join(f"cannot {action}{where}: {reason}; {fix}".split())


def dangling_link(path: str | Path) -> Path | None:
    """``path`` or the first of its folders that is a symbolic link to nothing (or to itself, a
    loop), else None."""
    for p in (Path(path), *Path(path).parents):
        if os.path.islink(p) and not _resolves(p):
            return p
    return None


def _resolves(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError:  # nothing there (ENOENT), a loop of links (ELOOP), a file on the way (ENOTDIR)
        return False
    return True


def link_problem(link: str | Path) -> str:
    """What is wrong with a link :func:`dangling_link` found, after its name: ``is a link to 'T',
    which does not exist``, or ``is a link loop (it leads back to itself)``."""
    try:
        os.stat(link)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a link loop (it leads back to itself)"
    target = "?"
    with suppress(OSError):
        target = os.readlink(link)
    return f"is a link to {target!r}, which does not exist"


#: The name of each kind of file that is not a regular one, by its ``stat`` test.
_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class NotRegularFile(OSError):
    """A path that is a FIFO, a socket or a device, where a file is read or written: reading a FIFO
    would wait forever for a writer; ``kind`` names it (``a FIFO``)."""

    def __init__(self, path: str | Path, kind: str):
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", str(path))
        self.kind = kind


def file_kind(mode: int) -> str | None:
    """The name of a ``st_mode`` that is neither a regular file nor a folder (``a FIFO``), else
    None."""
    return next((name for test, name in _NOT_REGULAR if test(mode)), None)


def check_regular(path: str | Path) -> None:
    """Refuse ``path`` (followed through links) if it is a FIFO, a socket or a device: raises
    :class:`NotRegularFile`. Nothing there, or a folder, passes (the open says so)."""
    try:
        kind = file_kind(os.stat(path).st_mode)
    except OSError:
        return
    if kind is not None:
        raise NotRegularFile(path, kind)


def open_regular(path: str | Path):
    """``open(path, "rb")``, refusing a FIFO, socket or device before any read could wait on it: it
    is stat'ed, then opened without blocking (a FIFO's open waits for a writer) and checked again by
    its own ``fstat`` (a swap after the stat). Raises :class:`NotRegularFile`, IsADirectoryError, or
    the open's OSError."""
    check_regular(path)  # a socket's open fails (ENXIO): named by its stat first
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        kind = file_kind(mode)
        if kind is not None:
            raise NotRegularFile(path, kind)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class errors_as:
    """A ``with`` block in which an exception of a type in ``table`` becomes the error its entry
    builds from it (the first matching entry, in order; an entry that returns None lets the
    exception pass); anything else passes unchanged. The one place that turns the failures of
    reading and writing files into one line."""

    def __init__(
        self,
        table: Mapping[type | tuple[type, ...], Callable[[BaseException], BaseException | None]],
    ):
        self.table = table

    def __enter__(self) -> "errors_as":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        make = next((make for k, make in self.table.items() if isinstance(exc, k)), None)
        error = make(exc) if make is not None else None
        if error is not None:
            raise error from None
        return False


def os_error(
    path: str | Path | None = None, action: str = "write", in_run: bool = False
) -> Callable[[OSError], MinigptError]:
    """For :class:`errors_as`: an OSError as ``cannot <action> PATH: <reason>; <fix>``
    (:func:`os_error_message`)."""
    return lambda exc: MinigptError(os_error_message(exc, path, action, in_run), path=path)


class os_errors(errors_as):
    """A ``with`` block in which an OSError becomes ``cannot <action> PATH: <reason>; <fix>``
    (:func:`os_error_message`); ``path`` may be set on the block as it moves from file to file."""

    def __init__(self, path: str | Path | None = None, action: str = "write", in_run: bool = False):
        self.path = path
        super().__init__({OSError: lambda exc: os_error(self.path, action, in_run)(exc)})


#: The parts of a pydantic error's location that name its own validators, not a key: ``constrained-int``,
#: ``function-after[...]``, a union member's class (``Range``) or type (``int``, ``list[str]``).
_PYDANTIC_TAG = re.compile(
    r"(constrained|function|json|tagged|lax|is|nullable|default|chain|custom)-[a-z-]+(\[.*\])?"
    r"|[A-Z]\w*|(int|float|str|bool|list|dict)(\[.*\])?"
)


def field_path(loc: Sequence[Any]) -> str:
    """A pydantic error's location as the dotted key a user wrote (``seeds``,
    ``search.params.KEY.step``)."""
    return ".".join(
        str(part) for part in loc if not (isinstance(part, str) and _PYDANTIC_TAG.fullmatch(part))
    )


def schema_problem(exc, skip: int = 0) -> str:
    """A pydantic ValidationError's first problem as ``field.sub: message`` (``skip``: leading parts
    of the location left out, such as a tagged union's tag); the one wording of a damaged file's
    field."""
    err = exc.errors()[0]
    where = field_path(err["loc"][skip:] or err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Bounds:
    """The most a file of one kind may hold, checked before it is parsed: ``max_bytes`` (its size on
    disk) and ``max_depth`` (levels of nested lists and mappings, in JSON or YAML)."""

    max_bytes: int
    max_depth: int = 32


#: A config or a sweep file: a few flat sections; a long ``sample.prompt`` belongs in --prompt-file.
YAML_BOUNDS = Bounds(1 << 20, 16)
#: A tokenizer.json: Gemma 3's is 33 MB and a vocabulary of 2^20 entries takes about 60 MB; the
#: deepest shipped by Hugging Face nest normalizers and pre-tokenizers about 8 levels.
TOKENIZER_BOUNDS = Bounds(256 << 20, 64)
#: The JSON files minigpt writes itself (meta.json, env.json, sweep.json): small, a few levels.
STATE_BOUNDS = Bounds(64 << 20, 32)
#: An Optuna study's journal file or SQLite database (a trial's record is a few KB).
STUDY_BOUNDS = Bounds(4 << 30)
#: Any other JSON a user names (a Hugging Face config.json, a weights index, a JSON Lines document).
JSON_BOUNDS = Bounds(256 << 20, 64)


class TooLarge(ValueError):
    """A file past its :class:`Bounds`; the message names the limit."""


def _size(n: int) -> str:
    return f"{n:,} bytes" + (f" ({n / (1 << 20):,.0f} MiB)" if n >= 1 << 20 else "")


def read_problem(
    exc: BaseException, path: str | Path, what: str, fix: str | None = None
) -> MinigptError:
    """The one line for a file that cannot be read, by its cause: ``cannot read WHAT 'PATH'``
    (permissions, a disk's error), ``WHAT 'PATH' not found``, ``... is a link to 'T', which does not
    exist`` (a dangling link) or ``... is a link loop``, ``... is a folder``, ``... is not a regular
    file (a FIFO)`` (:class:`NotRegularFile`), ``... is too large`` / ``nested too deeply``
    (:class:`Bounds`), or ``WHAT 'PATH' is damaged (why)`` for a parse error (any ValueError, a YAML
    error). ``what``: the kind of file (``tokenizer file``); ``fix``: the caller's fix for a missing
    or damaged file, never for one that is only unreadable (whose fix is its permissions, not its
    deletion)."""
    path = Path(path)
    named = f"{what} {str(path)!r}"
    if isinstance(exc, PermissionError):
        return MinigptError(
            f"cannot read {named}: permission denied",
            f"give your user read access to it and to its folders (ls -l {path}), "
            "or run as its owner",
            path=path,
        )
    if isinstance(exc, NotRegularFile):
        return MinigptError(f"{named} is not a regular file ({exc.kind})", "give a file", path=path)
    if isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == errno.ELOOP:
        link = dangling_link(path)
        if link is not None:
            return MinigptError(
                f"{named}: {str(link)!r} {link_problem(link)}",
                "point the link at an existing file, or give the path of the file itself",
                path=path,
            )
    if isinstance(exc, FileNotFoundError):
        return MinigptError(f"{named} not found", fix or "check the path", path=path)
    if isinstance(exc, IsADirectoryError):
        return MinigptError(f"{named} is a folder", "give the path of a file", path=path)
    if isinstance(exc, NotADirectoryError):
        return MinigptError(
            f"{named} not found: a part of its path is a file, not a folder",
            "check the path",
            path=path,
        )
    if isinstance(exc, TooLarge):
        return MinigptError(f"{named} {exc}", fix or "give a smaller file", path=path)
    if isinstance(exc, OSError):
        if exc.errno == errno.ELOOP:
            return MinigptError(
                f"{named} is a link that leads back to itself", "fix the link", path=path
            )
        return MinigptError(
            f"cannot read {named}: {exc.strerror or exc}", "check the disk and the path", path=path
        )
    if isinstance(exc, UnicodeDecodeError):
        at = f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start:,}"
        return MinigptError(
            f"{named} is not UTF-8 text ({at})", "convert it to UTF-8 (e.g. with iconv)", path=path
        )
    if isinstance(exc, RecursionError):
        return MinigptError(
            f"{named} is nested too deeply to read", fix or "give a smaller file", path=path
        )
    why = (getattr(exc, "problem", None) or str(exc).splitlines()[0] or type(exc).__name__).strip()
    return MinigptError(f"{named} is damaged ({why})", fix, path=path)


def check_readable(
    path: str | Path, what: str, bounds: Bounds | None = None, fix: str | None = None
) -> int:
    """The size in bytes of a file a library reads itself (a study, weights), once it is found to
    open for reading within ``bounds``. Raises MinigptError as :func:`read_bytes` does."""
    with errors_as({OSError: lambda exc: read_problem(exc, path, what, fix)}):
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
    if bounds is not None and size > bounds.max_bytes:
        raise _too_large(path, what, size, bounds.max_bytes)
    return size


def read_bytes(
    path: str | Path, what: str, bounds: Bounds | None = None, fix: str | None = None
) -> bytes:
    """The bytes of a regular file, refused past ``bounds.max_bytes`` before any is read (a file
    that grows: after ``max_bytes + 1``). Raises MinigptError (:func:`read_problem`): unreadable,
    missing, a dangling link or a link loop, a folder, a FIFO/socket/device, too large."""
    limit = bounds.max_bytes if bounds is not None else None
    with errors_as({OSError: lambda exc: read_problem(exc, path, what, fix)}):
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if limit is not None and size > limit:
                raise _too_large(path, what, size, limit)
            data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise _too_large(path, what, len(data), limit)
    return data


def _too_large(path: str | Path, what: str, size: int, limit: int) -> MinigptError:
    return read_problem(TooLarge(f"is {_size(size)}, over the limit of {_size(limit)}"), path, what)


def read_text(
    path: str | Path, what: str, bounds: Bounds | None = None, fix: str | None = None
) -> str:
    """:func:`read_bytes` as UTF-8 text, a leading byte-order mark dropped (Windows editors write
    one). Raises MinigptError as :func:`read_bytes` does, and for bytes that are not UTF-8."""
    data = read_bytes(path, what, bounds, fix)
    with errors_as({UnicodeDecodeError: lambda exc: read_problem(exc, path, what, fix)}):
        return data.decode("utf-8-sig")


def depth(obj: Any) -> int:
    """Levels of nested lists and dicts in ``obj`` (a scalar: 0), counted without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            values = item.values() if isinstance(item, dict) else item
            stack.extend((v, level + 1) for v in values if isinstance(v, (list, dict)))
    return deepest


def parse_json(
    text: str | bytes, path: str | Path, what: str, bounds: Bounds, fix: str | None = None
) -> Any:
    """JSON ``text`` (of file ``path``) as Python objects, nested at most ``bounds.max_depth``
    levels. Raises MinigptError (:func:`read_problem`, with ``fix``): damaged (not JSON), nested
    too deeply."""
    too_deep = TooLarge(f"is nested more than {bounds.max_depth} levels deep, the limit")
    # json's C parser stops at the interpreter's recursion limit with a RecursionError, having built
    # no more than that many nested containers; a shallower excess is counted in what it built.
    with errors_as(
        {
            RecursionError: lambda exc: read_problem(too_deep, path, what, fix),
            ValueError: lambda exc: read_problem(exc, path, what, fix),
        }
    ):
        obj = json.loads(text)
    if depth(obj) > bounds.max_depth:
        raise read_problem(too_deep, path, what, fix)
    return obj


def read_json(path: str | Path, what: str, bounds: Bounds, fix: str | None = None) -> Any:
    """The JSON file ``path`` within ``bounds`` (:func:`read_text`, :func:`parse_json`)."""
    return parse_json(read_text(path, what, bounds, fix), path, what, bounds, fix)


def read_text_file(path: str | Path, option: str, bounds: Bounds | None = None) -> str:
    """The text of a UTF-8 file the user named with ``option`` (``--prompt-file``, ``--text-file``):
    universal newlines (as a text editor shows them), a leading byte-order mark (Windows editors
    write one) dropped. Raises MinigptError ``{option} 'PATH' ...`` (:func:`read_problem`): missing,
    a folder, not UTF-8, unreadable, past ``bounds``."""
    text = read_text(path, option, bounds)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _umask() -> int:
    # /proc avoids os.umask's set-and-restore, which races with other threads.
    with (
        suppress(OSError, ValueError, IndexError),
        open("/proc/self/status", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(path: str | Path) -> int:
    """The permission bits a plain ``open(path, "w")`` leaves: the existing file's, else a new
    file's."""
    with suppress(OSError):
        return os.stat(path).st_mode & 0o777
    return new_file_mode()


def new_file_mode() -> int:
    """The permission bits a plain ``open(path, "w")`` gives a new file: ``0o666`` less the
    umask."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """The permission bits a plain ``os.mkdir`` leaves: ``0o777`` less the umask."""
    return 0o777 & ~_umask()


def chmod_quietly(path: str | Path | int, mode: int) -> None:
    """``chmod`` a path (or ``fchmod`` a file descriptor), ignoring file systems without modes (FAT,
    some mounts)."""
    with suppress(OSError):
        os.fchmod(path, mode) if isinstance(path, int) else os.chmod(path, mode)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (its folder made if needed; a link written through; a
    folder, device, FIFO or socket refused). Raises MinigptError ``cannot write PATH: <reason>;
    <fix>``."""
    atomic_write_set({path: data})


def atomic_write_set(files: dict[str | Path, bytes]) -> None:
    """Write several files as a set: each to a temporary file beside it, then all renamed into
    place; a failure or interrupt leaves the old set, the new one, or none, never a mix, and no
    temporary file. Raises MinigptError as :func:`atomic_write_bytes` does."""
    temps: dict[Path, str] = {}
    placed = 0
    try:
        with os_errors() as at:
            for given, data in files.items():
                at.path = _target(Path(given))
                _write_temp(at.path, data, temps)
            for at.path, tmp in temps.items():
                os.replace(tmp, at.path)
                placed += 1
    finally:
        if placed < len(
            temps
        ):  # a failure: no temporary file stays, nor a mix of new and old files
            for target, tmp in temps.items():
                Path(tmp).unlink(missing_ok=True)
                if placed:
                    target.unlink(missing_ok=True)


def _target(path: Path) -> Path:
    """Where :func:`atomic_write_set` writes ``path``: a symbolic link's target, as open() would. A
    link to nothing (or a loop) is refused: writing would make its target's folders elsewhere."""
    if dangling_link(path) is not None:
        raise _error(errno.ENOENT, path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _write_temp(path: Path, data: bytes, temps: dict[Path, str]) -> None:
    """``data`` flushed to a new temporary file beside ``path``, with the mode ``path`` has or a new
    file would get; recorded in ``temps`` as soon as it exists, for removal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():
        # A device, FIFO or socket: renaming over it would replace it (as root, /dev/null for
        # everyone).
        code, why = (
            (errno.EISDIR, None)
            if path.is_dir()
            else (errno.EINVAL, "not a regular file (a device, FIFO or socket)")
        )
        raise OSError(code, why or os.strerror(code), str(path))
    mode = file_mode(path)
    fd, temps[path] = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        chmod_quietly(f.fileno(), mode)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


#: How much longer than its file's name the temporary name of :func:`atomic_write_bytes` is: ``.NAME.`` and
#: :func:`tempfile.mkstemp`'s 8 random characters and ``.tmp``.
_TEMP_EXTRA = len("..") + 8 + len(".tmp")


def _limit(path: Path, name: str, default: int) -> int:
    with suppress(OSError, ValueError):
        return os.pathconf(path, name)
    return default


def _stat(path: Path) -> os.stat_result | OSError | None:
    """``os.stat(path)``; None when nothing is there; the OSError when something on the way stops
    it."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc


def write_problem(path: str | Path, folder: bool, append: bool = False) -> OSError | None:
    """The OSError that writing at ``path`` would end with (the one the failing call would raise,
    naming its path), found without writing anything; None when none is expected. ``folder``: a
    folder to make and write into, else a file :func:`atomic_write_bytes` writes, or with ``append``
    one written in place. Permissions are judged by :func:`os.access`, so what root may write
    passes."""
    path = Path(path)
    if folder:
        return _folder_problem(path)
    st = _stat(path)
    if isinstance(st, OSError):
        if st.errno != errno.ENOTDIR:
            return _error(st.errno, path)
        st = None
    if st is None and os.path.islink(path):
        # A link to nothing: writing through it would make its target's folders somewhere else.
        return _error(errno.ENOENT, path)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return _error(errno.EISDIR, path)
        kind = file_kind(st.st_mode)
        if kind is not None:
            return NotRegularFile(path, kind)
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
    while (st := _stat(at)) is None and at != at.parent:
        if at.is_symlink():  # a link to nothing: mkdir cannot make it (os_error_message names it)
            return _error(errno.ENOENT, path)
        missing.append(at)
        at = at.parent
    if st is None:
        return None
    if isinstance(st, OSError):
        return _error(st.errno, path)
    if not stat.S_ISDIR(st.st_mode):
        return _error(errno.EEXIST if not missing else errno.ENOTDIR, path)
    name_max = _limit(at, "PC_NAME_MAX", 255)
    if any(len(os.fsencode(p.name)) > name_max for p in missing) or len(
        os.fsencode(str(path))
    ) >= _limit(at, "PC_PATH_MAX", 4096):
        return _error(errno.ENAMETOOLONG, path)
    if not _can_write(
        at
    ):  # mkdir stops at the first folder it cannot make; an existing one takes no entry
        return _denied(at, missing[-1] if missing else path)
    return None


def _can_write(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _denied(folder: Path, named: Path) -> OSError:
    readonly = False
    with suppress(OSError, AttributeError):
        readonly = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    return _error(errno.EROFS if readonly else errno.EACCES, named)


def _error(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


def check_writable(
    path: str | Path, folder: bool, append: bool = False, in_run: bool = False
) -> None:
    """Refuse a path that :func:`write_problem` says cannot be written, with the line writing it
    would give: MinigptError ``cannot write PATH: <reason>; <fix>`` (``in_run`` as
    :func:`os_error_message` takes it)."""
    problem = write_problem(path, folder, append)
    if problem is not None:
        raise MinigptError(os_error_message(problem, action="write", in_run=in_run))
