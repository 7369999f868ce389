"""The tool's write paths (train, sweep, export, prepare, download, compare) never leave their
folder, and never delete or overwrite a file the user made there, whatever its name (issue 27,
section 1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import TINY, assert_user_error, tiny

from minigpt_cli.trainer import train

LEAVING = ["..", ".", "../x", "a/b", "/tmp/elsewhere"]


def _precious(*paths: Path) -> dict[Path, str]:
    """User files at ``paths``, each with its own content; returns them to check later."""
    files = {}
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"precious {p.name}")
        files[p] = p.read_text()
    return files


def _intact(files: dict[Path, str]) -> None:
    for p, text in files.items():
        assert p.is_file() and p.read_text() == text, p


def _sweep_file(folder: Path, data_dir: Path, **over) -> Path:
    spec = {
        "name": "s",
        "base": str(TINY),
        "set": [
            f"data.data_dir={data_dir}",
            "train.eval_interval=2",
            "train.eval_iters=1",
            "train.sample_tokens=0",
        ],
        "variants": {"v": {}},
        "seeds": [1],
        "budget": {"iters": 2},
        **over,
    }
    path = folder / "s.yaml"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", LEAVING)
def test_train_and_sweep_refuse_names_that_leave_their_folder(cli, data_dir, project, name):
    files = _precious(
        project / "summary.md", project / "v-s1" / "thesis.tex", project / "runs" / "notes.txt"
    )
    sets = ["--set", f"data.data_dir={data_dir}", "--dry-run"]
    assert_user_error(cli("train", TINY, "--run-name", name, *sets), "not a plain folder name")
    assert_user_error(
        cli("sweep", _sweep_file(project, data_dir, name=name)), "name:", "not a plain folder name"
    )
    assert_user_error(
        cli("sweep", _sweep_file(project, data_dir, variants={name: {}})),
        "variants:",
        "not a plain folder name",
    )
    # out_dir may be anywhere: the sweep still writes only inside <out_dir>/<name>/
    away = project / "away" / "newsub"
    assert_user_error(
        cli("sweep", _sweep_file(project, data_dir, out_dir=str(away), name=name)), "not a plain"
    )
    _intact(files)
    assert not (project / "sweep.json").exists() and not (project / "away").exists()


def test_sweep_and_train_leave_the_users_files_of_their_names_alone(cli, data_dir, project):
    files = _precious(
        project / "runs" / "s" / "summary.md", project / "runs" / "mine" / "config.yaml"
    )
    assert_user_error(cli("sweep", _sweep_file(project, data_dir)), "not a sweep's folder")
    sets = ["--set", f"data.data_dir={data_dir}", "--no-progress"]
    assert_user_error(
        cli("train", TINY, "--run-name", "mine", *sets),
        "holds files minigpt did not make",
        notes_ok=True,
    )
    # A sweep being resumed meets a run folder of the user's own where a run of it goes.
    (project / "runs" / "s" / "summary.md").unlink()
    files.pop(project / "runs" / "s" / "summary.md")
    assert cli("sweep", _sweep_file(project, data_dir)).exit_code == 0
    spec = _sweep_file(project, data_dir)
    state = json.loads((project / "runs" / "s" / "sweep.json").read_text())
    (project / "runs" / "s" / "sweep.json").write_text(json.dumps({**state, "done": []}))
    import shutil

    shutil.rmtree(project / "runs" / "s" / "v-s1")
    files.update(_precious(project / "runs" / "s" / "v-s1" / "thesis.tex"))
    assert_user_error(cli("sweep", spec), "v-s1", "holds files minigpt did not make", notes_ok=True)
    _intact(files)


def test_a_sweep_restart_empties_a_checkpointless_run_folder_behind_a_link(cli, data_dir, project):
    spec = _sweep_file(project, data_dir)
    assert cli("sweep", spec).exit_code == 0
    sweep = project / "runs" / "s"
    state = json.loads((sweep / "sweep.json").read_text())
    (sweep / "sweep.json").write_text(json.dumps({**state, "done": []}))
    real = project / "elsewhere" / "v-s1"
    real.parent.mkdir()
    (sweep / "v-s1").rename(real)
    import shutil

    shutil.rmtree(
        real / "checkpoints"
    )  # a run killed before its first save, in a folder behind a link
    (sweep / "v-s1").symlink_to(real)
    res = cli("sweep", spec)
    assert res.exit_code == 0, res
    assert (sweep / "v-s1").is_symlink() and (
        real / "checkpoints" / "last" / "model.safetensors"
    ).is_file()


@pytest.fixture
def run(data_dir, project):
    train(tiny(data_dir, "train.max_iters=2"), run_name="r", echo=lambda m: None, progress=False)
    return project / "runs" / "r"


def test_export_touches_only_its_own_folders(cli, run, project):
    files = _precious(
        project / ".exp.old" / "f",
        project / ".exp.mine" / "config.json",
        project / "forced" / "config.json" / "inner.txt",
        project / "forced2" / "model.safetensors" / "inner.txt",
    )
    assert cli("export", run, "--output", "exp").exit_code == 0
    for out in ("forced", "forced2"):
        assert_user_error(
            cli("export", run, "--output", out, "--force"),
            "does not write",
            "only an earlier export",
        )
    # A killed export's temporary folder (its own name, export files only) is swept by the next one.
    left = project / ".exp.minigpt-export-k1ll3d"
    left.mkdir()
    (left / "config.json").write_text("{}")
    assert cli("export", run, "--output", "exp", "--force").exit_code == 0
    assert not left.exists()
    assert sorted(p.name for p in project.iterdir() if p.name.startswith(".exp")) == [
        ".exp.mine",
        ".exp.old",
    ]
    _intact(files)


def test_compare_replaces_only_a_summary_it_wrote(cli, run, project):
    files = _precious(project / "mine" / "summary.md", project / "mine2" / "summary.json")
    for out in ("mine", "mine2"):
        assert_user_error(cli("compare", run, "--output", out), "not a summary minigpt wrote")
    assert cli("compare", run, "--output", "cmp").exit_code == 0
    assert cli("compare", run, "--output", "cmp").exit_code == 0  # its own summary is replaced
    _intact(files)


def test_prepare_and_download_keep_the_users_files(cli, data_dir, project, monkeypatch):
    import shutil

    data = project / "data" / "tinyshakespeare"
    data.mkdir(parents=True)
    shutil.copy(data_dir / "tinyshakespeare" / "input.txt", data / "input.txt")
    files = _precious(data / "notes.txt", data / "input.txt.mine.part", data / ".input.txt.mine")
    part = data / ".input.txt.abcd1234.part"  # a killed download's, long untouched
    part.write_bytes(b"partial")
    os.utime(part, (1, 1))
    assert (
        cli("download").exit_code == 0
    )  # the corpus is there: nothing fetched, the stale partial file swept
    assert not part.exists()
    assert cli("train", TINY, "--set", "train.max_iters=1", "--dry-run").exit_code == 0
    _intact(files)


def test_export_force_replaces_only_a_folder_it_marked_as_its_export(cli, run, project):
    """A folder of export-named files that minigpt did not write (a user's config.json alone, a
    Hugging Face model folder) is not an earlier export: --force refuses it and keeps every file."""
    files = _precious(
        project / "proj" / "config.json",
        *(project / "hf-model" / n for n in ("config.json", "model.safetensors", "tokenizer.json")),
    )
    for out in ("proj", "hf-model"):
        assert_user_error(
            cli("export", run, "--output", out, "--force"), "is not an export minigpt wrote"
        )
    _intact(files)
    assert cli("export", run, "--output", "mine").exit_code == 0
    assert (
        cli("export", run, "--output", "mine", "--force").exit_code == 0
    )  # its own earlier export: replaced


def test_export_refuses_a_tokenizer_that_is_not_the_runs(cli, run, project):
    """export checks the run's tokenizer.json as generate does: swapped ids would scramble the
    vocabulary."""
    path = run / "tokenizer.json"
    data = json.loads(path.read_text())
    data["chars"][10], data["chars"][11] = data["chars"][11], data["chars"][10]
    path.write_text(json.dumps(data))
    assert_user_error(
        cli("export", run, "--output", "out"),
        "is not the tokenizer this checkpoint was trained with",
    )
    assert not (project / "out").exists()


def test_compare_never_writes_into_a_run_folder(cli, run, project):
    before = sorted(p.name for p in run.iterdir())
    assert_user_error(cli("compare", run, "--output", run), "is a run folder")
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_non_ascii_run_name_is_refused_asking_for_ascii_letters(cli, data_dir, project):
    """é is a letter: the refusal of --run-name 'résumé' (and of a config name) says ASCII
    letters."""
    sets = ["--set", f"data.data_dir={data_dir}", "--dry-run"]
    res = cli("train", TINY, "--run-name", "résumé", *sets)
    assert_user_error(res, "'résumé' is not a plain folder name", "use ASCII letters, digits")
    res = cli("train", TINY, "--set", "name=résumé", *sets)
    assert_user_error(res, "'résumé' may only hold ASCII letters, digits")
