"""What every ``minigpt`` command shares: one-line errors with exit statuses, a guarded stdout, help
layout.

A :class:`~minigpt_cli.errors.MinigptError`, a usage error, or a file or standard output that cannot
be written is one line on stderr and status 2; SIGTERM or SIGHUP 128 + the signal, Ctrl-C 130; a
closed pipe (``minigpt generate | head``) ends quietly with 0. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import io
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, Callable, List, NoReturn, Optional

import typer
from typer._click import (
    core as _click_core,
)
from typer._click import (
    exceptions as _click_exc,
)  # Typer's own copy of click (typer.core builds on it)
from typer.core import TyperArgument, TyperCommand, TyperGroup

from ..errors import Interrupted, MinigptError
from ..run import folder as runs

EXIT_USAGE = 2

# The options several commands share, defined once (Typer copies an Annotated option for each
# command).
SetOption = Annotated[
    List[str],
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a config key, e.g. --set train.learning_rate=3e-4; a list in "
        "brackets: --set 'tokenizer.special_tokens=[<|endoftext|>]' (repeatable).",
    ),
]
ProgressOption = Annotated[
    Optional[bool],
    typer.Option(
        "--progress/--no-progress",
        help="Show progress bars (default: only when stderr is a terminal).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DeviceOption = Annotated[
    str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps.")
]
RunOption = Annotated[
    Optional[Path],
    typer.Option("--run", metavar="DIR", help="Run folder (default: the most recent under runs/)."),
]
CheckpointOption = Annotated[
    str,
    typer.Option(
        "--checkpoint",
        metavar=f"{runs.BEST}|{runs.LAST}|step-N",
        help="best: the weights with the lowest val loss; last: the most recent save; step-N: the copy "
        "train.keep_every kept at step N.",
    ),
]

RawWeightsOption = Annotated[
    bool,
    typer.Option(
        "--raw-weights",
        help="For a run trained with train.ema_decay: use the trained weights themselves, not "
        "their moving average (the EMA weights, the default, are what the run's evals scored).",
    ),
]


class _StdoutError(Exception):
    """Writing to standard output failed (``> /dev/full``, a full disk); not an OSError, so no file
    is blamed."""

    def __init__(self, exc: OSError):
        super().__init__(exc.strerror or str(exc))


class _CtrlC(Exception):
    """A Ctrl-C inside a command, carried past Typer (which turns it into exit status 130 without a
    word)."""


class _StdoutClosed(Exception):
    """The reader of standard output left (``minigpt generate | head``); not a BrokenPipeError
    (click: status 1)."""


class _GuardedStdout:
    """``sys.stdout`` while a command runs: a failed write raises :class:`_StdoutError` or
    :class:`_StdoutClosed`."""

    def __init__(self, stream):
        self._stream = stream

    def _guard(self, method, *args):
        try:
            return method(*args)
        except OSError as exc:
            raise (
                _StdoutClosed() if isinstance(exc, BrokenPipeError) else _StdoutError(exc)
            ) from None

    def write(self, text):
        return self._guard(self._stream.write, text)

    def flush(self):
        return self._guard(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _drop_stdout() -> None:
    """Send what is left of standard output to /dev/null, so the flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        sys.stdout = open(os.devnull, "w")


class Group(TyperGroup):
    """Runs a command and renders what a user can cause as one line on stderr and an exit status
    (:func:`_exit`)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Typer would exit 130 silently; Group.main says what happened
            raise _CtrlC() from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        real_stdout = sys.stdout
        sys.stdout = _GuardedStdout(real_stdout)
        old_term = _install_termination_handlers()
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name or "minigpt",
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
            sys.stdout.flush()  # buffered output fails here, not silently at exit
        except (
            BaseException
        ) as exc:  # the one place errors are rendered; _exit re-raises what is a bug
            sys.stdout = real_stdout
            rv = _exit(exc)
        finally:
            for sig, handler in old_term.items():
                signal.signal(sig, handler)
            if isinstance(sys.stdout, _GuardedStdout):
                sys.stdout = real_stdout
        code = rv if isinstance(rv, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def _exit(exc: BaseException) -> int:
    """What ``exc``, raised by a command, becomes: the help (a bare ``minigpt``: 0), or one line on
    stderr and the process's exit (:func:`_fail`); an error that is not the user's (a bug) is raised
    again."""
    if isinstance(exc, _click_exc.NoArgsIsHelpError):  # bare `minigpt`: the help, not an error
        print(exc.format_message().rstrip("\n"))
        return 0
    if isinstance(exc, Interrupted):  # asked for: what was saved and how to go on, not an error
        if other_rank():  # under torchrun every rank stops; rank 0 says so
            sys.exit(exc.exit_code)
        _fail(str(exc), exc.exit_code, prefix="")
    if isinstance(
        exc, (_StdoutClosed, BrokenPipeError)
    ):  # e.g. `minigpt generate | head`: the reader left
        _drop_stdout()
        sys.exit(0)
    if isinstance(exc, _StdoutError):
        _drop_stdout()
    from ..fileio import os_error_message

    # An OSError the library did not wrap: a path (run folder, data folder) that is read-only, full,
    # a file where a folder should be, ...; one without a path or a disk's errno is a bug.
    disk = isinstance(exc, OSError) and (exc.filename is not None or exc.errno in _DISK_ERRNOS)
    line = (
        str(exc)
        if isinstance(exc, MinigptError)
        else _usage_line(exc)
        if isinstance(exc, _click_exc.UsageError)
        else STOPPED.format(name=signal.Signals(exc.signum).name)
        if isinstance(exc, _Terminated)
        else STOPPED.format(name="Ctrl-C")
        if isinstance(exc, (_CtrlC, typer.Abort, KeyboardInterrupt))
        else f"cannot write to standard output: {exc}"
        if isinstance(exc, _StdoutError)
        else os_error_message(exc)
        if disk
        else exc.format_message()
        if isinstance(exc, _click_exc.ClickException)
        else None
    )
    if line is None:
        raise exc
    signalled = isinstance(exc, (_Terminated, _CtrlC, typer.Abort, KeyboardInterrupt))
    code = (
        128 + exc.signum
        if isinstance(exc, _Terminated)
        else 130
        if signalled
        else getattr(exc, "exit_code", 2)
    )
    code = code if isinstance(exc, MinigptError) or signalled else EXIT_USAGE
    _fail(line, code, prefix="" if signalled else "error: ")


def _usage_line(exc) -> str:
    """A usage error as the tool's own one-liners read: ``--top-k 0: input should be greater than or
    equal to 1 (see 'minigpt generate --help')``; Typer checks an option's value through pydantic,
    whose error holds it."""
    path = exc.ctx.command_path if exc.ctx is not None else "minigpt"
    param = getattr(exc, "param", None)
    errors = exc.__cause__.errors() if hasattr(exc.__cause__, "errors") else []
    if param is None or not errors or type(exc) is not _click_exc.BadParameter:
        return f"{exc.format_message()} (see '{path} --help')"
    flag = max(getattr(param, "opts", None) or [param.name.upper()], key=len)
    msg = errors[0]["msg"].removeprefix("Value error, ")
    return f"{flag} {errors[0].get('input')}: {msg[0].lower() + msg[1:]} (see '{path} --help')"


class _Terminated(BaseException):
    """SIGTERM or SIGHUP outside the training loop (which saves and stops on its own)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise _Terminated(signum)


def _install_termination_handlers() -> dict:
    """Make SIGTERM and SIGHUP unwind like Ctrl-C, so ``finally`` blocks remove partial files (the
    training loop installs its own, which save first), and Ctrl-C raise KeyboardInterrupt even where
    the process was started with SIGINT ignored (``minigpt ... &`` in a script: Python then leaves
    it ignored, and every command but ``train``, which sets its own, would run to its end). Returns
    the handlers replaced."""
    if (
        threading.current_thread() is not threading.main_thread()
    ):  # only the main thread may set handlers
        return {}
    signals = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    replaced = {sig: signal.signal(sig, _raise_terminated) for sig in signals}
    replaced[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    return replaced


#: OSErrors that mean "the disk said no" even without a file name (a write to an open file).
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def _fail(message: str, code: int = EXIT_USAGE, prefix: str = "error: ") -> None:
    first = " ".join(str(message).split("\n")).strip()
    if len(first) > _MAX_ERROR:
        first = first[: _MAX_ERROR - 3] + "..."
    print(f"{prefix}{first}", file=sys.stderr)
    sys.exit(code)


#: Said when a signal stops a command that does not answer it itself (``train`` says more):
#: a file being written is removed, none is left half-written (each goes to a temporary name, then is renamed).
STOPPED = "stopped by {name} (no file left half-written)"

#: Longest error line printed; a message quoting a huge value is cut there.
_MAX_ERROR = 2000


class Command(TyperCommand):
    """A subcommand whose ``--help`` reads like a Unix tool's: ``--top-k K``, ``train [OPTIONS]
    CONFIG``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.metavar is None and not getattr(param, "is_flag", False):
                param.metavar = _default_metavar(param)

    def parse_args(self, ctx, args):
        """Parse ``args``, once no option's value is empty or blank (``--preset ''``,
        ``--output ' '``, ``--data-dir=``): an empty text read as not given ran the command on its
        default (``speedrun --recipe ''``: the track's own recipe), an empty path as the current
        folder (``download --data-dir ''`` wrote there), a blank one made a folder named " ".
        ``--prompt`` and ``--text`` may be blank (a space is text to continue or to cut; empty,
        their commands refuse them); a repeatable option's items are each command's to check.

        Raises:
            MinigptError: naming the option.
        """
        takes = {
            name: param
            for param in self.params
            if not isinstance(param, TyperArgument)
            and not getattr(param, "is_flag", False)
            and not getattr(param, "multiple", False)
            and param.name not in ("prompt", "text")
            for name in param.opts
        }
        for i, arg in enumerate(args):
            if arg == "--":
                break
            name, eq, value = arg.partition("=")
            if not eq or not arg.startswith("--"):
                name, value = arg, args[i + 1] if i + 1 < len(args) else None
            if name in takes and value is not None and not value.strip():
                what = "an empty value" if not value else f"a blank value {value!r}"
                raise MinigptError(
                    f"{name} {value!r}: {what}; give one, or leave {name} out for its default"
                )
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        """Run the command, once no argument is the empty text (options: :meth:`parse_args`).

        Raises:
            MinigptError: naming the argument.
        """
        for param in self.params:
            if (
                isinstance(param, TyperArgument)
                and ctx.params.get(param.name) == ""
                and ctx.get_parameter_source(param.name) == _click_core.ParameterSource.COMMANDLINE
            ):
                raise MinigptError(f"{param.metavar} '': an empty value; give one")
        return super().invoke(ctx)

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                pieces.append(param.metavar if param.required else f"[{param.metavar}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def format_options(self, ctx, formatter):
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, TyperArgument):
                arguments.append((param.metavar, record[1]))  # without Typer's type label
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _default_metavar(param) -> str:
    """``N`` for integers, ``X`` for other numbers, ``PATH``, ``TEXT``; an argument's own name in
    capitals."""
    if isinstance(param, TyperArgument):
        return param.name.upper()
    annotation = param.type_descriptor.annotation
    args = getattr(annotation, "__args__", None)
    if param.type_descriptor.is_list and args:
        annotation = args[0]
    return {int: "N", float: "X", Path: "PATH"}.get(annotation, "TEXT")


@contextlib.contextmanager
def fix_when_interrupted(fix: Callable[[Interrupted], Optional[str]]):
    """Adds ``fix(error)`` (how to go on; None or empty: nothing) to an :class:`Interrupted` raised
    inside."""
    try:
        yield
    except Interrupted as exc:
        text = fix(exc)
        if text:
            exc.with_fix(text)
        raise


def other_rank() -> bool:
    """True in a torchrun process other than rank 0 (``RANK`` set and not 0)."""
    return os.environ.get("RANK", "0").strip() not in ("", "0")


def echo(message: str) -> None:
    """A status line on stderr. A stderr that cannot be written (closed pipe, full disk) loses
    the line, not the run: a training must not die, unsaved, because `2>&1 | head` went away."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr, flush=True)


#: What a refused sampling option is told, by ``sample`` key (else the schema's own words).
_SAMPLE_FLAG_HINTS = {
    "top_p": "must be in (0, 1]; e.g. --top-p 0.9",
    "temperature": "must be a finite number >= 0 (0: greedy); e.g. --temperature 0.8",
}


def sample_flags(given: dict) -> dict:
    """``generate``'s sampling options, checked by the ``sample`` schema; an error names the refused
    one's flag."""
    from pydantic import ValidationError

    from ..config.schema import SampleConfig

    try:
        SampleConfig.model_validate(given)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0])
        hint = _SAMPLE_FLAG_HINTS.get(key, err["msg"][:1].lower() + err["msg"][1:])
        raise MinigptError(f"--{key.replace('_', '-')} {given.get(key)}: {hint}") from None
    return given


#: What a signal that comes once the command is done says: nothing was cut short; ``{done}``: what
#: is done.
LATE_SIGNAL = "stopped by {name} as minigpt was exiting: {done}"
#: :data:`LATE_SIGNAL`'s ``{done}``, unless the command says more (:func:`say_when_stopped_late`).
_DONE = ["the command had finished and its output is complete"]


def say_when_stopped_late(done: str) -> None:
    """What :func:`run_and_exit` says is done when a signal comes as the process ends (``train``:
    the run folder and its last checkpoint)."""
    _DONE[0] = done


def _status(code: Any) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter gives it (a message: printed,
    status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_and_exit(app: Callable[[], Any]) -> NoReturn:
    """Run the CLI, then end the process at once (:func:`os._exit`) with the command's exit status,
    skipping the interpreter's teardown (2 s with torch, in which a Ctrl-C killed it silently); a
    signal now gets :data:`LATE_SIGNAL` and 128 + its number. While a non-daemon thread runs, the
    normal exit waits for it."""
    late: list[int] = []
    signals = [
        s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None
    ]

    def note(signum, frame):
        late.append(signum)

    try:
        try:
            app()
            code: Any = 0
        except SystemExit as exc:
            code = exc.code
        for sig in signals:
            signal.signal(sig, note)
    except (
        KeyboardInterrupt
    ):  # past the command's own handling (which answers a Ctrl-C): its work was done
        code = 0
        late.append(signal.SIGINT)
        for sig in signals:
            signal.signal(sig, note)
    status = _status(code)
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        sys.exit(status)
    atexit._run_exitfuncs()
    _flush()
    if hasattr(
        signal, "pthread_sigmask"
    ):  # a call: a signal noted so far is handled first; later ones wait
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    if late:
        print(LATE_SIGNAL.format(name=signal.Signals(late[0]).name, done=_DONE[0]), file=sys.stderr)
        status = 128 + int(late[0])
        _flush()
    os._exit(status)


def _flush() -> None:
    for stream in (
        s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None
    ):
        with contextlib.suppress(
            OSError, ValueError
        ):  # a stream that cannot be flushed has nothing to lose
            stream.flush()


# ----------------------------------------------------------------------------- --stop's escapes

#: :func:`unescape`'s refusals.
#: printf's escapes of one character (bash's printf builtin; its ``\\c``, which ends printf's output, is not one).
_ESCAPES = {
    "\\": "\\",
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    '"': '"',
    "'": "'",
}
#: One escape: octal (1 to 3 digits) and ``\\x`` (1 or 2 hex digits) give a byte, ``\\u`` (1 to 4) and ``\\U``
#: (1 to 8) a code point, a backslash and any other character that character's escape, if it has one.
_ESCAPE = re.compile(
    r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{1,4})|U([0-9A-Fa-f]{1,8})|(.))", re.DOTALL
)


def unescape(text: str, what: str = "--stop") -> str:
    """``text`` with printf's escapes (:data:`_ESCAPE`) turned into what they name, as bash's
    ``printf`` does.

    Raises:
        MinigptError: bytes that are not UTF-8, an octal escape past ``\\377``, a code point that is
        not a character.
    """
    out: list[str] = []
    pending = bytearray()  # bytes of octal and \x escapes, read as UTF-8 together

    def flush() -> None:
        if pending:
            decoded = pending.decode(
                "utf-8", "replace"
            )  # not UTF-8: a U+FFFD that does not encode back to them
            if decoded.encode() != pending:
                raise MinigptError(
                    f"{what} '{text}': its escapes give the bytes {pending.hex(' ')}, which are not "
                    "UTF-8 text; write a character as \\uHHHH (é: \\u00e9) or as all of its UTF-8 "
                    "bytes (\\xc3\\xa9)"
                )
            out.append(decoded)
            pending.clear()

    pos = 0
    for m in _ESCAPE.finditer(text):
        octal, byte, short, long, other = m.groups()
        if m.start() > pos:
            flush()
            out.append(text[pos : m.start()])
        pos = m.end()
        if octal is not None or byte is not None:
            value = int(octal, 8) if octal is not None else int(byte, 16)
            if value > 0xFF:
                raise MinigptError(
                    f"{what} '{text}': {m[0]} is beyond a byte (at most \\377); write a character "
                    "as \\uHHHH"
                )
            pending.append(value)
            continue
        flush()
        if other is not None:
            out.append(_ESCAPES.get(other, m[0]))
            continue
        code = int(short or long, 16)
        if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
            raise MinigptError(
                f"{what} '{text}': {m[0]} is not a character (U+D800..U+DFFF and values past "
                "U+10FFFF are not); e.g. \\u00e9 is é"
            )
        out.append(chr(code))
    flush()
    out.append(text[pos:])
    return "".join(out)


#: The ``minigpt`` command; each module of this package adds its commands to it.
#: The Typer settings of ``minigpt`` and its sub-apps. Plain click help: no boxes or type labels, and as wide
#: as the terminal (up to 120 columns).
TYPER_SETTINGS = dict(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)
app = typer.Typer(
    name="minigpt",
    cls=Group,
    help="Train, sample and measure small GPT models (decoder-only Transformers).",
    **TYPER_SETTINGS,
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"minigpt {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print minigpt's version and exit.",
    ),
) -> None:
    """Train, sample and measure small GPT models (decoder-only Transformers)."""
