"""The one exception type for mistakes a user can make, as a structured value rendered once at the
edge.

A :class:`MinigptError` is built where the problem is found: ``what`` went wrong, the ``fix`` when
there is one, and the config ``key`` (or the ``path``) it concerns. The CLI renders it once, as one
line on stderr with exit status 2 (:mod:`minigpt_cli.cli.base`); anything else is a bug and keeps
its traceback. A caller that knows more (the command line that continues a run, the flag that set a
key) adds it with :meth:`MinigptError.with_fix` or :meth:`MinigptError.spelled`, never by editing
the text.
"""

from __future__ import annotations

from typing import Mapping, Optional


class MinigptError(Exception):
    """A problem the user can fix: bad config, missing file, network failure.

    Args:
        what: the problem, one line; ``{key}`` in it stands for the key as the user spelled it.
        fix: what to do about it, one line, or None.
        key: the config key concerned (``data.path``), when there is one.
        path: the file or folder concerned, when there is one.

    ``str(error)`` is the one line: ``what`` then ``; fix``. The CLI exits with ``exit_code``.
    """

    exit_code = 2

    def __init__(
        self, what: str, fix: Optional[str] = None, *, key: Optional[str] = None, path=None
    ):
        super().__init__(what)
        self.what, self.fix, self.key, self.path = what, fix, key, path
        self._spelling: Mapping[str, str] = {}

    def __str__(self) -> str:
        key = self._spelling.get(self.key, self.key) if self.key else None
        what = self.what.replace("{key}", key) if key else self.what
        return f"{what}; {self.fix}" if self.fix else what

    def with_fix(self, fix: str) -> "MinigptError":
        """This error with ``fix`` added after its own (the caller knows a next step)."""
        self.fix = f"{self.fix}; {fix}" if self.fix else fix
        return self

    def spelled(self, spelling: Mapping[str, str]) -> "MinigptError":
        """This error with its key written as the command spells it (``{"data.path":
        "--input"}``)."""
        self._spelling = dict(spelling)
        return self


class ConfigError(MinigptError):
    """The config (YAML, ``--set`` override or preset) is invalid."""


class Interrupted(MinigptError):
    """Training stopped by a signal; exit status 128 + the signal's number.

    SIGINT (Ctrl-C) gives 130 and SIGTERM 143, as a shell reports a process
    killed by that signal. The message says what was saved; ``resume_dir``,
    when set, is the run folder a ``--resume`` would continue (the CLI adds
    the command that does it).
    """

    exit_code = 130

    def __init__(self, message: str, signum: int = 2, resume_dir=None):
        super().__init__(message)
        self.exit_code = 128 + int(signum)
        self.resume_dir = resume_dir
