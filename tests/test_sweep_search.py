"""``minigpt sweep`` from the command line and from anywhere, an Optuna search with pruning that
survives a SIGKILL, and workers sharing one study (issue 30)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from helpers import TINY, assert_user_error, working_dir
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from minigpt_cli.experiments.compare import format_summary
from minigpt_cli.experiments.search import PLOTS, STUDY_FILE
from minigpt_cli.experiments.sweep import SHIPPED, Overrides, load_sweep, run_sweep

#: A model that trains 20 steps in well under a second: what every run here is shrunk to.
SMALL = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=16",
    "model.block_size=16",
    "train.batch_size=4",
    "train.eval_interval=10",
    "train.eval_iters=2",
    "train.sample_tokens=0",
    "train.log_interval=5",
    "train.warmup_iters=0",
    "train.min_lr=1.0e-6",
]


def small(data_dir: Path) -> list[str]:
    return [f"data.data_dir={data_dir}", *SMALL]


def load(storage: Path, name: str = "s") -> optuna.Study:
    return optuna.load_study(
        study_name=name, storage=JournalStorage(JournalFileBackend(str(storage)))
    )


def test_a_shipped_experiment_runs_by_name_with_overrides_from_an_empty_folder(
    cli, tmp_path, data_dir
):
    """``sweep ffn`` is found in the package; --set/--seeds/--budget are what runs, and are
    recorded; started again with other overrides, the sweep is refused, naming the difference."""
    sets = [w for s in small(data_dir) for w in ("--set", s)]
    with working_dir(tmp_path):
        res = cli("sweep", "ffn", "--budget", "iters=10", "--seeds", "2", *sets, "--json")
        assert res.exit_code == 0, res
        got = json.loads(res.stdout)
        assert [(r["variant"], r["seeds"], r["steps"]) for r in got["rows"]] == [
            ("relu", 2, 10),
            ("gelu", 2, 10),
            ("swiglu", 2, 10),
        ]  # the file's 3 seeds and 400 iters overridden
        state = json.loads((tmp_path / "runs" / "ffn" / "sweep.json").read_text())
        assert state["overrides"] == {"set": small(data_dir), "seeds": 2, "budget": "iters=10"}
        assert state["sweep"]["seeds"] == 3 and state["sweep"]["budget"] == {
            "iters": 400,
            "tokens": None,
            "seconds": None,
        }  # the file as read
        assert_user_error(
            cli("sweep", "ffn", "--budget", "iters=10", "--seeds", "3", *sets),
            "--seeds/--budget/--scale-schedule changed since this sweep started",
            "seeds: 2 -> 3",
        )
        assert_user_error(
            cli("sweep", "ffn", "--budget", "iters=10", "--seeds", "2", *sets[:-2]),
            "changed since this sweep started",
            "set:",
        )
    assert sorted(p.name for p in (tmp_path / "runs" / "ffn").iterdir() if p.is_dir()) == [
        "gelu-s1337",
        "gelu-s1338",
        "relu-s1337",
        "relu-s1338",
        "swiglu-s1337",
        "swiglu-s1338",
    ]


def test_a_copied_sweep_file_finds_the_shipped_base(tmp_path):
    copy = tmp_path / "mine.yaml"
    shutil.copy(SHIPPED / "ffn.yaml", copy)  # base: base.yaml, which is not beside the copy
    sweep = load_sweep(copy)
    assert sweep.base == SHIPPED / "base.yaml" and len(sweep.runs) == 9
    (tmp_path / "base.yaml").write_text(
        (SHIPPED / "base.yaml").read_text().replace("n_embd: 64", "n_embd: 32")
    )
    assert {r.cfg.model.n_embd for r in load_sweep(copy).runs} == {
        32
    }  # one beside the file comes first
    with working_dir(tmp_path):
        assert (
            load_sweep("experiments/ffn.yaml").path == SHIPPED / "ffn.yaml"
        )  # the README's path, anywhere


def search_file(folder: Path, data_dir: Path, trials: int = 6, **search) -> Path:
    spec = {
        "name": "s",
        "base": str(TINY),
        "set": small(data_dir),
        "budget": {"iters": 20},
        "search": {
            "method": "tpe",
            "trials": trials,
            "prune": "asha",
            "seed": 0,
            # 1e-5 barely moves from the initial loss in 20 steps; 3e-3 learns: ASHA has a clear
            # loser
            "params": {
                "train.learning_rate": {"low": 1.0e-5, "high": 3.0e-2, "log": True},
                "model.ffn": ["gelu", "relu"],
            },
            **search,
        },
    }
    path = folder / "s.yaml"
    path.write_text(json.dumps(spec))
    return path


def _check_once(study: optuna.Study, folder: Path, trials: int) -> None:
    """Trials 0 .. trials-1 all ended, and the run folders are exactly theirs, each trained once:
    its evals' steps never repeat (a rerun from scratch, or a resume that went back, would log a
    step again)."""
    ours = [t for t in study.get_trials() if not t.user_attrs.get("surplus")]
    assert [t.number for t in ours] == list(range(trials))
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in ours), [
        t.state for t in ours
    ]
    runs = sorted(r for t in ours for r in t.user_attrs["runs"])
    assert sorted(p.name for p in folder.iterdir() if (p / "metrics.jsonl").is_file()) == runs
    for run in runs:
        steps = [
            json.loads(line)["step"]
            for line in (folder / run / "metrics.jsonl").read_text().splitlines()
            if '"eval"' in line
        ]
        assert steps == sorted(set(steps)), (run, steps)


def _sweep_process(path: Path, *args: str, env=None, cwd=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minigpt_cli", "sweep", str(path), "--no-progress", *args],
        cwd=cwd or path.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def test_a_tpe_search_with_asha_killed_by_sigkill_resumes_prunes_and_draws_its_plots(
    tmp_path, data_dir
):
    """SIGKILLed (checkpoint.py's test hook) while trial 1 writes its step-10 checkpoint: started
    again, trial 0 stays as it was, trial 1 resumes from its step-0 checkpoint, and the search ends
    at 6 trials, some pruned at the eval the pruner said so (their checkpoint saved), with the
    summary's rows and Optuna's plots."""
    path = search_file(tmp_path, data_dir)
    folder = tmp_path / "runs" / "s"
    # Trial 0 saves checkpoints/last at its 3 evals and at its end (saves 0-3); trial 1 at step 0
    # (4), step 10 (5).
    proc = _sweep_process(
        path, env=dict(os.environ, MINIGPT_TEST_KILL_DURING_SAVE="last:5:weights")
    )
    out = proc.communicate(timeout=900)[0]  # about 20 s quiet: the deadline only ends a hang
    assert proc.returncode == -signal.SIGKILL, out
    before = load(folder / STUDY_FILE).get_trials()
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.RUNNING]
    with working_dir(tmp_path):
        result = run_sweep(path)
    study = load(folder / STUDY_FILE)
    _check_once(study, folder, 6)
    trials = study.get_trials()
    assert (
        trials[0].user_attrs["owner"].endswith(f":{proc.pid}")
        and trials[0].value == before[0].value
    )
    assert (
        trials[1].user_attrs["owner"].endswith(f":{os.getpid()}")
        and trials[1].params == before[1].params
    )
    assert "resumed from step 0" in (folder / "trial-0001-s1337" / "train.log").read_text()

    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned, [(t.params, t.intermediate_values) for t in trials]
    for t in pruned:  # stopped at the eval the pruner said so, its checkpoint saved
        run = folder / f"trial-{t.number:04d}-s1337"
        evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert max(e["step"] for e in evals) == max(t.intermediate_values) < 20
        assert (run / "checkpoints" / "last").is_dir()
    rows = {r["variant"]: r for r in result["rows"]}
    assert {f"trial-{t.number:04d} (pruned)" for t in pruned} <= set(rows)
    best = min((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert result["search"]["best_trial"]["params"] == best.params
    assert rows[f"trial-{best.number:04d}"]["final_val"] == pytest.approx(best.value)
    assert set(result["search"]["importances"]) == {"train.learning_rate", "model.ffn"}
    # Pruned trials never set the time-to-target threshold: it is the worst completed trial's final
    # val.
    complete = [rows[f"trial-{t.number:04d}"] for t in trials if t.state == TrialState.COMPLETE]
    assert result["target"] == pytest.approx(max(r["final_val"] for r in complete), rel=1e-12)
    table = format_summary(result)
    for r in result[
        "rows"
    ]:  # searched values to 4 significant digits in the table, whole in the JSON
        lr = r["train.learning_rate"]
        assert f"| {lr:.4g} |" in table and (len(repr(lr)) <= 6 or repr(lr) not in table)
    for name in PLOTS:
        assert (folder / name).read_bytes()[:4] == b"\x89PNG" and (
            folder / name
        ).stat().st_size > 10_000


def test_two_workers_share_one_study_and_run_each_trial_once(tmp_path, data_dir):
    path = search_file(tmp_path, data_dir, trials=4, prune="median")
    storage = tmp_path / "shared" / "study.journal"
    storage.parent.mkdir()
    workers = [_sweep_process(path, "--storage", str(storage), "--worker") for _ in range(2)]
    outs = [w.communicate(timeout=900)[0] for w in workers]  # only ends a hang
    assert [w.returncode for w in workers] == [0, 0], outs
    study = load(storage)
    _check_once(study, tmp_path / "runs" / "s", 4)
    owners = {t.user_attrs["owner"] for t in study.get_trials() if not t.user_attrs.get("surplus")}
    assert owners == {f"{os.uname().nodename}:{w.pid}" for w in workers}, owners  # both worked


def test_grid_workers_sharing_only_the_storage_run_each_variant_and_seed_once(
    cli, tmp_path, data_dir
):
    """Two workers in folders of their own (two machines' checkouts) share nothing but an SQLite
    study: every (variant, seed) is one trial, trained by one worker in its own folder, and
    ``compare --storage`` lists them all, with the host and run folder that took each."""
    path = tmp_path / "g.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "g",
                "base": str(TINY),
                "set": small(data_dir),
                "budget": {"iters": 10},
                "grid": {"model.ffn": ["relu", "gelu"]},
                "seeds": 2,
            }
        )
    )
    url = f"sqlite:///{tmp_path / 'study.db'}"
    homes = [tmp_path / "a", tmp_path / "b"]
    workers = []
    for home in homes:
        home.mkdir()
        workers.append(_sweep_process(path, "--storage", url, "--worker", cwd=home))
    outs = [w.communicate(timeout=900)[0] for w in workers]  # only ends a hang
    assert [w.returncode for w in workers] == [0, 0], outs
    runs = {f"ffn-{f}-s{s}" for f in ("relu", "gelu") for s in (1337, 1338)}
    trained = [
        {p.name for p in (home / "runs" / "g").iterdir() if (p / "metrics.jsonl").is_file()}
        for home in homes
    ]
    assert trained[0] | trained[1] == runs and not trained[0] & trained[1], (
        trained
    )  # each run in one folder only
    study = optuna.load_study(study_name="g", storage=url)
    ours = [
        t
        for t in study.get_trials()
        if not (t.user_attrs.get("duplicate") or t.user_attrs.get("surplus"))
    ]
    assert sorted(t.user_attrs["run"] for t in ours) == sorted(
        runs
    )  # one trial per (variant, seed)
    assert all(t.state == TrialState.COMPLETE for t in ours)
    for t in ours:  # the value told is the final eval of the run in the folder the trial names
        folder = Path(t.user_attrs["folder"]) / t.user_attrs["run"]
        evals = [
            json.loads(line)
            for line in (folder / "metrics.jsonl").read_text().splitlines()
            if '"eval"' in line
        ]
        assert t.value == evals[-1]["val_loss"] and t.params == {
            "variant": t.user_attrs["variant"],
            "seed": t.user_attrs["seed"],
        }

    res = cli("compare", "--storage", url, "--output", tmp_path / "all", "--json")
    assert res.exit_code == 0, res
    rows = json.loads(res.stdout)["trials"]
    assert sorted((r["variant"], r["seed"], r["state"]) for r in rows) == sorted(
        (t.user_attrs["variant"], t.user_attrs["seed"], "complete") for t in ours
    )
    assert {r["folder"] for r in rows} == {
        str((h / "runs" / "g" / n).resolve()) for h, ns in zip(homes, trained) for n in ns
    }
    assert {r["host"] for r in rows} == {os.uname().nodename}
    md = (tmp_path / "all" / "summary.md").read_text()
    assert "study g: 4 trials (4 complete)" in md and all(r["folder"] in md for r in rows)
    assert len((tmp_path / "all" / "summary.csv").read_text().splitlines()) == 5
    table = cli("compare", "--storage", url, "--study", "g")
    assert (
        table.exit_code == 0
        and "| variant or params |" in table.stdout
        and "ffn-relu" in table.stdout
    )


def test_a_run_enqueued_twice_is_taken_once_and_a_dead_workers_run_is_resumed_here(tmp_path):
    """Two workers starting at once may both enqueue the grid: each run is still handed out once,
    the copies failed unrun; a run a killed worker of this machine left running is taken over by the
    next worker here."""
    from minigpt_cli.experiments.search import enqueue_runs, next_run

    study = optuna.create_study(study_name="g", storage=f"sqlite:///{tmp_path / 'study.db'}")
    grid = [(f"v{i}-s1", f"v{i}", 1) for i in range(3)]
    for t in grid:  # what the other worker enqueued before this one looked
        study.enqueue_trial({"variant": t[1], "seed": 1}, user_attrs={"run": t[0]})
    enqueue_runs(study, grid)  # sees them: enqueues nothing more
    assert len(study.get_trials()) == 3
    for t in grid:
        study.enqueue_trial(
            {"variant": t[1], "seed": 1}, user_attrs={"run": t[0]}
        )  # both looked first
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    first = next_run(study, tmp_path)
    first.set_user_attr(
        "owner", f"{os.uname().nodename}:{dead.pid}"
    )  # its worker was killed mid-run
    taken = [first.user_attrs["run"]]
    while (trial := next_run(study, tmp_path)) is not None:
        taken.append(trial.user_attrs["run"])
        if trial.number != first.number:
            study.tell(trial, 1.0)
    assert taken == [
        "v0-s1",
        "v0-s1",
        "v1-s1",
        "v2-s1",
    ]  # v0 resumed from the dead worker, then each once
    assert [t.user_attrs.get("duplicate", False) for t in study.get_trials()] == [False] * 3 + [
        True
    ] * 3
    assert study.get_trials()[0].user_attrs["owner"].endswith(f":{os.getpid()}")


def test_compare_on_a_storage_names_what_is_wrong(cli, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    for name in ("b", "a"):
        optuna.create_study(study_name=name, storage=url)
    assert_user_error(
        cli("compare", "--storage", url, "--study", "c"), "no study 'c' in it", "one of: a, b"
    )
    assert_user_error(cli("compare", "--storage", url), "holds 2 studies", "one of: a, b")
    for missing, file in ((tmp_path / "no.journal",) * 2, (f"sqlite:///{tmp_path}/no.db", "no.db")):
        assert_user_error(
            cli("compare", "--storage", missing),
            f"--storage study {str(tmp_path / file)!r} not found",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "study.db"
    ]  # nothing made of a storage not there
    assert_user_error(cli("compare", tmp_path, "--storage", url), "not both")
    assert_user_error(cli("compare"), "give run folders")


@pytest.mark.parametrize(
    "search,fragment",
    [
        (
            {"params": {"train.learning_rate": {"low": 1.0e-2, "high": 1.0e-4}}},
            "empty range (low 0.01 > high 0.0001)",
        ),
        (
            {"params": {"train.learning_rate": {"low": 0.0, "high": 1.0e-2, "log": True}}},
            "log: true needs low > 0",
        ),
        ({"method": "bayes"}, "search.method: input should be 'tpe' or 'random'"),
        ({"prune": "hyperband"}, "search.prune: input should be 'none', 'median' or 'asha'"),
        ({"params": {"model.ffnn": ["relu"]}}, "model.ffnn"),
    ],
)
def test_a_bad_search_is_one_line_before_any_run(cli, tmp_path, data_dir, search, fragment):
    with working_dir(tmp_path):
        assert_user_error(cli("sweep", search_file(tmp_path, data_dir, **search)), fragment)
    assert not (tmp_path / "runs").exists()


def test_bad_command_lines_are_one_line(cli, tmp_path, data_dir):
    path = search_file(tmp_path, data_dir)
    spec = json.loads(path.read_text())
    grid = tmp_path / "grid.yaml"
    grid.write_text(json.dumps({**spec, "grid": {"model.ffn": ["relu", "gelu"]}}))
    with working_dir(tmp_path):
        assert_user_error(cli("sweep", grid), "search.params and grid both set model.ffn")
        assert_user_error(
            cli("sweep", path, "--worker"), "--worker joins a study in shared storage", "--storage"
        )
        assert_user_error(
            cli("sweep", path, "--storage", tmp_path / "no" / "such" / "s.journal", "--worker"),
            f"--storage {tmp_path}/no/such/s.journal: cannot open it",
        )
        assert_user_error(
            cli("sweep", path, "--storage", "nosuchdialect://x", "--worker"),
            "--storage nosuchdialect://x: cannot open it",
        )
        assert_user_error(
            cli("sweep", path, "--budget", "steps=5"), "--budget steps=5: give iters=N"
        )
        assert_user_error(cli("sweep", "nosuchexperiment"), "nor a shipped experiment", "ffn")
    assert not (tmp_path / "runs").exists()
    assert (
        load_sweep(path, overrides=Overrides(seeds=2, budget="iters=7"))
        .runs_of("x", {})[1]
        .cfg.train.max_iters
        == 7
    )


def test_the_shipped_experiments_are_package_data_and_the_checkout_links_to_them():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    repo = Path(__file__).resolve().parent.parent
    patterns = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    assert patterns["minigpt_cli.experiments"] == ["shipped/*.yaml"]
    shipped = sorted(p.name for p in Path(str(SHIPPED)).iterdir())
    assert "ffn.yaml" in shipped and all(name.endswith(".yaml") for name in shipped)
    assert sorted(p.name for p in (repo / "experiments").glob("*.yaml")) == shipped
    assert all(
        (repo / "experiments" / name).resolve() == Path(str(SHIPPED)) / name for name in shipped
    )


def test_every_shipped_experiments_variants_train_different_configs():
    """A variant that resolves to another's config would train the same model twice (compare counts
    it as repeats, not as the comparison its name promises): as ``optimizer``'s ``adamw`` once did,
    after the recipe it builds on moved to Muon."""
    for path in sorted(Path(str(SHIPPED)).glob("*.yaml")):
        if path.name == "base.yaml":
            continue
        sweep = load_sweep(path)
        configs: dict[str, str] = {}
        for run in sweep.runs:
            if run.seed == sweep.runs[0].seed:
                flat = {
                    k: v
                    for k, v in run.cfg.flat().items()
                    if k not in ("name", "train.out_dir", "seed")
                }
                configs[run.variant] = json.dumps(flat, sort_keys=True, default=str)
        assert len(configs) > 1 and len(set(configs.values())) == len(configs), path.name


def test_a_worker_with_other_settings_or_a_folder_of_another_study_is_refused(tmp_path, data_dir):
    """The study records the sweep's settings: a worker with another --budget (its runs would count
    as seeds of the same variants) is refused naming the difference; a folder whose runs belong to
    another study (here, the folder's own search) is refused before its runs are scored under the
    new study's trials."""
    from minigpt_cli.errors import MinigptError

    grid = tmp_path / "g.yaml"
    grid.write_text(
        json.dumps(
            {
                "name": "g",
                "base": str(TINY),
                "set": small(data_dir),
                "budget": {"iters": 4},
                "grid": {"model.ffn": ["relu"]},
                "seeds": 1,
            }
        )
    )
    journal = tmp_path / "shared.journal"
    for home in ("a", "b"):
        (tmp_path / home).mkdir()
    with working_dir(tmp_path / "a"):
        run_sweep(grid, storage=str(journal), worker=True)
    with (
        working_dir(tmp_path / "b"),
        pytest.raises(
            MinigptError,
            match=r"started with other settings "
            r"\(overrides.budget: null -> \"iters=6\"\)",
        ),
    ):
        run_sweep(grid, storage=str(journal), worker=True, overrides=Overrides(budget="iters=6"))
    assert not list((tmp_path / "b").rglob("metrics.jsonl"))  # refused before any run trained
    path = search_file(tmp_path, data_dir, trials=2)
    with working_dir(tmp_path):
        run_sweep(path)  # the folder's own study.journal
        before = sorted(p.name for p in (tmp_path / "runs" / "s").iterdir())
        with pytest.raises(
            MinigptError, match=r"holds the runs of the study in the folder's own study.journal"
        ):
            run_sweep(path, storage=str(tmp_path / "other.journal"), worker=True)
    assert sorted(p.name for p in (tmp_path / "runs" / "s").iterdir()) == before


def test_refusals_name_the_key_as_written_and_the_option_that_gave_it(cli, tmp_path, data_dir):
    """No pydantic validator names (``seeds.constrained-int``, ``...Range.step``) in a message, and
    a bad
    --budget is the command line's, not the shipped file's."""
    bad = tmp_path / "b.yaml"
    bad.write_text(
        json.dumps(
            {
                "name": "b",
                "base": str(TINY),
                "variants": {"a": {}, "b": {}},
                "seeds": 0,
                "budget": {"iters": 2},
            }
        )
    )
    res = cli("sweep", bad)
    assert_user_error(res, "b.yaml: seeds: input should be greater than or equal to 1")
    assert "constrained" not in res.stderr
    path = search_file(
        tmp_path, data_dir, params={"model.n_layer": {"low": 1, "high": 3, "step": 0}}
    )
    res = cli("sweep", path)
    assert_user_error(res, "search.params.model.n_layer.step: input should be greater than 0")
    assert "Range" not in res.stderr
    assert_user_error(
        cli("sweep", "ffn", "--budget", "iters=0"),
        "--budget: budget.iters: input should be greater",
    )
    # Beside a good --seeds the bad --budget is named alone; a --set that no variant could pass is
    # the --set's, one that fails with a variant's values only is that variant's.
    assert_user_error(
        cli("sweep", "ffn", "--seeds", "1", "--budget", "iters=0"), "error: --budget: budget.iters"
    )
    assert_user_error(
        cli("sweep", "ffn", "--set", "train.muon.ns_steps=0"),
        "error: --set: train.muon.ns_steps: input should be greater than or equal to 1 (got 0)",
    )
    clash = tmp_path / "c.yaml"
    clash.write_text(
        json.dumps(
            {
                "name": "c",
                "base": str(TINY),
                "variants": {"ok": {}, "heads": {"model.n_head": 3}},
                "seeds": 1,
                "budget": {"iters": 2},
            }
        )
    )
    res = cli("sweep", clash, "--set", "model.n_embd=32")
    assert_user_error(res, "c.yaml: variant heads:")


def test_a_searched_trials_values_are_short_in_the_tables_and_whole_in_the_json():
    """The terminal's table cuts cells to 24 characters: a searched trial's values are written there
    by their keys' last part and 4 significant digits, so none is cut away; summary.md names the
    whole keys, to 4 digits too; summary.json and .csv keep what --set reads back exactly."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import create_trial

    from minigpt_cli.experiments.trials import format_trials, study_trials

    study = optuna.create_study()
    study.add_trial(
        create_trial(
            params={"train.learning_rate": 0.0012345678901234567, "model.ffn": "relu2"},
            distributions={
                "train.learning_rate": FloatDistribution(1e-4, 1e-2, log=True),
                "model.ffn": CategoricalDistribution(["relu", "relu2"]),
            },
            value=1.5,
        )
    )
    result = study_trials(study)
    terminal, whole = format_trials(result), format_trials(result, clip=False)
    assert "| learning_rate=0.001235, ffn=relu2 |" in terminal
    assert "| train.learning_rate=0.001235, model.ffn=relu2 |" in whole
    assert "0.0012345678901234567" not in terminal + whole
    assert result["trials"][0]["params"]["train.learning_rate"] == 0.0012345678901234567


def test_a_killed_workers_orphan_run_is_noted_and_the_trial_scored_from_the_run_the_study_names(
    cli, tmp_path, data_dir
):
    """Issue 40 §7: worker A was killed during trial 0, and worker B (a folder of its own) took the
    trial over and finished the search. Started again, A's summary scores each trial by the run the
    study names (B's), notes A's own trial-0000 folder as unfinished with where the trial finished,
    and never scores it."""
    from minigpt_cli.config.schema import load_config
    from minigpt_cli.trainer import train

    path = search_file(tmp_path, data_dir, trials=2, prune="none")
    storage = tmp_path / "study.journal"
    a, b = tmp_path / "a", tmp_path / "b"
    for home in (a, b):
        home.mkdir()
    with working_dir(b):
        run_sweep(path, storage=str(storage), worker=True)
    # What the kill left in A's folder: trial 0's run, untrained, at step 0 (its first eval and
    # checkpoint).
    orphan = a / "runs" / "s" / "trial-0000-s1337"
    cfg = load_config(
        TINY, [*small(data_dir), "train.max_iters=0", f"train.out_dir={orphan.parent}"]
    )
    train(cfg, orphan.name, echo=lambda m: None, progress=False)
    with working_dir(a):
        res = cli("sweep", path, "--storage", storage, "--worker", "--json")
    assert res.exit_code == 0, res
    result = json.loads(res.stdout)
    study = load(storage)
    values = {f"trial-{t.number:04d}": t.value for t in study.get_trials()}
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == set(values)
    for (
        name,
        value,
    ) in values.items():  # B's runs, whose final val the study holds; not the orphan's
        assert (
            rows[name]["final_val"] == pytest.approx(value, rel=1e-12) and rows[name]["steps"] == 20
        )
    where = b.resolve() / "runs" / "s" / "trial-0000-s1337"
    note = f"is unfinished and not scored: trial-0000 finished in {where} on {os.uname().nodename}"
    assert any(str(orphan.relative_to(a)) in n and note in n for n in result["notes"]), result[
        "notes"
    ]
    assert res.stderr.count(note) == 0  # said once, under the table (here: in the JSON)
    assert (a / "runs" / "s" / "summary.md").read_text().count(note) == 1
