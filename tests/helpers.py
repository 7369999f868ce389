"""Small helpers shared by the tests."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


class CliResult:
    def __init__(self, exit_code: int, stdout: str, stderr: str):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def __repr__(self) -> str:
        return f"CliResult(exit_code={self.exit_code}, stdout={self.stdout[-800:]!r}, stderr={self.stderr[-800:]!r})"


def assert_user_error(res: CliResult, *fragments: str, notes_ok: bool = False) -> None:
    """Exit 2, one line on stderr starting 'error:', no traceback, each fragment in it.

    With ``notes_ok``, status lines printed before the error (such as
    "downloading it first") are allowed; the error is still one line, the last.
    """
    assert res.exit_code == 2, res
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    if notes_ok:
        assert sum(l.startswith("error:") for l in lines) == 1, res
        lines = lines[-1:]
    assert len(lines) == 1, res
    assert lines[0].startswith("error: "), res
    assert "Traceback" not in res.stderr + res.stdout
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])


@contextmanager
def working_dir(path: Path):
    """Run the body with ``path`` as the current directory (module-scoped fixtures cannot use monkeypatch.chdir)."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield path
    finally:
        os.chdir(old)
