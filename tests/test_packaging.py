"""What the CLI reads at run time ships inside the package (a wheel install works, not only a
checkout)."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import minigpt_cli
from minigpt_cli import paths

REPO = Path(__file__).resolve().parent.parent
PACKAGE = Path(minigpt_cli.__file__).resolve().parent
SHIPPED = PACKAGE / "config"  # the package data: presets, example configs, the dataset registry
PRESETS = [
    "gpt2-large",
    "gpt2-medium",
    "gpt2-small",
    "gpt2-xl",
    "llama2-13b",
    "llama2-7b",
    "llama3-8b",
    "shakespeare-char",
]


def test_presets_are_package_data():
    """One copy of each preset, inside the package, found with importlib.resources."""
    assert Path(str(paths.presets_dir())).resolve() == SHIPPED / "presets"
    assert paths.list_presets() == PRESETS
    assert paths.preset_path("gpt2-small") == SHIPPED / "presets" / "gpt2-small.yaml"
    assert not (REPO / "configs" / "presets").exists()


def test_pyproject_ships_every_preset():
    """Every file under minigpt_cli/config/presets/ matches a package-data pattern, so the wheel
    holds it."""
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = data["tool"]["setuptools"]["package-data"]["minigpt_cli.config"]
    files = sorted(
        p.relative_to(SHIPPED).as_posix() for p in (SHIPPED / "presets").iterdir() if p.is_file()
    )
    assert files == [f"presets/{n}.yaml" for n in PRESETS]
    files += sorted(
        p.relative_to(SHIPPED).as_posix() for p in (SHIPPED / "configs").iterdir() if p.is_file()
    )
    assert "configs/shakespeare-cpu.yaml" in files
    for f in files:
        assert any(fnmatch.fnmatch(f, pat) for pat in patterns), (f, patterns)


def test_shipped_configs_from_a_folder_without_them(cli, tmp_path, monkeypatch):
    """The README's examples from an empty folder: the name alone, or configs/NAME.yaml with a
    note."""
    monkeypatch.chdir(tmp_path)
    assert (
        REPO / "configs"
    ).resolve() == SHIPPED / "configs"  # the repository's configs/ is the package's
    by_name = cli("train", "tiny", "--dry-run")
    assert by_name.exit_code == 0 and by_name.stdout.startswith("name: tiny"), by_name
    by_path = cli("train", "configs/shakespeare-cpu.yaml", "--dry-run")
    assert by_path.exit_code == 0 and by_path.stdout.startswith("name: shakespeare-cpu"), by_path
    assert (
        "note: configs/shakespeare-cpu.yaml is not in this folder; using the copy shipped"
        in by_path.stderr
    )
    missing = cli("train", "my.yaml")
    assert (
        missing.exit_code == 2
        and "shipped configs (pass the name alone): finetune-gpt2, shakespeare," in missing.stderr
    )
    assert not (tmp_path / "runs").exists()


def test_presets_from_a_folder_without_configs(cli, tmp_path, monkeypatch):
    """In-process, from an empty working directory: --list and --preset work."""
    monkeypatch.chdir(tmp_path)
    listed = cli("count-params", "--list")
    assert listed.exit_code == 0, listed
    assert listed.stdout.split() == PRESETS
    res = cli("count-params", "--preset", "gpt2-small")
    assert res.exit_code == 0, res
    assert res.stdout.startswith("gpt2-small: 124,439,808 parameters"), res


def test_presets_from_a_copy_of_the_package_alone(tmp_path):
    """The package copied away from the checkout (as a wheel installs it), run from an empty
    folder."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "minigpt_cli", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import minigpt_cli; print(minigpt_cli.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert Path(where.stdout.strip()).parent == site / "minigpt_cli", where
    out = subprocess.run(
        [sys.executable, "-m", "minigpt_cli", "count-params", "--preset", "gpt2-small"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "unknown preset" not in out.stderr
