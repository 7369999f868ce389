"""The Python API: docs/api.md's block and the package docstring's example, run as written."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

import minigpt_cli
from minigpt_cli.errors import MinigptError

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def _python_block(text: str, after: str) -> str:
    """The first ```python block after the heading ``after``."""
    return re.search(r"```python\n(.*?)```", text[text.index(after) :], re.S).group(1)


@pytest.fixture
def workdir(tmp_path, corpus_file, monkeypatch):
    """An empty folder holding only data/tinyshakespeare/input.txt, as `minigpt download` leaves
    it."""
    (tmp_path / "data" / "tinyshakespeare").mkdir(parents=True)
    shutil.copy(corpus_file, tmp_path / "data" / "tinyshakespeare" / "input.txt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readmes_python_block_runs(workdir, capsys):
    code = _python_block(API_PAGE.read_text(encoding="utf-8"), "# Python API")
    assert "load_run(" in code and "train.max_iters=60" in code
    scope: dict = {}
    exec(
        compile(code.replace("train.max_iters=60", "train.max_iters=16"), "docs/api.md", "exec"),
        scope,
    )
    assert scope["result"].step == 16 and scope["texts"][0].startswith("ROMEO:")
    run = scope["run"]
    assert not run.model.training and run.config.name == "tiny"
    assert run.checkpoint.parent.parent == scope["result"].run_dir and run.step == 16
    assert scope["logits"].shape == (1, len("ROMEO:"), run.config.model.vocab_size)
    assert run.tokenizer.decode(run.tokenizer.encode("ROMEO:")) == "ROMEO:"
    assert (workdir / "api-hf" / "config.json").is_file()
    last = minigpt_cli.load_run(scope["result"].run_dir, checkpoint="last")
    assert last.checkpoint.name == "last" and last.describe() == "checkpoint last, step 16"
    with pytest.raises(MinigptError, match="not found"):
        minigpt_cli.load_run(workdir / "no-such-run")


def test_the_package_docstrings_example_runs(workdir):
    body = minigpt_cli.__doc__.split("::\n", 1)[1]
    code = textwrap.dedent(
        body[: body.index("\n\n", body.index("print("))]
    )  # the indented block after '::'
    assert "load_run(" in code and "generate(" in code
    scope: dict = {}
    exec(
        compile(
            code.replace("train.max_iters=50", "train.max_iters=8"),
            "minigpt_cli/__init__.py",
            "exec",
        ),
        scope,
    )
    assert scope["result"].step == 8 and scope["texts"][0].startswith("ROMEO:")
    assert scope["run"].tokenizer.vocab_size == scope["run"].config.model.vocab_size
    assert set(minigpt_cli.__all__) == set(minigpt_cli._API)
    for name in minigpt_cli.__all__:  # every exported name resolves
        assert callable(getattr(minigpt_cli, name))
