"""The one exception type for mistakes a user can make.

The CLI turns a :class:`MinigptError` into a one-line message on stderr and exit
status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MinigptError(Exception):
    """A problem the user can fix: bad config, missing file, network failure.

    The message is a single line naming the problem and, where there is one,
    the fix. The CLI exits with ``exit_code``.
    """

    exit_code = 2


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
