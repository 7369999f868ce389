"""``minigpt sweep`` and ``minigpt compare``: fair budgets, seeds, a kill survived, bad sweep files
refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TINY, assert_user_error, records, tiny, working_dir

from minigpt_cli.config.schema import load_config
from minigpt_cli.errors import Interrupted, MinigptError
from minigpt_cli.experiments import compare
from minigpt_cli.experiments.compare import summarize
from minigpt_cli.experiments.sweep import SHIPPED, load_sweep, run_sweep
from minigpt_cli.trainer import train


def write_sweep(folder: Path, data_dir: Path, **over) -> Path:
    spec = {
        "name": "s",
        "base": str(TINY),
        "set": [
            f"data.data_dir={data_dir}",
            "train.eval_interval=10",
            "train.eval_iters=2",
            "train.sample_tokens=0",
            "train.log_interval=5",
        ],
        "grid": {"model.ffn": ["relu", "gelu"]},
        "seeds": 2,
        "budget": {"iters": 20},
        **over,
    }
    path = folder / "s.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


#: The columns that do not depend on the clock: equal for a killed-and-restarted sweep and an
#: uninterrupted one.
EXACT = (
    "variant",
    "params",
    "flops_per_token",
    "steps",
    "final_val_all",
    "best_val_all",
    "bits_per_byte_all",
)


def test_a_killed_sweep_finishes_with_the_uninterrupted_numbers(tmp_path, data_dir, monkeypatch):
    from minigpt_cli.trainer import loop

    (tmp_path / "a").mkdir()
    with working_dir(tmp_path / "a"):
        whole = run_sweep(write_sweep(tmp_path / "a", data_dir))
    assert [r["variant"] for r in whole["rows"]] == ["ffn-relu", "ffn-gelu"]
    assert all(r["seeds"] == 2 and r["steps"] == 20 for r in whole["rows"])

    log_train = loop.Trainer.log_train

    def ctrl_c_at_step_15(
        self, loss, lr
    ):  # what a Ctrl-C does: the stop flag, seen before the next step
        log_train(self, loss, lr)
        if self.s.run_dir.name == "ffn-gelu-s1337" and self.prog.step == 15:
            self.s.stop.signal = "SIGINT"

    (tmp_path / "b").mkdir()
    with working_dir(tmp_path / "b"):
        monkeypatch.setattr(loop.Trainer, "log_train", ctrl_c_at_step_15)
        with pytest.raises(Interrupted):
            run_sweep(write_sweep(tmp_path / "b", data_dir))
        state = json.loads(Path("runs/s/sweep.json").read_text())
        assert state["done"] == ["ffn-relu-s1337", "ffn-relu-s1338"]
        monkeypatch.setattr(loop.Trainer, "log_train", log_train)
        said: list[str] = []
        again = run_sweep(write_sweep(tmp_path / "b", data_dir), echo=said.append)
    assert "sweep s: 4 runs (2 done, 1 to resume: ffn-gelu-s1337), 2 variants" in said[0], said
    for a, b in zip(whole["rows"], again["rows"]):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
    files = sorted(p.name for p in (tmp_path / "b" / "runs" / "s").iterdir())
    assert files == [
        "ffn-gelu-s1337",
        "ffn-gelu-s1338",
        "ffn-relu-s1337",
        "ffn-relu-s1338",
        "summary.csv",
        "summary.json",
        "summary.md",
        "summary.png",
        "sweep.json",
    ]
    assert (tmp_path / "b" / "runs" / "s" / "summary.png").stat().st_size > 10_000
    assert "| ffn-relu |" in (tmp_path / "b" / "runs" / "s" / "summary.md").read_text()
    # compare on the folder keeps the sweep file's order (relu, then gelu), not the names' order
    from minigpt_cli.experiments.compare import expand, summarize

    assert json.loads((tmp_path / "b" / "runs" / "s" / "sweep.json").read_text())["done"] == [
        "ffn-relu-s1337",
        "ffn-relu-s1338",
        "ffn-gelu-s1337",
        "ffn-gelu-s1338",
    ]
    assert [r["variant"] for r in summarize(expand([tmp_path / "b" / "runs" / "s"]))["rows"]] == [
        "ffn-relu",
        "ffn-gelu",
    ]
    # a run copied into the sweep's folder from elsewhere is noted, not taken silently for one of
    # the sweep's
    import shutil

    shutil.copytree(
        tmp_path / "a" / "runs" / "s" / "ffn-gelu-s1337", tmp_path / "b" / "runs" / "s" / "ffn-x-s1"
    )
    notes = summarize(expand([tmp_path / "b" / "runs" / "s"]))["notes"]
    assert any(
        "ffn-x-s1 is not among the runs" in n and "sweep.json lists as done" in n for n in notes
    ), notes
    assert not any("ffn-relu-s1337 is not among" in n for n in notes)
    # Started once more, nothing is left to run, and the sweep file may not change under it.
    with working_dir(tmp_path / "b"):
        write_sweep(tmp_path / "b", data_dir, budget={"iters": 30})
        with pytest.raises(Exception, match=r"budget.iters: 20 -> 30"):
            run_sweep(tmp_path / "b" / "s.yaml")


@pytest.mark.parametrize(
    "over,fragment",
    [
        (
            {"grid": {"model.ffnn": ["relu"]}},
            "variant ffnn-relu",
        ),
        ({"grid": {"model.n_layer": ["two"]}}, "model.n_layer"),
        ({"grid": {"model.dropout": [0.5, "0.5"]}}, "get the same name 'dropout-0.5'"),
        ({"budget": {"iters": 0}}, "budget.iters: input should be greater than 0"),
        ({"budget": {"iters": 5, "seconds": 3}}, "exactly one of iters, tokens or seconds"),
        ({"seeds": 0}, "seeds"),
        ({"variants": {"ffn-relu": {"model.ffn": "gelu"}}}, "get the same name 'ffn-relu'"),
        ({"grid": {}}, "give grid: or variants:"),
        (
            {"grdi": {"model.ffn": ["relu"]}},
            "grdi: unknown key; did you mean grid?",
        ),  # a config's hint, not pydantic's
        ({"budget": {"iter": 5}}, "budget.iter: unknown key; did you mean budget.iters?"),
        # A sweep's runs go in its own folder: an override of train.out_dir is refused, wherever it
        # is given.
        (
            {"set": ["train.out_dir=elsewhere"]},
            "s.yaml: set: train.out_dir cannot be set in a sweep",
        ),
        ({"grid": {"train.out_dir": ["a", "b"]}}, "grid: train.out_dir cannot be set"),
        ({"variants": {"v": {"train.out_dir": "a"}}}, "variants.v: train.out_dir cannot be set"),
        ({"base": "nothere.yaml"}, "s.yaml: base: config file 'nothere.yaml' not found"),
        # Counted before anything is expanded (issue 27): neither a huge seed count nor a 10^12 grid
        # is built.
        ({"seeds": 100_000_000}, "seeds"),
        (
            {"grid": {f"model.k{i}": list(range(10)) for i in range(12)}},
            "(1,000,000,000,000 variants x seeds) is more than one sweep may ask for (10,000)",
        ),
    ],
)
def test_a_bad_sweep_file_is_one_line_before_any_run(cli, tmp_path, data_dir, over, fragment):
    path = write_sweep(tmp_path, data_dir, **over)
    with working_dir(tmp_path):
        res = cli("sweep", path)
    assert_user_error(res, fragment)
    assert not (tmp_path / "runs").exists()


def test_a_missing_base_names_base_not_a_folder(cli, tmp_path, data_dir):
    with working_dir(tmp_path):
        res = cli("sweep", write_sweep(tmp_path, data_dir, base="nothere.yaml"))
    assert_user_error(res, "base:", "not found", "shipped configs", "tiny")
    assert "folder" not in res.stderr and "cannot access" not in res.stderr


def test_an_edited_sweep_that_never_trained_replaces_its_record(tmp_path, data_dir):
    """A sweep that fails before any run saves a checkpoint (here: its corpus cannot be downloaded)
    leaves nothing to keep apart from an edited sweep file: started again, the edit is taken, not
    refused."""
    sets = [f"data.data_dir={tmp_path / 'empty-data'}", "data.url=http://127.0.0.1:9/input.txt"]
    with working_dir(tmp_path):
        for iters in (5, 6):
            with pytest.raises(MinigptError) as e:
                run_sweep(write_sweep(tmp_path, data_dir, set=sets, budget={"iters": iters}))
            assert "cannot reach http://127.0.0.1:9" in str(e.value)  # not "s.yaml changed since"
            state = json.loads((tmp_path / "runs" / "s" / "sweep.json").read_text())
            assert state["sweep"]["budget"]["iters"] == iters and state["done"] == []


def test_a_finished_run_deleted_from_the_sweep_is_trained_again(tmp_path, data_dir):
    """sweep.json still lists it as done; its folder is gone: the restart trains it, not compare
    refusing it."""
    import shutil

    path = write_sweep(
        tmp_path,
        data_dir,
        seeds=1,
        budget={"iters": 4},
        set=[
            f"data.data_dir={data_dir}",
            "train.eval_interval=4",
            "train.eval_iters=1",
            "train.sample_tokens=0",
        ],
    )
    with working_dir(tmp_path):
        run_sweep(path, echo=lambda m: None, progress=False)
        first = json.loads((tmp_path / "runs" / "s" / "summary.json").read_text())
        shutil.rmtree(
            tmp_path / "runs" / "s" / "ffn-relu-s1337"
        )  # seeds: 1 is the base config's seed
        said: list[str] = []
        run_sweep(path, echo=said.append, progress=False)
    assert any(
        "ffn-relu-s1337: finished, but no longer in the sweep's folder" in m for m in said
    ), said
    assert any("2 runs (1 done)" in m for m in said), said
    again = json.loads((tmp_path / "runs" / "s" / "summary.json").read_text())
    # trained again from the same seed: the same losses as the first time
    assert [r["final_val_all"] for r in again["rows"]] == [
        r["final_val_all"] for r in first["rows"]
    ]


@pytest.mark.parametrize("var", ["MINIGPT_FAST_DROPOUT", "MINIGPT_ONEDNN"])
def test_a_bad_kernel_setting_is_one_line_before_the_sweep_starts(
    cli, tmp_path, data_dir, monkeypatch, var
):
    """Refused once, by the sweep, not by each run after the sweep's folder is made (or in --jobs'
    logs)."""
    path = write_sweep(tmp_path, data_dir)
    monkeypatch.setenv(var, "maybe")
    with working_dir(tmp_path):
        res = cli("sweep", path, "--jobs", "2")
    assert_user_error(res, f"{var}='maybe'")
    assert not (tmp_path / "runs").exists()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = (
                stat.read_text().rsplit(")", 1)[1].split()
            )  # after "pid (comm)": state, ppid, ...
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie no one has reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _training(run: Path) -> bool:
    """Whether the run has logged a training step."""
    metrics = run / "metrics.jsonl"
    return metrics.is_file() and any(
        json.loads(line)["event"] == "train"
        for line in metrics.read_text().splitlines()
        if line.endswith("}")
    )


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
    reason="the parent-death signal is Linux's; --jobs 2 needs 2 cores",
)
def test_the_runs_of_a_sweep_killed_by_sigkill_stop_and_save(tmp_path, data_dir):
    """SIGKILL gives the sweep no chance to stop its --jobs runs; the kernel sends each one SIGTERM
    instead, on which it saves checkpoints/last and ends, rather than training on unseen."""
    path = write_sweep(tmp_path, data_dir, seeds=1, budget={"iters": 1_000_000})
    folders = [tmp_path / "runs" / "s" / name for name in ("ffn-relu-s1337", "ffn-gelu-s1337")]
    sweep = subprocess.Popen(
        [sys.executable, "-m", "minigpt_cli", "sweep", str(path), "--jobs", "2"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: list[int] = []
    try:
        # The deadlines only end a hang: each wait returns as soon as its condition holds.
        assert _wait_for(lambda: sweep.poll() is not None or all(map(_training, folders)), 900)
        assert sweep.poll() is None, "the sweep ended before its runs trained"
        children = _children(sweep.pid)
        assert len(children) == 2, children
        sweep.kill()
        sweep.wait(timeout=300)
        assert _wait_for(lambda: not any(map(_alive, children)), 600), (
            "the runs outlived the killed sweep"
        )
        for folder in folders:
            assert "stopped by SIGTERM" in (folder / "train.log").read_text()
            assert (folder / "checkpoints" / "last").is_dir()
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="--jobs 2 needs 2 cores")
def test_on_a_machine_with_two_gpus_each_job_gets_its_own(tmp_path, data_dir, monkeypatch):
    """Two CUDA devices (simulated: torch.cuda.device_count says 2): without --jobs a sweep whose
    runs go to CUDA (device auto) runs 2 at a time, saying so, and each run's process sees one GPU
    of its own in CUDA_VISIBLE_DEVICES (its env.json records it); the same sweep on device cpu stays
    at 1 job."""
    import torch

    from minigpt_cli.experiments.sweep import Overrides, default_jobs, visible_gpus

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus() == ["0", "1"]
    path = write_sweep(tmp_path, data_dir, seeds=1, budget={"iters": 2})
    assert default_jobs(load_sweep(path), print) == 1  # tiny.yaml trains on the CPU
    notes: list[str] = []
    with working_dir(tmp_path):
        run_sweep(path, overrides=Overrides(("device=auto",)), echo=notes.append)
    assert (
        "note: 2 GPUs here: 2 runs at a time, each on its own GPU (--jobs 1: one run at a time)"
        in (notes)
    )
    folders = [tmp_path / "runs" / "s" / f"ffn-{f}-s1337" for f in ("relu", "gelu")]
    seen = [json.loads((f / "env.json").read_text())["cuda_visible_devices"] for f in folders]
    assert sorted(seen) == ["0", "1"], seen
    # Devices already narrowed by the caller: the jobs share out those.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert visible_gpus() == ["3", "5"]


def test_budgets_give_equal_tokens_or_equal_time(tmp_path, data_dir):
    path = write_sweep(
        tmp_path,
        data_dir,
        grid={"train.batch_size": [4, 8]},
        budget={"tokens": 8 * 32 * 20},
        seeds=1,
    )
    steps = {r.variant: r.cfg.train.max_iters for r in load_sweep(path).runs}
    assert steps == {
        "batch_size-4": 40,
        "batch_size-8": 20,
    }  # the same tokens: tiny's block_size is 32
    result = train(
        tiny(
            data_dir, "train.max_iters=100000", "train.max_seconds=1", f"train.out_dir={tmp_path}"
        ),
        "timed",
        echo=lambda m: None,
        progress=False,
    )
    events = [json.loads(l) for l in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    last = events[-1]
    assert last["event"] == "eval" and last["step"] == result.step and 0 < result.step < 100000
    assert last["elapsed_s"] >= 1.0


def test_compare_by_hand_and_across_corpora(cli, tmp_path, data_dir):
    a = train(
        tiny(data_dir, "train.max_iters=20", f"train.out_dir={tmp_path}"),
        "a",
        echo=lambda m: None,
        progress=False,
    ).run_dir
    b = train(
        tiny(
            data_dir, "train.max_iters=20", "model.pos_encoding=rope", f"train.out_dir={tmp_path}"
        ),
        "b",
        echo=lambda m: None,
        progress=False,
    ).run_dir
    with working_dir(tmp_path):
        res = cli("compare", a, b, "--json")
    assert res.exit_code == 0, res
    got = json.loads(res.stdout)
    assert got["columns"] == ["model.pos_encoding"] and [r["variant"] for r in got["rows"]] == [
        "a",
        "b",
    ]
    assert (
        got["rows"][0]["params"] - got["rows"][1]["params"] == 32 * 32
    )  # b has no learned position table
    assert "one seed" in got["sentences"][0]
    assert (tmp_path / "comparison" / "summary.png").is_file()
    other = tmp_path / "other.txt"
    other.write_text((data_dir / "tinyshakespeare" / "input.txt").read_text()[:200_000])
    c = train(
        tiny(data_dir, "train.max_iters=20", f"data.path={other}", f"train.out_dir={tmp_path}"),
        "c",
        echo=lambda m: None,
        progress=False,
    ).run_dir
    got = summarize([a, c])
    assert "final_val" not in got["rows"][0] and got["rows"][0]["bits_per_byte"] > 0
    assert any("different corpora" in n for n in got["notes"])
    assert_user_error(
        cli("compare", a, c, "--metric", "val_loss", "--output", tmp_path / "x"),
        "different corpora",
    )


def test_compare_escapes_table_cells_and_writes_plain_numbers(cli, tmp_path, data_dir):
    """sample.prompt "\\n" (the default) must not split its Markdown row; summary.csv and .json hold
    numbers, not "27,840": only the Markdown table formats them."""
    import csv

    from minigpt_cli.experiments.compare import format_summary

    made = [
        train(
            tiny(
                data_dir,
                "train.max_iters=2",
                "train.eval_iters=2",
                f"train.out_dir={tmp_path}",
                *prompt,
            ),
            name,
            echo=lambda m: None,
            progress=False,
        ).run_dir
        for name, prompt in (("newline", []), ("romeo", ["sample.prompt=ROMEO:"]))
    ]
    res = cli("compare", *made, "--output", tmp_path / "out")
    assert res.exit_code == 0, res
    md = (tmp_path / "out" / "summary.md").read_text()
    for table in (md, res.stdout):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        assert len(rows) == 4 and all(line.endswith("|") for line in rows), (
            table
        )  # header, rule, 2 variants
        assert "| newline | \\n |" in rows[2] and "| romeo | ROMEO: |" in rows[3], table
    with open(tmp_path / "out" / "summary.csv", newline="") as f:
        head, *body = list(csv.reader(f))
    got = dict(zip(head, body[0]))
    assert got["sample.prompt"] == "\n"  # the value itself: CSV quotes it
    for key in (
        "params",
        "params_non_embedding",
        "flops_per_token",
        "seeds",
        "seeds_reached_target",
    ):
        assert got[key].isdigit(), (key, got[key])  # "1/1" is the Markdown table's, not a number
    float(got["final_val"]), float(got["tokens_per_sec"]), float(got["bits_per_byte"])
    rows = json.loads((tmp_path / "out" / "summary.json").read_text())["rows"]
    assert all(isinstance(r["params"], int) and isinstance(r["final_val"], float) for r in rows)
    # Any text a cell may hold: a | or a tab is escaped too, so each row keeps its cells.
    result = summarize(made)
    result["rows"][0]["sample.prompt"] = "a|b\tc\\"
    line = [x for x in format_summary(result).splitlines() if x.startswith("| newline")][0]
    assert "| a\\|b\\tc\\\\ |" in line and line.count(" | ") == format_summary(result).splitlines()[
        0
    ].count(" | ")


def test_an_interrupted_compare_leaves_the_previous_summary_set_or_none(
    tmp_path, data_dir, monkeypatch
):
    """The four summary files are built first, then renamed into place together: a Ctrl-C while the
    PNG is drawn leaves the previous set as it was, one between the renames leaves none, and no
    temporary file."""
    from minigpt_cli.experiments import compare

    made = [
        train(
            tiny(data_dir, "train.max_iters=2", "train.eval_iters=2", f"train.out_dir={tmp_path}"),
            name,
            echo=lambda m: None,
            progress=False,
        ).run_dir
        for name in ("a", "b")
    ]
    out = tmp_path / "out"
    summarize(made[:1], out=out)
    names = ["summary.csv", "summary.json", "summary.md", "summary.png"]
    before = {name: (out / name).read_bytes() for name in names}

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "_plot", interrupted)
    with pytest.raises(KeyboardInterrupt):
        summarize(made, out=out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.undo()
    real, calls = os.replace, []

    def second_interrupted(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "replace", second_interrupted)
    with pytest.raises(KeyboardInterrupt):
        summarize(made, out=out)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("path", sorted(Path(str(SHIPPED)).glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_experiment_checks_out_with_three_seeds(path):
    if path.name == "base.yaml":
        return
    sweep = load_sweep(path)  # every variant's config validated
    variants = {r.variant for r in sweep.runs}
    assert len(variants) >= 2 and len(sweep.runs) >= 3 * len(variants)


def test_compare_reads_the_config_the_weights_were_trained_with(tmp_path, data_dir):
    """An edited run config.yaml (n_embd 32 -> 64) must not change compare's parameters or columns:
    the checkpoint's verified config is the record, and the edit is noted."""
    made = [
        train(
            tiny(data_dir, "train.max_iters=2", "train.eval_iters=2", f"train.out_dir={tmp_path}"),
            name,
            echo=lambda m: None,
            progress=False,
        ).run_dir
        for name in ("a", "b")
    ]
    honest = summarize(made)
    config = made[1] / "config.yaml"
    config.write_text(config.read_text().replace("n_embd: 32", "n_embd: 64"))
    got = summarize(made)
    assert [r["params"] for r in got["rows"]] == [r["params"] for r in honest["rows"]]
    assert got["columns"] == honest["columns"] == []
    assert any(
        "differs from its checkpoint's config.yaml" in n and str(config) in n for n in got["notes"]
    )


def test_a_shrunk_budget_is_noted_before_any_run_and_scale_schedule_keeps_the_schedules_shape(
    cli, tmp_path, data_dir, monkeypatch
):
    """Issue 37: ``sweep optimizer --budget iters=80`` would run inside its 100-step warmup with 2
    evals; the note says so before anything runs (here with --dry-run, which writes nothing), naming
    the keys to scale. --scale-schedule scales them by 80/500, and a real sweep records it in
    sweep.json, trains the scaled runs, prints a line per finished run, and is refused when started
    again without it."""
    with working_dir(tmp_path):
        res = cli("sweep", "optimizer", "--budget", "iters=80", "--seeds", "2", "--dry-run")
        assert res.exit_code == 0, res
        assert (
            "note: with budget iters=80 a run ends inside its warmup (100 steps, before any decay) "
            "and gets 2 evals (one every 250 steps): scale train.eval_interval and "
            "train.warmup_iters with the budget, or add --scale-schedule"
        ) in res.stderr
        assert "adamw-s1338: 80 steps, warmup 100, an eval every 250 steps" in res.stdout
        assert res.stdout.splitlines()[-1].startswith("time: about ")
        assert " for the 4 runs, one at a time" in res.stdout
        scaled = cli("sweep", "optimizer", "--budget", "iters=80", "--dry-run", "--scale-schedule")
        assert scaled.exit_code == 0 and "note:" not in scaled.stderr, scaled
        assert (
            "muon-s1337: 80 steps, warmup 16, an eval every 40 steps" in scaled.stdout
        )  # x 80/500
        assert not Path("runs").exists()  # a dry run writes nothing
        assert_user_error(
            cli("sweep", "optimizer", "--scale-schedule"),
            "--scale-schedule scales the schedule by the steps of --budget over the sweep file's "
            "budget (iters=500)",
        )

    path = write_sweep(
        tmp_path, data_dir, seeds=1
    )  # iters=20, warmup 5 (tiny's), eval and log every 10, 5
    with working_dir(tmp_path):
        res = cli("sweep", path, "--budget", "iters=4")
        assert res.exit_code == 0, res
        assert "note: with budget iters=4 a run ends inside its warmup (5 steps" in res.stderr
        assert "gets 2 evals (one every 10 steps)" in res.stderr
        assert "note: 2 of the runs have fewer than 3 evals" in res.stdout
        # summary.png's curves of 2 evals lie within its y-range (step 0's loss once fell outside
        # it)
        drawn, real = [], compare.figure
        monkeypatch.setattr(compare, "figure", lambda *a: drawn.append(real(*a)) or drawn[-1])
        compare.summarize(compare.expand([Path("runs/s")]), out=Path("runs/s"))
        low, high = drawn[0].axes[0].get_ylim()
        ys = [y for line in drawn[0].axes[0].get_lines() for y in line.get_ydata()]
        assert len(ys) == 4 and low <= min(ys) and max(ys) <= high
        shutil.rmtree("runs")
        res = cli("sweep", path, "--budget", "iters=8", "--scale-schedule")
        assert res.exit_code == 0 and "note:" not in res.stderr, res
        state = json.loads(Path("runs/s/sweep.json").read_text())
        assert state["overrides"] == {"budget": "iters=8", "scale_schedule": True}
        for ffn in ("relu", "gelu"):
            run = Path(f"runs/s/ffn-{ffn}-s1337")
            cfg = load_config(run / "config.yaml")
            assert (cfg.train.warmup_iters, cfg.train.eval_interval, cfg.train.log_interval) == (
                2,
                4,
                2,
            )
            evals = [e for e in records(run) if e["event"] == "eval"]
            assert [e["step"] for e in evals] == [0, 4, 8]
            # One line per finished run (stderr here is not a terminal: no progress bar).
            line = f"ffn-{ffn}-s1337: seed 1337, val {evals[-1]['val_loss']:.4f} at step 8, "
            assert res.stderr.count(line) == 1, res.stderr
        again = cli("sweep", path, "--budget", "iters=8")
        assert_user_error(again, "--scale-schedule changed since", "(scale_schedule: true -> null)")
        # A dry run makes the same refusal (it printed a plan the real start then refused).
        before = Path("runs/s/sweep.json").read_bytes()
        dry = cli("sweep", path, "--budget", "iters=8", "--dry-run")
        assert_user_error(dry, "--scale-schedule changed since", "(scale_schedule: true -> null)")
        assert Path("runs/s/sweep.json").read_bytes() == before


def test_a_budget_number_follows_the_set_rule(cli, tmp_path):
    """--budget's count is read as --set reads one: ``017`` is refused, not taken as 17."""
    with working_dir(tmp_path):
        assert_user_error(
            cli("sweep", "ffn", "--budget", "iters=017", "--dry-run"),
            "--budget: budget.iters: 017 reads as 15 in YAML 1.1 and as 17 in YAML 1.2",
        )
        ok = cli("sweep", "ffn", "--budget", "iters=17", "--dry-run")
        assert ok.exit_code == 0 and ": 17 steps," in ok.stdout, ok


def test_the_dry_runs_time_is_each_variants_train_estimate_at_every_seed(monkeypatch):
    """``sweep --dry-run``'s time: one ``train --dry-run`` estimate a variant, counted at each of its
    seeds; a seconds budget counts itself."""
    from types import SimpleNamespace

    from minigpt_cli.experiments.sweepfile import Overrides, estimated_seconds
    from minigpt_cli.trainer import setup

    timed = []

    def fake_plan(cfg, *args):
        timed.append(cfg.model.ffn)
        return SimpleNamespace(seconds={"relu": 10.0, "gelu": 20.0, "swiglu": 40.0}[cfg.model.ffn])

    monkeypatch.setattr(setup, "plan", fake_plan)
    sweep = load_sweep("ffn", lambda m: None, Overrides(seeds=2, budget="iters=50"))
    assert estimated_seconds(sweep.runs) == 2 * (10 + 20 + 40)
    assert sorted(timed) == ["gelu", "relu", "swiglu"]  # once a variant
    timed.clear()
    sweep = load_sweep("ffn", lambda m: None, Overrides(seeds=3, budget="seconds=7"))
    assert estimated_seconds(sweep.runs) == 9 * 7.0 and not timed
