"""``minigpt speedrun``: real ``minigpt train`` processes at two seeds on a tiny test track, the
statistics recomputed with scipy from the per-seed numbers, the ledger's rows, and the refusals."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import TINY, assert_user_error, tiny, working_dir
from scipy import stats

from minigpt_cli.config.schema import load_config
from minigpt_cli.errors import MinigptError
from minigpt_cli.speedrun import ledger, tracks
from minigpt_cli.speedrun.baseline import parse_reference
from minigpt_cli.speedrun.runner import (
    PROGRESS,
    REPORT,
    SeedResult,
    format_report,
    physical_cores,
    summarize,
)

#: The test track: the tiny recipe (:func:`_recipe`) passes this val at its first eval at any seed,
#: and its stop val (about 2.7 after 60 steps) is far enough below it for p < 0.01 with 2 seeds
#: (one degree of freedom: 22 standard deviations).
TARGET = 4.0


def _recipe(data_dir: Path, **train) -> dict:
    """tiny.yaml as a speedrun recipe that learns fast (Muon, batch 16, 60 steps): evals every 20
    steps, none at step 0, no sample."""
    cfg = yaml.safe_load(TINY.read_text())
    cfg["name"] = "speedrun-tiny"
    cfg["data"] = {"data_dir": str(data_dir)}
    cfg["train"].update(
        {
            "optimizer": "muon",
            "batch_size": 16,
            "learning_rate": 1e-2,
            "max_iters": 60,
            "eval_interval": 20,
            "eval_at_start": False,
            "sample_tokens": 0,
            **train,
        }
    )
    return cfg


def _track(mp: pytest.MonkeyPatch, target: float = TARGET) -> None:
    """Make ``tiny-test`` the only track (its recipe is given with --recipe)."""
    track = tracks.Track("tiny-test", target, "tiny", 60, "a target the tiny config passes")
    mp.setattr(tracks, "load_tracks", lambda: {track.name: track})


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _repo(root: Path, recipe: dict) -> Path:
    """A git checkout holding the recipe, committed: a clean tree."""
    repo = root / "checkout"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "test@example.com")
    _git(repo, "config", "user.name", "test")
    (repo / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    _git(repo, "add", "recipe.yaml")
    _git(repo, "commit", "-q", "-m", "recipe")
    return repo


def _nanogpt(root: Path) -> Path:
    """A git snapshot shaped as nanoGPT's: its training script and the recipe's config committed."""
    repo = root / "nanoGPT"
    (repo / "config").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "test@example.com")
    _git(repo, "config", "user.name", "test")
    for name in ("train.py", "config/train_shakespeare_char.py"):
        (repo / name).write_text("# nanoGPT\n")
        _git(repo, "add", name)
    _git(repo, "commit", "-q", "-m", "nanoGPT")
    return repo


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, data_dir):
    """One speedrun of the test track at 2 seeds with --record and a baseline given by hand, in a
    clean checkout: (the CLI's result, the checkout, the output folder)."""
    from helpers import CliResult
    from typer.testing import CliRunner

    from minigpt_cli.cli import app

    root = tmp_path_factory.mktemp("speedrun")
    repo = _repo(root, _recipe(data_dir))
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp, working_dir(repo):
        _track(mp)
        args = ["speedrun", "--track", "tiny-test", "--recipe", "recipe.yaml", "--seeds", "2"]
        args += ["--threads", "1", "--record", "--baseline-seconds", "100", "--out", str(out)]
        res = CliRunner().invoke(app, args, catch_exceptions=False)
    return CliResult(res.exit_code, res.stdout, res.stderr), repo, out


def test_two_seeds_give_the_statistics_scipy_gives(recorded):
    res, repo, out = recorded
    assert res.exit_code == 0, res
    report = json.loads((out / REPORT).read_text())
    seeds = report["seeds"]
    assert [s["seed"] for s in seeds] == [1337, 1338]
    for s in seeds:
        run = Path(s["run"])
        assert run.parent == out and (run / "checkpoints").is_dir()
        assert s["torch_threads"] == 1  # --threads reached the training process
        assert s["stop_step"] == 60
        # The hit is the first eval at or below the target, read back from the run's own log.
        evals = [
            json.loads(line)
            for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"eval"' in line
        ]
        first = next(e for e in evals if e["val_loss"] <= TARGET)
        assert s["hit"] and s["hit_step"] == first["step"]
        assert s["time_to_target_s"] == first["elapsed_s"]
        # The stop val is the whole split's, not the last eval's sample of windows.
        assert s["stop_val"] != evals[-1]["val_loss"]
        assert abs(s["stop_val"] - evals[-1]["val_loss"]) < 0.2
    vals = [s["stop_val"] for s in seeds]
    assert vals[0] != vals[1]
    assert report["mean_val"] == pytest.approx(statistics.fmean(vals))
    p = stats.ttest_1samp(vals, TARGET, alternative="less").pvalue
    assert report["p"] == pytest.approx(p) and report["p"] < 0.01 and report["record_rule_met"]
    median = statistics.median(s["time_to_target_s"] for s in seeds)
    assert report["median_time_s"] == pytest.approx(median)
    assert report["ratio"] == pytest.approx(median / 100)
    assert report["threads"] == 1 and report["torch"] and report["cpu"]
    if Path("/proc/stat").exists():  # the other processes' cores, measured around each seed
        assert all(s["other_cores_busy"] >= 0 for s in seeds), seeds
    assert report["commit"] == _git(repo, "rev-parse", "--short=12", "HEAD").strip()
    # The terminal's report says the same.
    assert f"{report['mean_val']:.4f}" in res.stdout and f"{median:.1f} s" in res.stdout


def test_each_seeds_estimate_and_evals_are_shown_as_they_come(recorded):
    """Between a seed's start and result lines, its training's time estimate and every eval's
    losses (as its metrics.jsonl has them): a seed can train for most of an hour."""
    res, _, out = recorded
    lines = res.stderr.splitlines()
    for seed in (1337, 1338):
        start = lines.index(next(l for l in lines if l.startswith(f"seed {seed} (")))
        end = lines.index(next(l for l in lines if l.startswith(f"seed {seed}: ")))
        shown = lines[start + 1 : end]
        assert shown[0].startswith("  time to train: about "), shown
        evals = [
            json.loads(line)
            for line in (out / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
            if '"eval"' in line
        ]
        assert [l for l in shown if l.startswith("  step ") and "train loss" in l] == [
            f"  step {e['step']}: train loss {e['train_loss']:.4f}, val loss {e['val_loss']:.4f}"
            for e in evals
        ]


def test_a_seed_that_other_processes_slowed_is_named_in_a_warning(recorded):
    _, _, out = recorded
    report = json.loads((out / REPORT).read_text())
    report.update(threads=2, cpus=2)
    for s, others in zip(report["seeds"], (0.2, 1.5)):
        s["other_cores_busy"] = others
    assert format_report(report).splitlines()[-1] == (
        "warning: other processes kept up to 1.5 of 2 CPU cores busy during seed 1338: its time "
        "is not this machine's (run the speedrun on a quiet machine)"
    )
    report["seeds"][1]["other_cores_busy"] = 0.25  # a quiet machine's few hundredths, and a margin
    assert "warning" not in format_report(report)


def test_a_seeds_status_lines_and_measured_estimate_are_passed_on(data_dir, tmp_path, monkeypatch):
    """The lines a training writes without a progress bar (here, every one the clocks allow) that
    a speedrun passes on: the estimate its first steps measure, each status line and each eval;
    not the rest."""
    from minigpt_cli.trainer import estimate, loop, train

    monkeypatch.setattr(loop, "STATUS_EVERY_S", 0.0)
    monkeypatch.setattr(estimate, "SAY_FROM_S", 0.0)
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    train(tiny(data_dir, "train.max_iters=8", "train.eval_interval=8"), echo=said.append)
    passed = [line for line in said if PROGRESS.match(line)]
    assert [line for line in passed if line.startswith("note: about ")], said
    assert [line for line in passed if line.startswith("step 8/8: loss ")], said
    assert [line for line in passed if line.startswith("step 8: train loss ")], said
    assert not [line for line in said if line.startswith("training ") and PROGRESS.match(line)]


def test_the_record_is_a_ledger_row_with_its_recipe_kept(recorded):
    res, repo, out = recorded
    report = json.loads((out / REPORT).read_text())
    kept = repo / "speedrun" / "recipes" / "tiny-test-001.yaml"
    assert kept.read_text() == (repo / "recipe.yaml").read_text()
    text = (repo / "speedrun" / "records.md").read_text()
    assert "## tiny-test: val <= 4.0" in text
    row = [line for line in text.splitlines() if line.startswith("| 1 |")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split(" | ")]
    header = [line for line in text.splitlines() if line.startswith("| # |")][0]
    fields = dict(zip([c.strip() for c in header.strip("|").split(" | ")], cells))
    assert fields["commit"] == report["commit"]
    assert fields["recipe"] == "recipes/tiny-test-001.yaml"
    assert fields["change from the previous record"] == "first record"
    assert fields["CPU"] == report["cpu"] and fields["threads"] == "1"
    assert fields["seeds"] == "2 (2 hit)"
    assert fields["median time to target"] == f"{report['median_time_s']:.1f} s"
    assert fields["mean val"] == f"{report['mean_val']:.4f}"
    assert float(fields["p"]) == pytest.approx(report["p"], rel=0.05)
    assert fields["ratio to baseline"].startswith(f"{report['ratio']:.3f}x of 100.0 s (by hand)")
    assert "record 1 of track tiny-test written" in res.stderr


def test_a_miss_stays_in_the_statistics(recorded):
    _, _, out = recorded
    report = json.loads((out / REPORT).read_text())
    results = [SeedResult(**{k: v for k, v in s.items() if k != "hit"}) for s in report["seeds"]]
    # A target between the two seeds' stop vals: the seed above it misses, and stays in.
    lo, hi = sorted(r.stop_val for r in results)
    target = (lo + hi) / 2
    worse = max(results, key=lambda r: r.stop_val)
    worse.time_to_target_s = worse.hit_step = None
    summary = summarize(results, target)
    vals = [r.stop_val for r in results]
    assert summary["hits"] == 1
    assert summary["mean_val"] == pytest.approx(statistics.fmean(vals))
    assert summary["p"] == pytest.approx(stats.ttest_1samp(vals, target, alternative="less").pvalue)
    assert summary["median_time_s"] is None  # half missed: the median time is never
    assert not summary["record_rule_met"]
    # With a third seed that hit, the median is the slower of the two hits.
    third = SeedResult(9, "x", 1.0, 20, 60, lo, 1)
    summary = summarize([*results, third], target)
    hits = sorted(r.time_to_target_s for r in [*results, third] if r.hit)
    assert summary["median_time_s"] == hits[-1] and not math.isinf(hits[-1])


def test_a_recipe_that_misses_is_refused_after_its_report_which_names_set_and_the_cpus_dtype(
    tmp_path, data_dir, cli, monkeypatch
):
    """A bfloat16 recipe run with --set KEY=VALUE on a CPU without bfloat16 units (run in float32,
    and said), whose one seed misses its target:

    - the seed's line, with its val, comes before the one-line refusal; the miss is a result, so
      the report is written and shown all the same;
    - the recipe with both changes is written beside the runs, and is what the seed trained and
      what the report names; the given file is left as it was;
    - a note the recipe as run earns (here train.ema_start without an EMA) is said once on the
      speedrun's console, not only in the seed's log."""
    from minigpt_cli.runtime import device

    monkeypatch.setattr(device, "cpu_multiplies_bfloat16", lambda: False)
    _track(monkeypatch, target=0.5)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(data_dir) | {"dtype": "bfloat16"}))
    out = tmp_path / "out"
    res = cli("speedrun", "--track", "tiny-test", "--recipe", recipe, "--seeds", "1",
              "--threads", "1", "--set", "train.max_iters=10", "--set", "train.ema_start=5",
              "--out", out)  # fmt: skip
    assert_user_error(
        res, "never reached", "0.5", "its one seed missed", "train.max_iters", notes_ok=True
    )
    assert "seed 1337: missed 0.5; stop val" in res.stderr
    assert "the seeds run with --set dtype=float32" in res.stderr
    assert res.stderr.count("note: train.ema_start has no effect") == 1, res.stderr
    report = json.loads((out / REPORT).read_text())
    assert report["hits"] == 0 and report["median_time_s"] is None and not report["seeds"][0]["hit"]
    assert "miss" in res.stdout and f"{report['seeds'][0]['stop_val']:.4f}" in res.stderr
    assert report["recipe"] == str(out / "recipe.yaml")
    assert report["set"] == ["train.max_iters=10", "train.ema_start=5", "dtype=float32"]
    assert "--set train.ema_start=5 --set dtype=float32)" in res.stdout.splitlines()[0]
    ran = load_config(out / "recipe.yaml")
    assert (ran.train.max_iters, ran.dtype) == (10, "float32")
    given = load_config(recipe)
    assert (given.train.max_iters, given.dtype) == (60, "bfloat16")
    assert report["seeds"][0]["stop_step"] == 10


def test_ctrl_c_after_a_seed_writes_the_finished_seeds_report_and_exits_130(tmp_path, data_dir):
    """A terminal's Ctrl-C (SIGINT to the process group) once the second of 3 seeds has started: the
    command exits 130 in one line, and speedrun.json holds the first seed, marked interrupted (a seed
    of the nanogpt-gpu track takes most of an hour: its result is not lost). A real process, on a
    shipped track: the tiny recipe misses it, which stops nothing before the end."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(data_dir, max_iters=20, eval_interval=20)))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "minigpt_cli", "speedrun", "--track", "nanogpt-cpu", "--recipe",
           str(recipe), "--seeds", "3", "--threads", "1", "--out", str(out)]  # fmt: skip
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        said = []
        for line in proc.stderr:  # until the second seed starts (its line comes just before)
            said.append(line)
            if line.startswith("seed 1338 (2 of 3)"):
                break
        assert said and said[-1].startswith("seed 1338"), "".join(said)
        os.killpg(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=300)
    said += rest.splitlines(keepends=True)
    assert proc.returncode == 130, "".join(said)
    assert said[-1].startswith("stopped by Ctrl-C") and "Traceback" not in "".join(said), said
    report = json.loads((out / REPORT).read_text())
    assert report["interrupted"] == "after 1 of 3 seeds"
    assert [s["seed"] for s in report["seeds"]] == [1337] and report["seeds"][0]["stop_step"] == 20
    assert f"the finished seeds' report (1 of 3) is in {out / REPORT}" in "".join(said)


def test_record_refuses_a_dirty_tree_before_training(tmp_path, data_dir, cli, monkeypatch):
    _track(monkeypatch)
    repo = _repo(tmp_path, _recipe(data_dir))
    (repo / "notes.txt").write_text("not committed\n")
    monkeypatch.chdir(repo)
    out = tmp_path / "out"
    res = cli("speedrun", "--track", "tiny-test", "--recipe", "recipe.yaml", "--seeds", "2",
              "--record", "--out", out)  # fmt: skip
    assert_user_error(res, "clean git tree", "notes.txt", "commit")
    assert not out.exists() and not (repo / "speedrun").exists()


def test_record_needs_two_seeds_and_a_checkout(tmp_path, cli, monkeypatch):
    res = cli("speedrun", "--seeds", "1", "--record")
    assert_user_error(res, "--record needs at least 2 seeds", "--seeds 5")
    monkeypatch.chdir(tmp_path)  # not a git checkout
    res = cli("speedrun", "--seeds", "2", "--record", "--out", tmp_path / "out")
    assert_user_error(res, "not in one", "minigpt checkout")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, fragments",
    [
        # What a seed's `minigpt train` would refuse: checked once, before --out is made.
        (["--set", "model.vocab_size=10"], ["model.vocab_size (10)", "65 entries"]),
        (["--set", "train.batch_size=100000000"], ["needs about", "train.batch_size smaller"]),
        (["--set", "model.init_from=nowhere"], ["not a folder"]),
        # Seeds past the last one: refused before the first trains.
        (["--seeds", "2", "--set", "seed=4294967295"], ["up to 4294967296", "fewer seeds"]),
        (["--seeds", "1001"], ["--seeds 1001", "1000"]),
        (["--threads", "100000"], ["--threads 100000", "CPUs"]),
        (["--baseline-seconds", "inf"], ["--baseline-seconds inf", "measured wall time"]),
        (["--baseline-nanogpt", "nowhere"], ["--baseline-nanogpt nowhere: no such folder"]),
        (["--baseline-nanogpt", "."], ["--baseline-nanogpt .: not a git snapshot of nanoGPT"]),
    ],
    ids=[
        "vocab",
        "memory",
        "init_from",
        "seed-range",
        "seeds",
        "threads",
        "inf",
        "nanogpt",
        "not-nanogpt",
    ],  # fmt: skip
)
def test_what_a_seed_would_refuse_is_refused_before_the_out_folder(
    args, fragments, tmp_path, data_dir, cli, monkeypatch
):
    _track(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_recipe(data_dir)))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", "recipe.yaml", "--threads", "1",
              "--out", "out", *args)  # fmt: skip
    assert_user_error(res, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


def test_a_val_split_a_set_value_moves_is_blamed_on_the_set_value(
    tmp_path, data_dir, cli, monkeypatch
):
    _track(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_recipe(data_dir)))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", "recipe.yaml", "--out", "out",
              "--set", "data.val_fraction=0.2")  # fmt: skip
    assert_user_error(res, "recipe.yaml with --set data.val_fraction=0.2 holds out", "0.1")
    assert not (tmp_path / "out").exists()


def test_another_tracks_recipe_is_noted(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").write_text("")  # refused after the note: nothing trains
    res = cli("speedrun", "--recipe", "speedrun-nanogpt-gpu", "--out", "out")
    assert_user_error(res, "--out out is a file", notes_ok=True)
    assert "note: speedrun-nanogpt-gpu is track nanogpt-gpu's recipe (val <= 1.47)" in res.stderr
    assert "--track nanogpt-gpu for its own" in res.stderr


def test_out_at_a_file_is_named_a_file(tmp_path, data_dir, cli, monkeypatch):
    _track(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_recipe(data_dir)))
    (tmp_path / "taken").write_text("mine\n")
    res = cli("speedrun", "--track", "tiny-test", "--recipe", "recipe.yaml", "--out", "taken")
    assert_user_error(res, "--out taken is a file", "new or empty folder")
    assert (tmp_path / "taken").read_text() == "mine\n"


def test_a_failed_baseline_run_is_one_line_and_leaves_no_out_folder(
    tmp_path, data_dir, cli, monkeypatch
):
    _track(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_recipe(data_dir)))
    script = tmp_path / "reference.sh"
    script.write_text("echo 'fatal: no network' >&2\nexit 3\n")
    res = cli("speedrun", "--track", "tiny-test", "--recipe", "recipe.yaml", "--threads", "1",
              "--set", "seed=7", "--out", "out", "--baseline-nanogpt", _nanogpt(tmp_path),
              "--baseline-script", script)  # fmt: skip
    assert_user_error(
        res, "nanoGPT's reference run failed (exit status 3): fatal: no network", notes_ok=True
    )
    assert not (tmp_path / "out").exists()


def test_a_baseline_that_other_processes_slowed_is_refused_for_a_record(
    tmp_path, data_dir, cli, monkeypatch
):
    """Another process keeps a core busy all through the reference run (started apart from the
    script, so not its child): the ratio would be the busy machine's, so --record stops before any
    seed, with nothing written; without --record the report says so under the ratio."""
    _track(monkeypatch)
    repo = _repo(tmp_path, _recipe(data_dir))
    monkeypatch.chdir(repo)
    script = tmp_path / "reference.sh"
    busy = "import time\nt = time.time()\nwhile time.time() - t < 3: pass"
    script.write_text(
        f"( {sys.executable} -c '{busy}' & )\nsleep 2\n"  # orphaned at once: another process
        "echo 'step 2000: train loss 1.7600, val loss 1.8857'\necho 'wall_s 89.7'\n"
    )
    ledger_before = sorted(p.name for p in repo.rglob("*"))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", "recipe.yaml", "--record",
              "--threads", str(os.cpu_count()), "--out", tmp_path / "out",
              "--baseline-nanogpt", _nanogpt(tmp_path), "--baseline-script", script)  # fmt: skip
    assert_user_error(res, "--record: other processes kept", notes_ok=True)
    assert (
        "CPU cores busy during nanoGPT's baseline, so its 89.7 s is not this machine's"
        in res.stderr
    )
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in repo.rglob("*")) == ledger_before


def test_a_baseline_that_other_processes_slowed_is_named_under_the_ratio(recorded):
    _, _, out = recorded
    report = json.loads((out / REPORT).read_text())
    report.update(threads=2, cpus=2)
    report["baseline"] = {"label": "nanoGPT's CPU recipe", "seconds": 89.7, "other_cores_busy": 0.9}
    for s in report["seeds"]:  # quiet seeds (the fixture's may have shared the machine)
        s["other_cores_busy"] = 0.01
    assert format_report(report).splitlines()[-1] == (
        "warning: other processes kept 0.9 of 2 CPU cores busy during nanoGPT's baseline: its "
        "89.7 s is not this machine's time, and the ratio flatters the seeds (run the speedrun on "
        "a quiet machine)"
    )
    report["baseline"]["other_cores_busy"] = 0.2
    assert "warning" not in format_report(report)


def test_an_unknown_track_is_refused_with_the_tracks(cli):
    res = cli("speedrun", "--track", "nanogpt-tpu")
    assert_user_error(res, "--track nanogpt-tpu", "nanogpt-cpu (val <= 1.886)", "nanogpt-gpu")


def test_baseline_options_that_conflict_are_refused(tmp_path, cli):
    res = cli("speedrun", "--baseline-seconds", "90", "--baseline-nanogpt", tmp_path)
    assert_user_error(res, "--baseline-seconds and --baseline-nanogpt", "keep one")
    res = cli("speedrun", "--baseline-script", tmp_path / "x.sh")
    assert_user_error(res, "--baseline-script", "--baseline-nanogpt NANOGPT_GIT_DIR")
    nanogpt = _nanogpt(tmp_path)
    res = cli("speedrun", "--baseline-nanogpt", nanogpt, "--baseline-script", tmp_path / "x.sh")
    assert_user_error(res, f"--baseline-script {tmp_path / 'x.sh'}: no such file")
    # Where no checkout has the reference script: each folder looked in named once, and the way
    # on without it.
    from minigpt_cli.speedrun.baseline import find_script

    with pytest.raises(MinigptError) as caught:
        find_script(None, [tmp_path, tmp_path / ".", tmp_path / "a" / ".."])
    said = str(caught.value)
    assert said.count(str(tmp_path)) == 1 and "--baseline-seconds" in said, said


def test_a_recipe_that_is_not_the_tracks_task_is_refused(tmp_path, data_dir, cli, monkeypatch):
    _track(monkeypatch)
    other = tmp_path / "other.txt"
    other.write_text((data_dir / "tinyshakespeare" / "input.txt").read_text()[:-1])
    recipe = _recipe(data_dir)
    recipe["data"]["path"] = str(other)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", tmp_path / "recipe.yaml",
              "--out", tmp_path / "out")  # fmt: skip
    assert_user_error(res, "not Tiny Shakespeare", "data.path: null")
    assert not (tmp_path / "out").exists()
    # The named dataset, edited on disk.
    edited = tmp_path / "data" / "tinyshakespeare" / "input.txt"
    edited.parent.mkdir(parents=True)
    edited.write_text(other.read_text() + "!")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_recipe(tmp_path / "data")))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", tmp_path / "recipe.yaml")
    assert_user_error(res, f"{edited} is not Tiny Shakespeare", "remove it")
    recipe = _recipe(data_dir)
    recipe["tokenizer"] = {"kind": "bpe", "vocab_size": 300}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", tmp_path / "recipe.yaml")
    assert_user_error(res, "tokenizer.kind bpe", "tokenizer.kind: char")
    # The rule runs a fixed number of steps: a time limit or early stopping would vary it.
    recipe = _recipe(data_dir, max_seconds=60.0)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", tmp_path / "recipe.yaml")
    assert_user_error(res, "train.max_seconds (60.0)", "fixed train.max_iters (60)")


def test_an_unreachable_corpus_is_refused_not_replaced_by_the_fallback(tmp_path, cli, monkeypatch):
    """``train`` falls back to shakespeare-gutenberg where GitHub cannot be reached; a speedrun,
    scored on Tiny Shakespeare, refuses instead, before any baseline or training."""
    from minigpt_cli import paths
    from minigpt_cli.data.download import get_dataset

    _track(monkeypatch)
    registry = {name: dict(entry) for name, entry in paths.dataset_registry().items()}
    registry["tinyshakespeare"]["url"] = "http://127.0.0.1:9/input.txt"  # nothing listens there
    monkeypatch.setattr(paths, "dataset_registry", lambda: registry)
    monkeypatch.delenv(get_dataset("tinyshakespeare").url_env)
    data = tmp_path / "data"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_recipe(data)))
    res = cli("speedrun", "--track", "tiny-test", "--recipe", tmp_path / "recipe.yaml",
              "--out", tmp_path / "out")  # fmt: skip
    assert_user_error(
        res, "never on its fallback corpus", "cannot reach", "MINIGPT_TINYSHAKESPEARE_URL",
        str(data / "tinyshakespeare" / "input.txt"),
    )  # fmt: skip
    assert not (tmp_path / "out").exists() and not data.exists()


def test_the_shipped_tracks_name_recipes_that_run_their_budget():
    shipped = tracks.load_tracks()
    assert list(shipped) == ["nanogpt-cpu", "nanogpt-gpu"]
    assert shipped["nanogpt-cpu"].target == 1.886 and shipped["nanogpt-gpu"].target == 1.47
    for track in shipped.values():
        cfg = load_config(track.recipe)
        tracks.check_recipe(cfg, track.recipe)
        assert cfg.train.max_iters == track.budget_iters, track.name
        assert not cfg.train.eval_at_start and cfg.train.sample_tokens == 0


def test_the_recipe_diff_names_the_keys_that_changed(tmp_path):
    old = load_config("speedrun-nanogpt-cpu")
    steps = old.train.max_iters + 50
    new = load_config(
        "speedrun-nanogpt-cpu",
        [f"train.max_iters={steps}", "model.ffn=swiglu", "seed=7", "train.out_dir=elsewhere"],
    )
    assert ledger.recipe_diff(old, new) == [
        "model.ffn: relu -> swiglu",
        f"train.max_iters: {old.train.max_iters} -> {steps}",
    ]
    assert ledger.recipe_diff(old, old) == []


def test_rows_go_to_the_end_of_their_tracks_table():
    text = ledger.insert_rows("", "a", 1.5, ["| 1 | a1 |"])
    text = ledger.insert_rows(text, "b", 2.5, ["| 1 | b1 |"])
    text = ledger.insert_rows(text, "a", 1.5, ["| baseline | a0 |", "| 2 | a2 |"])
    lines = text.splitlines()
    assert lines[0] == "# Speedrun records"
    a, b = lines.index("## a: val <= 1.5"), lines.index("## b: val <= 2.5")
    assert [
        line
        for line in lines[a:b]
        if line.startswith("| ") and "#" not in line and "---" not in line
    ] == [
        "| 1 | a1 |",
        "| baseline | a0 |",
        "| 2 | a2 |",
    ]
    assert lines[-1] == "| 1 | b1 |"


def test_the_reference_scripts_output_is_parsed():
    # nanoGPT's train.py eval line and the script's last line, as they print them.
    text = (
        "step 0: train loss 4.1744, val loss 4.1722\n"
        "step 2000: train loss 1.7600, val loss 1.8857\n"
        "wall_s 89.7  median_ms_per_iter 42.1  (tokens per iter 768)\n"
    )
    assert parse_reference(text) == (89.7, 1.8857, 2000)


def test_physical_cores_counts_each_core_once():
    import os

    assert 1 <= physical_cores() <= len(os.sched_getaffinity(0))
