"""The training engine under stress: resume, interruption, kills mid-write, accumulation, NaNs, DDP."""

from __future__ import annotations

import json
import math
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import assert_user_error, working_dir
from safetensors.torch import load_file

from minigpt_cli import checkpoint, runs
from minigpt_cli.config import load_config
from minigpt_cli.errors import Interrupted, MinigptError
from minigpt_cli.model import GPT
from minigpt_cli.trainer import train, train_step

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny.yaml"


def tiny(data_dir, *extra):
    return load_config(TINY, [f"data.data_dir={data_dir}", "train.log_interval=1", "train.sample_tokens=0",
                              "train.eval_interval=20", *extra])


def records(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def curve(run_dir: Path) -> dict[tuple[str, int], float]:
    out = {}
    for r in records(run_dir):
        key = "loss" if r["event"] == "train" else "val_loss"
        out[(r["event"], r["step"])] = r[key]
    return out


def assert_same_run(a: Path, b: Path, tol: float = 1e-6) -> None:
    ca, cb = curve(a), curve(b)
    assert ca.keys() == cb.keys()
    for k in ca:
        assert abs(ca[k] - cb[k]) <= tol, (k, ca[k], cb[k])
    wa = load_file(a / "checkpoints" / "last" / "model.safetensors")
    wb = load_file(b / "checkpoints" / "last" / "model.safetensors")
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=tol, rtol=0), k


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, data_dir):
    """The uninterrupted tiny run (120 steps) every resumed run is compared with."""
    work = tmp_path_factory.mktemp("ref")
    with working_dir(work):
        cfg = tiny(data_dir, "train.max_iters=120", "model.dropout=0.1")
        train(cfg, run_name="ref", echo=lambda m: None, progress=False)
    return work / "runs" / "ref"


def signals_after_step(monkeypatch, n: int, *signals: int):
    """Make the n-th ``train_step`` deliver real ``signals`` to this process as it returns.

    Returns the real ``train_step``, to put back with ``monkeypatch.setattr``.
    """
    import minigpt_cli.trainer.loop as T

    real_step = T.train_step
    calls = {"n": 0}

    def step_then_signals(*a, **k):
        out = real_step(*a, **k)
        calls["n"] += 1
        if calls["n"] == n:
            for sig in signals:
                os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(T, "train_step", step_then_signals)
    return real_step


def test_interrupted_and_resumed_equals_uninterrupted(reference_run, data_dir, tmp_path, monkeypatch):
    """SIGINT mid-run (in-process), then --resume: every later loss and the final weights match."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=120", "model.dropout=0.1")
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 57, signal.SIGINT)  # a real SIGINT after step 57
    with pytest.raises(Interrupted, match="step 57") as info:
        train(cfg, run_name="r", echo=lambda m: None, progress=False)
    assert str(info.value.resume_dir) == "runs/r"
    monkeypatch.setattr(T, "train_step", real_step)
    run = tmp_path / "runs" / "r"
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    assert meta["step"] == 57 and meta["eval_step"] == 40  # the losses it carries are step 40's (eval_interval 20)
    assert meta["val_loss"] == curve(run)[("eval", 40)]
    assert max(r["step"] for r in records(run)) == 57
    result = train(cfg, echo=lambda m: None, progress=False, resume=str(run))
    assert result.run_dir == run and result.step == 120
    assert_same_run(reference_run, run)


def _counting_eval_forward(on_call):
    """GPT.forward that counts eval-mode calls and runs ``on_call(n)`` after the n-th."""
    real = GPT.forward
    count = {"n": 0}

    def forward(self, *a, **k):
        out = real(self, *a, **k)
        if not self.training:
            count["n"] += 1
            on_call(count["n"])
        return out

    return forward, count


def test_sigint_during_a_long_eval_stops_it_at_once_and_resumes_identically(reference_run, data_dir, tmp_path,
                                                                           monkeypatch):
    """Ctrl-C inside the step-40 eval: no further eval batch runs, last is saved, the resume matches."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=120", "model.dropout=0.1")
    # Evals at steps 0 and 20 make 2 x (5 train + 5 val) eval forwards; call 23 is the step-40 eval's third.
    forward, count = _counting_eval_forward(lambda n: n == 23 and os.kill(os.getpid(), signal.SIGINT))
    monkeypatch.setattr(GPT, "forward", forward)
    with pytest.raises(Interrupted, match="stopped by SIGINT at step 40") as info:
        train(cfg, run_name="ev", echo=lambda m: None, progress=False)
    assert info.value.exit_code == 130
    assert count["n"] == 23  # the eval ended before its next batch
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "ev"
    assert json.loads((run / "checkpoints" / "last" / "meta.json").read_text())["step"] == 40
    assert not [r for r in records(run) if r["event"] == "eval" and r["step"] == 40]
    result = train(cfg, echo=lambda m: None, progress=False, resume=str(run))
    assert result.step == 120
    assert_same_run(reference_run, run)


def test_a_second_ctrl_c_aborts_without_saving_and_says_where_the_last_checkpoint_is(data_dir, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 25, signal.SIGINT, signal.SIGINT)  # the second one aborts
    with pytest.raises(Interrupted, match=r"second Ctrl-C without saving; the last checkpoint is "
                                          r"runs/a/checkpoints/last \(step 20\)") as info:
        train(tiny(data_dir, "train.max_iters=60"), run_name="a", echo=lambda m: None, progress=False)
    assert info.value.exit_code == 130 and str(info.value.resume_dir) == "runs/a"
    assert json.loads((tmp_path / "runs" / "a" / "checkpoints" / "last" / "meta.json").read_text())["step"] == 20
    # Before any checkpoint exists (inside the step-0 eval), the message says so and the new folder goes.
    monkeypatch.setattr(T, "train_step", real_step)

    def two_signals(n):
        if n == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(GPT, "forward", _counting_eval_forward(two_signals)[0])
    with pytest.raises(Interrupted, match="without saving; no checkpoint had been written yet"):
        train(tiny(data_dir, "train.max_iters=60"), run_name="b", echo=lambda m: None, progress=False)
    assert not (tmp_path / "runs" / "b").exists()


def test_sigterm_exits_143_and_the_hint_is_a_working_command(cli, data_dir, tmp_path, monkeypatch):
    """SIGTERM: status 143 (128+15), and the printed resume command (real config path, --set values) runs."""
    monkeypatch.chdir(tmp_path)
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 3, signal.SIGTERM)
    res = cli("train", TINY, "--run-name", "t", "--set", f"data.data_dir={data_dir}", "--set", "train.max_iters=8",
              "--set", "train.sample_tokens=0")
    assert res.exit_code == 143, res
    # A stop the user asked for is not reported as an error: one line saying what was saved.
    assert "error:" not in res.stderr, res
    lines = [l for l in res.stderr.splitlines() if l.startswith("stopped by SIGTERM at step 3; saved ")]
    assert len(lines) == 1, res
    hint = lines[0].split("continue with: ", 1)[1]
    assert hint.startswith(f"minigpt train {TINY} --set ") and "CONFIG" not in hint
    monkeypatch.setattr(T, "train_step", real_step)
    args = shlex.split(hint)
    assert args[:2] == ["minigpt", "train"]
    done = cli(*args[1:], "--no-progress")
    assert done.exit_code == 0, done
    assert "trained to step 8" in done.stdout


def test_resume_from_an_older_checkpoint_rewinds_the_metrics(reference_run, data_dir, tmp_path, monkeypatch):
    """Lose the tail of a run (as after a SIGKILL): resuming from the step-40 checkpoint repeats it exactly."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "k"
    shutil.copytree(reference_run, run)
    # Re-create the state of a run killed at step ~70 whose last checkpoint is the eval at step 40.
    cfg = tiny(data_dir, "train.max_iters=120", "model.dropout=0.1", "train.keep_every=40")
    train(cfg, run_name="k40", echo=lambda m: None, progress=False)
    src = tmp_path / "runs" / "k40" / "checkpoints" / "step-0000040"
    shutil.rmtree(run / "checkpoints" / "last")
    shutil.copytree(src, run / "checkpoints" / "last")
    result = train(cfg, echo=lambda m: None, progress=False, resume=str(run))
    assert result.step == 120
    assert_same_run(reference_run, run)


def test_resume_auto_picks_the_newest_run_of_that_name(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=10", "name=autoname")
    train(cfg, run_name="first", echo=lambda m: None, progress=False)
    time.sleep(0.05)
    train(cfg, run_name="second", echo=lambda m: None, progress=False)
    longer = tiny(data_dir, "train.max_iters=20", "name=autoname")
    res = train(longer, echo=lambda m: None, progress=False, resume="auto")
    assert res.run_dir.name == "second" and res.step == 20
    notes = []
    fresh = train(tiny(data_dir, "train.max_iters=5", "name=nobody"), echo=notes.append, progress=False,
                  resume="auto")
    assert fresh.step == 5 and any("starting a new one" in n for n in notes)


def test_resume_without_the_runs_tokenizer_says_where_it_came_from(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=4"), run_name="t", echo=lambda m: None, progress=False)
    (tmp_path / "runs" / "t" / "tokenizer.json").unlink()
    with pytest.raises(MinigptError, match=r"not found; a run keeps the tokenizer it was trained with: copy it back "
                                           r"from .*tokenizer-char.json"):
        train(tiny(data_dir, "train.max_iters=8"), echo=lambda m: None, progress=False, resume="runs/t")
    # A damaged copy of the config in the checkpoint says which file and how to mend it.
    shutil.copy(tmp_path / "runs" / "t" / "config.yaml", tmp_path / "good.yaml")
    (tmp_path / "runs" / "t" / "checkpoints" / "last" / "config.yaml").write_text("name: null\n")
    with pytest.raises(MinigptError, match=r"the checkpoint's config is damaged .*restore .*last/config.yaml"):
        train(tiny(data_dir, "train.max_iters=8"), echo=lambda m: None, progress=False, resume="runs/t")


def test_resume_refuses_a_different_model(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=5"), run_name="m", echo=lambda m: None, progress=False)
    with pytest.raises(MinigptError, match=r"model\.n_layer differs"):
        train(tiny(data_dir, "train.max_iters=5", "model.n_layer=3"), echo=lambda m: None, progress=False,
              resume="runs/m")


def test_resume_with_a_longer_schedule_says_how_the_learning_rate_changes(data_dir, tmp_path, monkeypatch):
    """Raising max_iters is allowed; a note names the change and the lr the run jumps to, which it uses."""
    from minigpt_cli.trainer import lr_at

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=10"), run_name="l", echo=lambda m: None, progress=False)
    longer = tiny(data_dir, "train.max_iters=30")
    notes = []
    res = train(longer, echo=notes.append, progress=False, resume="runs/l")
    assert res.step == 30
    new_lr, old_lr = lr_at(10, longer.train), lr_at(10, tiny(data_dir, "train.max_iters=10").train)
    assert new_lr > 2 * old_lr  # the cosine restarted its descent from higher up
    note = [n for n in notes if n.startswith("note:")]
    assert len(note) == 1 and "train.max_iters 10 -> 30" in note[0], notes
    assert "resuming runs/l from step 10" in notes
    assert f"lr {new_lr:.3e} at step 10 (was {old_lr:.3e})" in note[0], note
    lr_11 = [r["lr"] for r in records(tmp_path / "runs" / "l") if r["event"] == "train" and r["step"] == 11]
    assert lr_11 == [pytest.approx(new_lr)]
    assert "train.max_iters 10 -> 30" in (tmp_path / "runs" / "l" / "train.log").read_text()
    assert "max_iters: 30" in (tmp_path / "runs" / "l" / "config.yaml").read_text()


def test_continuing_a_finished_run_evaluates_like_the_uninterrupted_one(data_dir, tmp_path, monkeypatch):
    """The finished run's final eval (step 30, off the eval_interval grid) draws no batches the later evals
    would have drawn: with a schedule that does not depend on max_iters, every later loss matches."""
    monkeypatch.chdir(tmp_path)
    const = ("train.lr_schedule=constant", "train.warmup_iters=0")
    train(tiny(data_dir, "train.max_iters=60", *const), run_name="whole", echo=lambda m: None, progress=False)
    train(tiny(data_dir, "train.max_iters=30", *const), run_name="cont", echo=lambda m: None, progress=False)
    train(tiny(data_dir, "train.max_iters=60", *const), echo=lambda m: None, progress=False, resume="runs/cont")
    whole, cont = curve(tmp_path / "runs" / "whole"), curve(tmp_path / "runs" / "cont")
    assert ("eval", 30) in cont and ("eval", 30) not in whole
    del cont[("eval", 30)]
    assert cont.keys() == whole.keys()
    for k in whole:
        assert abs(whole[k] - cont[k]) <= 1e-6, (k, whole[k], cont[k])
    # env.json describes the latest session and keeps the one before.
    env = json.loads((tmp_path / "runs" / "cont" / "env.json").read_text())
    assert [set(e) for e in env["earlier_sessions"]] == [set(env) - {"earlier_sessions"}]
    assert "earlier_sessions" not in json.loads((tmp_path / "runs" / "whole" / "env.json").read_text())


def test_resuming_a_finished_run_trains_nothing_and_says_how_to_go_on(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=10"), run_name="f", echo=lambda m: None, progress=False)
    before = (tmp_path / "runs" / "f" / "metrics.jsonl").read_bytes()
    # --dry-run with --resume says what the resume would do, and does nothing.
    dry = ["train", TINY, "--dry-run", "--set", f"data.data_dir={data_dir}"]
    res = cli(*dry, "--resume", "runs/f", "--set", "train.max_iters=10")
    assert res.exit_code == 0 and "runs/f is at step 10, train.max_iters is 10: nothing would be trained" in res.stdout
    res = cli(*dry, "--resume", "runs/f", "--set", "train.max_iters=30")
    assert res.exit_code == 0, res
    assert "would continue runs/f from step 10 to train.max_iters 30" in res.stdout
    assert "note: resuming with train.max_iters 10 -> 30" in res.stdout
    res = cli(*dry, "--resume", "auto", "--set", "name=nosuch")
    assert res.exit_code == 0 and "no run named 'nosuch' under runs/ yet; a new run would start" in res.stdout
    assert_user_error(cli(*dry, "--resume", "runs/f", "--set", "model.n_layer=3"), "model.n_layer differs")
    assert (tmp_path / "runs" / "f" / "metrics.jsonl").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["f"]
    res = cli("train", TINY, "--resume", "runs/f", "--no-progress", "--set", f"data.data_dir={data_dir}",
              "--set", "train.max_iters=10")
    assert res.exit_code == 0, res
    assert "runs/f already reached train.max_iters=10; nothing was trained" in res.stdout, res
    assert "--set train.max_iters=20" in res.stdout and "n/a" not in res.stdout
    assert (tmp_path / "runs" / "f" / "metrics.jsonl").read_bytes() == before


def test_a_new_run_that_fails_before_its_first_checkpoint_leaves_no_folder(cli, data_dir, tmp_path, monkeypatch):
    """The error comes after the run folder exists; the same --run-name works right after."""
    monkeypatch.chdir(tmp_path)
    args = ["train", TINY, "--run-name", "x", "--no-progress", "--set", f"data.data_dir={data_dir}"]
    assert_user_error(cli(*args, "--set", "model.block_size=200000"), "block_size", notes_ok=True)
    assert not (tmp_path / "runs" / "x").exists()
    ok = cli(*args, "--set", "train.max_iters=2")
    assert ok.exit_code == 0, ok


def test_a_crash_before_the_first_checkpoint_undoes_only_what_the_run_made(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def broken(self, *a, **k):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(GPT, "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        train(tiny(data_dir), run_name="oom", echo=lambda m: None, progress=False)
    assert not (tmp_path / "runs" / "oom").exists()
    # A folder the user made (empty) is emptied again, not removed.
    (tmp_path / "runs" / "mine").mkdir()
    with pytest.raises(RuntimeError, match="out of memory"):
        train(tiny(data_dir), run_name="mine", echo=lambda m: None, progress=False)
    assert (tmp_path / "runs" / "mine").is_dir() and not any((tmp_path / "runs" / "mine").iterdir())
    # A run with a checkpoint is kept whatever fails later.
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="kept", echo=lambda m: None, progress=False)
    monkeypatch.setattr(GPT, "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        train(tiny(data_dir, "train.max_iters=6"), resume="runs/kept", echo=lambda m: None, progress=False)
    assert (tmp_path / "runs" / "kept" / "checkpoints" / "last" / "model.safetensors").is_file()


def test_a_run_folder_in_use_is_refused(cli, data_dir, tmp_path, monkeypatch):
    """Another process holds runs/m's lock: --resume and --run-name m both fail with its pid; nothing changes."""
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="m", echo=lambda m: None, progress=False)
    (tmp_path / "runs" / "e").mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from minigpt_cli.runs import RunLock; "
         "[RunLock(Path(p)).acquire('-') for p in sys.argv[1:]]; print('locked', flush=True); time.sleep(120)",
         "runs/m", "runs/e"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (tmp_path / "runs" / "m" / "metrics.jsonl").read_bytes()
        common = ["--no-progress", "--set", f"data.data_dir={data_dir}", "--set", "train.max_iters=6"]
        res = cli("train", TINY, "--resume", "runs/m", *common)
        assert_user_error(res, f"runs/m is in use by another minigpt train (pid {holder.pid})", "wait for it")
        res = cli("train", TINY, "--run-name", "e", *common)
        assert_user_error(res, f"runs/e is in use by another minigpt train (pid {holder.pid})", "--run-name")
        assert (tmp_path / "runs" / "m" / "metrics.jsonl").read_bytes() == before
        assert [p.name for p in (tmp_path / "runs" / "e").iterdir()] == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    res = cli("train", TINY, "--resume", "runs/m", *common)  # the lock died with its holder
    assert res.exit_code == 0, res


def test_resume_sweeps_temporary_files_a_kill_left(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="w", echo=lambda m: None, progress=False)
    run = tmp_path / "runs" / "w"
    junk = [run / "checkpoints" / ".last.tmp-abc123", run / "checkpoints" / ".best.tmp-xyz"]
    for j in junk:
        j.mkdir()
        (j / "model.safetensors").write_bytes(b"half")
    (run / ".metrics.q1w2e3.jsonl").write_text("{}\n")
    res = train(tiny(data_dir, "train.max_iters=5"), resume="runs/w", echo=lambda m: None, progress=False)
    assert res.step == 5
    assert not any(j.exists() for j in junk) and not (run / ".metrics.q1w2e3.jsonl").exists()
    assert "removed 3 temporary file(s)" in (run / "train.log").read_text()


def _cli(args, env_extra=None, cwd=None, **kw):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "minigpt_cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, **kw)


def test_sigint_through_the_cli_leaves_a_resumable_checkpoint(data_dir, tmp_path):
    args = ["train", TINY, "--run-name", "s", "--no-progress", "--set", f"data.data_dir={data_dir}",
            "--set", "train.max_iters=100000", "--set", "train.eval_interval=100000"]
    proc = subprocess.Popen([sys.executable, "-m", "minigpt_cli", *map(str, args)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "s" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.is_file() and len(metrics.read_text().splitlines()) > 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume runs/s" in err and "Traceback" not in err
    last = tmp_path / "runs" / "s" / "checkpoints" / "last"
    step = json.loads((last / "meta.json").read_text())["step"]
    assert step > 0
    model, _ = checkpoint.load_model(last)
    assert model.num_params() > 0
    done = _cli(["train", TINY, "--resume", "runs/s", "--no-progress", "--set", f"data.data_dir={data_dir}",
                 "--set", f"train.max_iters={step + 10}", "--set", "train.eval_interval=100000"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"trained to step {step + 10}" in done.stdout


@pytest.mark.parametrize("point", ["weights", "swap"])
def test_kill_during_checkpoint_write_keeps_the_previous_one(data_dir, tmp_path, point):
    """SIGKILL inside the 2nd write of checkpoints/last: the 1st stays loadable and resumable."""
    args = ["train", TINY, "--run-name", "k", "--no-progress", "--set", f"data.data_dir={data_dir}",
            "--set", "train.max_iters=40", "--set", "train.eval_interval=20"]
    killed = _cli(args, {"MINIGPT_TEST_KILL_DURING_SAVE": f"last:2:{point}"}, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    last = tmp_path / "runs" / "k" / "checkpoints" / "last"
    survivor = runs.resolve(last)
    assert json.loads((survivor / "meta.json").read_text())["step"] == 0
    model, _ = checkpoint.load_model(last)
    assert model.wte.weight.isfinite().all()
    assert list(last.parent.glob(".last.tmp-*"))  # the killed save's temporary folder
    resume = ["train", TINY, "--resume", "runs/k", "--no-progress", "--set", f"data.data_dir={data_dir}",
              "--set", "train.max_iters=40", "--set", "train.eval_interval=20"]
    if point == "swap":
        # Killed again inside the next swap, while .last.old is the only complete copy: it must survive.
        again = _cli(resume, {"MINIGPT_TEST_KILL_DURING_SAVE": "last:1:swap"}, cwd=tmp_path)
        assert again.returncode == -signal.SIGKILL
        assert runs.read_meta(last)["step"] == 0
    resumed = _cli(resume, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((last / "meta.json").read_text())["step"] == 40
    assert not list(last.parent.glob(".*.tmp-*"))  # swept on resume


def test_truncated_weights_are_refused(data_dir, tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=5"), run_name="t", echo=lambda m: None, progress=False)
    w = tmp_path / "runs" / "t" / "checkpoints" / "last" / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(MinigptError, match="model.safetensors.*corrupt or truncated"):
        checkpoint.load_model(w.parent)
    res = cli("train", TINY, "--resume", "runs/t", "--set", f"data.data_dir={data_dir}", "--no-progress")
    assert_user_error(res, "model.safetensors", "corrupt")


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_a_pickle_that_runs_code_is_refused_and_not_run(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=5"), run_name="p", echo=lambda m: None, progress=False)
    marker = tmp_path / "pwned"
    _Evil.marker = marker
    state = tmp_path / "runs" / "p" / "checkpoints" / "last" / "trainer_state.pt"
    torch.save({"step": 1, "payload": _Evil()}, state)
    with pytest.raises(MinigptError, match="trainer_state.pt.*unsafe"):
        checkpoint.load_trainer_state(state.parent)
    assert not marker.exists()
    with pytest.raises(MinigptError, match="trainer_state.pt"):
        train(tiny(data_dir, "train.max_iters=5"), echo=lambda m: None, progress=False, resume="runs/p")
    assert not marker.exists()
    assert pickle  # the module the attack would use


def test_gradient_accumulation_equals_one_big_batch():
    """4 micro-batches of 8 give the same update as one batch of 32 (to 1e-5).

    Plain SGD with lr 1 makes the update the gradient itself (Adam's first step,
    ~lr·sign(g), would magnify rounding noise in near-zero gradients).
    """
    cfg = load_config(TINY).model.model_copy(update={"vocab_size": 65})
    torch.manual_seed(0)
    x = torch.randint(0, 65, (32, 32))
    y = torch.randint(0, 65, (32, 32))
    results = []
    for accum, chunks in ((1, [(x, y)]), (4, [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)])):
        torch.manual_seed(1)
        model = GPT(cfg)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        params = list(model.parameters())
        loss, applied = train_step(model, opt, iter(chunks), accum, torch.autocast("cpu", enabled=False),
                                   scaler, 1.0, params)
        assert applied
        results.append((loss.item(), [p.detach().clone() for p in model.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
    moved = sum((a - b).abs().sum() for a, b in zip(results[0][1], before))
    assert moved > 1e-3  # the step did change the weights


def _nan_forward(bad_calls):
    real = GPT.forward
    count = {"n": 0}

    def forward(self, idx, targets=None, *a, **k):
        logits, loss = real(self, idx, targets, *a, **k)
        if targets is not None and self.training:
            count["n"] += 1
            if count["n"] in bad_calls:
                loss = loss * float("nan")
        return logits, loss

    return forward


def test_one_nan_skips_the_step(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(GPT, "forward", _nan_forward({7}))
    res = train(tiny(data_dir, "train.max_iters=20"), run_name="n", echo=lambda m: None, progress=False)
    assert res.step == 20 and math.isfinite(res.val_loss)
    log = (tmp_path / "runs" / "n" / "train.log").read_text()
    assert "non-finite" in log and "step skipped" in log
    w = load_file(tmp_path / "runs" / "n" / "checkpoints" / "last" / "model.safetensors")
    assert all(t.isfinite().all() for t in w.values())


def test_repeated_nans_stop_the_run_cleanly(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(GPT, "forward", _nan_forward(set(range(12, 1000))))
    with pytest.raises(MinigptError, match=r"not finite for 5 steps in a row at step 12.*learning_rate"):
        train(tiny(data_dir, "train.max_iters=40"), run_name="n", echo=lambda m: None, progress=False)
    last = tmp_path / "runs" / "n" / "checkpoints" / "last"
    model, _ = checkpoint.load_model(last)
    assert all(p.isfinite().all() for p in model.parameters())


def test_a_model_that_overflows_as_initialised_is_told_apart_from_a_high_learning_rate(data_dir, tmp_path,
                                                                                         monkeypatch):
    """NaN from the first step on: no update happened, so the fix is the init, not the learning rate; the
    eval sample says why there is none instead of sampling from NaN."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MinigptError, match=r"first 5 steps, before any update.*model.init_std \(now 1e\+10\)") as e:
        train(tiny(data_dir, "train.max_iters=40", "model.init_std=1e10", "train.sample_tokens=20"),
              run_name="o", echo=lambda m: None, progress=False)
    assert "learning_rate" not in str(e.value)
    assert "(no sample: the model's output is NaN" in (tmp_path / "runs" / "o" / "samples.txt").read_text()
    from minigpt_cli.sampling import sample_next

    with pytest.raises(MinigptError, match="output is NaN"):
        sample_next(torch.tensor([[0.0, float("nan")]]), 0.0, None, None, None)


def test_early_stopping_and_kept_checkpoints(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # A learning rate of ~0 after warmup: val loss stops improving, patience 2 ends the run.
    cfg = tiny(data_dir, "train.max_iters=200", "train.eval_interval=10", "train.early_stop_patience=2",
               "train.learning_rate=1e-9", "train.min_lr=0", "train.warmup_iters=0", "train.keep_every=10")
    res = train(cfg, run_name="e", echo=lambda m: None, progress=False)
    assert res.stopped_early and res.step < 200
    ckpts = tmp_path / "runs" / "e" / "checkpoints"
    assert (ckpts / "best").is_dir() and (ckpts / "last").is_dir()
    assert (ckpts / "step-0000010" / "model.safetensors").is_file()
    assert "early stopping" in (tmp_path / "runs" / "e" / "train.log").read_text()


def test_dry_run_prints_config_and_schedule(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("train", TINY, "--dry-run", "--set", "train.lr_schedule=linear")
    assert res.exit_code == 0, res
    assert "lr_schedule: linear" in res.stdout and "step       0: 5.000e-04" in res.stdout
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
    # The null keys, resolved: no tokenizer yet, so the vocabulary waits for it.
    assert "model.vocab_size      from the tokenizer, trained into data/tinyshakespeare/tokenizer-char.json" \
        in res.stdout
    assert "model.d_ff            128\n" in res.stdout and "model.n_kv_head       2\n" in res.stdout
    assert "sample.window_stride  8\n" in res.stdout and "parameters" not in res.stdout
    assert '  prompt: "\\n"\n' in res.stdout  # one line, as typed in a config
    # Once the tokenizer exists: its size, the parameter count and the memory estimate.
    from minigpt_cli.tokenizer import CharTokenizer

    path = tmp_path / "data" / "tinyshakespeare" / "tokenizer-char.json"
    CharTokenizer.train("ab\ncd").save(path)
    res = cli("train", TINY, "--dry-run", "--set", "model.d_ff=100")
    assert f"model.vocab_size      5 (from {path.relative_to(tmp_path)})" in res.stdout, res.stdout
    assert "model.d_ff            100 (set)" in res.stdout
    n = GPT(load_config(TINY, ["model.vocab_size=5", "model.d_ff=100"]).model).num_params()
    assert f"parameters            {n:,}\n" in res.stdout and "memory to train       about " in res.stdout


def test_missing_device_is_a_clear_error(cli, tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("train", TINY, "--set", "device=cuda"), "device: cuda", "no CUDA")
    assert not (tmp_path / "runs").exists()


def test_two_process_ddp_matches_one_process(data_dir, tmp_path):
    """torchrun, 2 gloo processes × batch 4 == 1 process × batch 8 (same global batch): losses to 1e-4."""
    common = ["--no-progress", "--set", f"data.data_dir={data_dir}", "--set", "train.max_iters=20",
              "--set", "train.eval_interval=10", "--set", "train.log_interval=1", "--set", "train.sample_tokens=0"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "-m", "minigpt_cli", "train", str(TINY), "--run-name", "ddp", "--set", "train.batch_size=4", *common]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(torchrun, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("trained to step 20") == 1  # rank 0 reports for both
    single = _cli(["train", TINY, "--run-name", "one", "--set", "train.batch_size=8", *common], cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["ddp", "one"]  # one folder per run
    a, b = curve(tmp_path / "runs" / "ddp"), curve(tmp_path / "runs" / "one")
    assert a.keys() == b.keys() and len(a) == 23
    for k in a:
        assert abs(a[k] - b[k]) < 1e-4, (k, a[k], b[k])
    assert "world 2" in (tmp_path / "runs" / "ddp" / "train.log").read_text()


def test_compile_failure_falls_back_with_a_warning(data_dir, tmp_path, monkeypatch):
    """torch.compile fails lazily on some platforms: the run warns once and trains eagerly."""
    monkeypatch.chdir(tmp_path)

    class Broken(torch.nn.Module):
        def forward(self, *a, **k):
            raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch, "compile", lambda model, **k: Broken())
    notes = []
    # n_embd 128: in eager mode the linear layers run on oneDNN (x86), which env.json must then say.
    res = train(tiny(data_dir, "train.max_iters=10", "compile=true", "model.n_embd=128"), run_name="c",
                echo=notes.append, progress=False)
    assert res.step == 10 and math.isfinite(res.val_loss)
    assert sum("torch.compile failed" in n for n in notes) == 1
    keys = load_file(tmp_path / "runs" / "c" / "checkpoints" / "last" / "model.safetensors").keys()
    assert not any(k.startswith("_orig_mod.") for k in keys)
    from minigpt_cli.kernels.onednn import available as onednn_enabled

    env = json.loads((tmp_path / "runs" / "c" / "env.json").read_text())
    assert env["linear_kernel"] == ("oneDNN" if onednn_enabled() else "torch.mm")
    # bench falls back the same way, and says what it measured.
    from minigpt_cli.bench import bench

    bench_notes = []
    r = bench(tiny(data_dir, "compile=true", "model.n_embd=128"), iters=1, generation=False,
              echo=bench_notes.append)
    assert r["compile"] is False and r["linear_kernel"] == env["linear_kernel"]
    assert sum("torch.compile failed" in n for n in bench_notes) == 1


def test_loading_tolerates_a_compile_prefix(data_dir, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="p", echo=lambda m: None, progress=False)
    w = tmp_path / "runs" / "p" / "checkpoints" / "last" / "model.safetensors"
    sd = load_file(w)
    save_file({f"_orig_mod.{k}": v for k, v in sd.items()}, str(w))
    model, _ = checkpoint.load_model(w.parent)
    assert torch.equal(model.wte.weight, sd["wte.weight"])


def test_bfloat16_autocast_runs_on_cpu(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = train(tiny(data_dir, "train.max_iters=20", "dtype=bfloat16"), run_name="b", echo=lambda m: None,
                progress=False)
    assert math.isfinite(res.val_loss) and res.val_loss < math.log(65)
    env = json.loads((tmp_path / "runs" / "b" / "env.json").read_text())
    assert env["dtype"] == "bfloat16"


def test_tensorboard_without_the_package_is_a_clear_error(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        import tensorboard  # noqa: F401
        pytest.skip("tensorboard is installed here")
    except ImportError:
        pass
    res = cli("train", TINY, "--set", "train.tensorboard=true", "--set", f"data.data_dir={data_dir}")
    assert_user_error(res, "tensorboard", "pip install tensorboard")
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile's CPU backend needs a C++ compiler")
def test_compile_trains_like_eager_on_cpu(data_dir, tmp_path, monkeypatch):
    """The GPU recipe's compile path, run for real on the CPU: the same losses as eager, no fallback."""
    monkeypatch.chdir(tmp_path)
    notes: list[str] = []
    runs = {}
    for flag in ("false", "true"):
        # n_embd 64: c_fc and the MLP's c_proj (256 tokens x 64 x 256) are big enough for oneDNN in eager mode.
        res = train(tiny(data_dir, "train.max_iters=10", "train.eval_interval=10", f"compile={flag}",
                         "model.n_embd=64"),
                    run_name=f"c{flag}", echo=notes.append, progress=False)
        runs[flag] = curve(res.run_dir)
    from minigpt_cli.kernels.onednn import available as onednn_enabled

    assert not [n for n in notes if "compile" in n and "oneDNN" not in n], notes  # no fallback
    # On x86 the compiled run says that eager would put (some of) tiny's linear layers on the faster oneDNN,
    # and env.json names the kernel the compiled step really uses.
    assert sum("oneDNN" in n for n in notes) == int(onednn_enabled()), notes
    envs = {flag: json.loads((tmp_path / "runs" / f"c{flag}" / "env.json").read_text()) for flag in runs}
    assert envs["true"]["linear_kernel"] == "torch.mm"
    assert envs["false"]["linear_kernel"] == ("oneDNN+torch.mm" if onednn_enabled() else "torch.mm")
    assert runs["true"].keys() == runs["false"].keys() and len(runs["true"]) >= 12
    for key, value in runs["false"].items():
        assert runs["true"][key] == pytest.approx(value, abs=2e-4), key


def test_sigint_during_the_eval_sample_stops_it_at_once(data_dir, tmp_path, monkeypatch):
    """Ctrl-C while samples.txt's text is generated: the sample ends at the next token, not after 400."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=60", "train.sample_tokens=400")
    # The step-0 eval makes 5 train + 5 val forwards; the sample's forwards follow (one per token).
    forward, count = _counting_eval_forward(lambda n: n == 15 and os.kill(os.getpid(), signal.SIGINT))
    monkeypatch.setattr(GPT, "forward", forward)
    with pytest.raises(Interrupted, match="stopped by SIGINT at step 0"):
        train(cfg, run_name="sm", echo=lambda m: None, progress=False)
    assert count["n"] == 15  # no forward after the one that saw the signal
    samples = (tmp_path / "runs" / "sm" / "samples.txt").read_text()
    assert "step 0" in samples
