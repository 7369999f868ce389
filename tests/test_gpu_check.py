"""scripts/gpu-check.sh names only what exists: every minigpt command, option and ``--set`` key its
Python (scripts/gpu_check.py) passes, every ``minigpt_cli`` import and the keywords it calls them
with, and every module the shell script names. The check runs on a GPU a few times a year; CI runs
its CPU mode (``bash scripts/gpu-check.sh --cpu OUT``, .ci/run), and these tests fail at once where
a rename would break it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import subprocess
from pathlib import Path

import pytest
import typer

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"
SHELL = REPO / "scripts" / "gpu-check.sh"


@pytest.fixture(scope="module")
def tree() -> ast.Module:
    return ast.parse(SCRIPT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def check_module():
    """scripts/gpu_check.py as a module (it imports only the standard library at its top)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands() -> dict:
    """Each minigpt command's click command: the CLI as the user meets it."""
    from minigpt_cli.cli import app

    return typer.main.get_command(app).commands


def _calls(tree: ast.Module, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
    ]


def _words(call: ast.Call, skip: int) -> list[str]:
    """The string constants among a call's positional arguments after the first ``skip``."""
    return [
        a.value
        for a in call.args[skip:]
        if isinstance(a, ast.Constant) and isinstance(a.value, str)
    ]


def test_every_command_and_option_the_check_passes_exists(tree):
    """``minigpt(check, step, COMMAND, ...)`` and ``torchrun(check, step, nproc, COMMAND, ...)``:
    the command is minigpt's and each ``--option`` is one of its options."""
    commands = _commands()
    calls = [(c, 2) for c in _calls(tree, "minigpt")] + [(c, 3) for c in _calls(tree, "torchrun")]
    used = set()
    for call, skip in calls:
        if call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == "check":
            words = _words(call, skip)
            command = commands.get(words[0])
            assert command is not None, f"line {call.lineno}: minigpt has no command {words[0]!r}"
            options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            for word in words[1:]:
                if word.startswith("--"):
                    assert word in options, f"line {call.lineno}: minigpt {words[0]} has no {word}"
            used.add(words[0])
    assert used >= {"bench", "count-params", "train", "evaluate", "generate"}, used
    assert importlib.util.find_spec("torch.distributed.run") is not None  # torchrun's module


def test_every_set_key_exists_and_each_mode_loads(tree, check_module):
    """Each ``--set`` the check gives names a config key, and each mode's settings load on its
    config."""
    from minigpt_cli.config.keys import key_rows
    from minigpt_cli.config.schema import load_config

    keys = {row[0] for row in key_rows()}
    given = []
    for call in _calls(tree, "sets"):
        for a in call.args:
            if isinstance(a, ast.Constant):
                given.append(a.value)
            elif isinstance(a, ast.JoinedStr):  # f"train.max_seconds={...}": the key is literal
                given.append(a.values[0].value)
    for mode in check_module.MODES.values():
        for name in ("sets", "train_sets", "dist_sets"):
            given += mode[name]
        load_config(mode["config"], [*mode["sets"], *mode["train_sets"]])
        load_config(mode["config"], mode["dist_sets"])
    assert given
    for pair in given:
        key = pair.split("=", 1)[0]
        assert key in keys, f"--set {pair}: no config key {key!r}"


def test_every_minigpt_cli_import_and_keyword_exists(tree):
    """``from minigpt_cli... import NAME`` resolves, and each call of such a name passes keywords
    its signature takes."""
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minigpt_cli"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                imported[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("minigpt_cli"):
                    importlib.import_module(alias.name)
    assert {"generate", "load_run"} <= imported.keys(), imported
    for name, obj in imported.items():
        signature = inspect.signature(obj)
        for call in _calls(tree, name):
            signature.bind(*call.args, **{k.arg: k.value for k in call.keywords})


def test_the_sample_keys_the_check_gives_generate_exist(tree):
    """The ``sample`` mapping given to ``generate``: each key is one of ``SampleConfig``'s."""
    from minigpt_cli.config.schema import SampleConfig

    dicts = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Dict)
        and any(getattr(k, "value", None) == "num_samples" for k in n.keys)
    ]
    assert dicts
    for d in dicts:
        for k in d.keys:
            assert k.value in SampleConfig.model_fields, k.value


def test_the_shell_script_names_only_what_exists():
    """The modules the shell script imports, and the options it gives gpu_check.py, exist."""
    text = SHELL.read_text(encoding="utf-8")
    for module in set(re.findall(r"\bimport (minigpt_cli[\w.]*)", text)):
        importlib.import_module(module)
    (launch,) = [line for line in text.splitlines() if line.startswith("exec ")]
    assert "scripts/gpu_check.py" in launch
    script = SCRIPT.read_text(encoding="utf-8")
    for option in re.findall(r"(--[a-z-]+)", launch):
        assert f'"{option}"' in script, option  # an argparse option of gpu_check.py


def test_the_shell_script_refuses_an_unknown_option_in_one_line(tmp_path):
    """Before it installs or measures anything: exit 2, one line naming the fix; --help prints the
    header."""
    res = subprocess.run(
        ["bash", str(SHELL), "--gpu", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        res.returncode == 2 and res.stderr == "error: unknown option --gpu; use --cpu, or --help\n"
    )
    assert not (tmp_path / "out").exists()
    shown = subprocess.run(
        ["bash", str(SHELL), "--help"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and "bash scripts/gpu-check.sh --cpu OUT" in shown.stdout
    assert "set -euo" not in shown.stdout


@pytest.mark.parametrize("out", ["file", "file/below"])
def test_the_shell_script_refuses_an_out_it_cannot_make_a_folder_in_one_line(tmp_path, out):
    (tmp_path / "file").write_text("kept")
    res = subprocess.run(
        ["bash", str(SHELL), "--cpu", str(tmp_path / out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: ") and str(tmp_path / out) in res.stderr
    assert (tmp_path / "file").read_text() == "kept"
