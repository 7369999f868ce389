"""The training engine under stress: resume, interruption, kills mid-write, accumulation, NaNs
(several processes and machines: test_distributed.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY, assert_user_error, curve, records, tiny, working_dir
from safetensors.torch import load_file

from minigpt_cli.errors import Interrupted, MinigptError
from minigpt_cli.model.gpt import GPT
from minigpt_cli.run import checkpoint
from minigpt_cli.trainer import train


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
    """The uninterrupted tiny run (120 steps) every resumed run is compared with.

    It keeps its step-40 checkpoint (train.keep_every=40) for the resume from an older checkpoint;
    the runs compared with it keep none, which changes nothing they compute.
    """
    work = tmp_path_factory.mktemp("ref")
    with working_dir(work):
        cfg = tiny(data_dir, "train.max_iters=120", "model.dropout=0.1", "train.keep_every=40")
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


def test_interrupted_and_resumed_equals_uninterrupted(
    reference_run, data_dir, tmp_path, monkeypatch
):
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
    assert (
        meta["step"] == 57 and meta["eval_step"] == 40
    )  # the losses it carries are step 40's (eval_interval 20)
    assert meta["val_loss"] == curve(run)[("eval", 40)]
    assert max(r["step"] for r in records(run)) == 57
    result = train(cfg, echo=lambda m: None, progress=False, resume=str(run))
    assert result.run_dir == run and result.step == 120
    assert_same_run(reference_run, run)


def test_a_bfloat16_run_with_dropout_resumes_bit_exact(data_dir, tmp_path, monkeypatch):
    """Under bfloat16 the attention with dropout runs in bfloat16 where the CPU has bfloat16 units
    (taken here on any CPU): its masks come from the same saved generator, so a run stopped by
    SIGINT and resumed computes every later loss and weight exactly as the uninterrupted one."""
    from minigpt_cli.runtime.kernels import dropout as fast

    monkeypatch.setattr(fast, "multiplies_bfloat16", lambda: True)
    kernel, dtypes = fast.causal_attention, set()

    def causal_attention(q, k, v, masks):
        dtypes.add(q.dtype)
        return kernel(q, k, v, masks)

    monkeypatch.setattr(fast, "causal_attention", causal_attention)
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=60", "model.dropout=0.1", "dtype=bfloat16")
    train(cfg, run_name="whole", echo=lambda m: None, progress=False)
    assert dtypes == {torch.bfloat16}
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 23, signal.SIGINT)
    with pytest.raises(Interrupted, match="step 23"):
        train(cfg, run_name="r", echo=lambda m: None, progress=False)
    monkeypatch.setattr(T, "train_step", real_step)
    train(cfg, echo=lambda m: None, progress=False, resume="runs/r")
    assert_same_run(tmp_path / "runs" / "whole", tmp_path / "runs" / "r", tol=0.0)


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


def test_sigint_during_a_long_eval_stops_it_at_once_and_resumes_identically(
    reference_run, data_dir, tmp_path, monkeypatch
):
    """Ctrl-C inside the step-40 eval: no further eval batch runs, last is saved, the resume
    matches."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=120", "model.dropout=0.1")
    # Evals at steps 0 and 20 make 2 x (5 train + 5 val) eval forwards; call 23 is the step-40
    # eval's third.
    forward, count = _counting_eval_forward(
        lambda n: n == 23 and os.kill(os.getpid(), signal.SIGINT)
    )
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


def test_a_second_ctrl_c_aborts_without_saving_and_says_where_the_last_checkpoint_is(
    data_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(
        monkeypatch, 25, signal.SIGINT, signal.SIGINT
    )  # the second one aborts
    with pytest.raises(
        Interrupted,
        match=r"second Ctrl-C without saving; the last checkpoint is "
        r"runs/a/checkpoints/last \(step 20\)",
    ) as info:
        train(
            tiny(data_dir, "train.max_iters=60"), run_name="a", echo=lambda m: None, progress=False
        )
    assert info.value.exit_code == 130 and str(info.value.resume_dir) == "runs/a"
    assert (
        json.loads((tmp_path / "runs" / "a" / "checkpoints" / "last" / "meta.json").read_text())[
            "step"
        ]
        == 20
    )
    # Before any checkpoint exists (inside the step-0 eval), the message says so and the new folder
    # goes.
    monkeypatch.setattr(T, "train_step", real_step)

    def two_signals(n):
        if n == 2:
            try:
                os.kill(os.getpid(), signal.SIGINT)  # cuts the eval short at once
            finally:
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(GPT, "forward", _counting_eval_forward(two_signals)[0])
    with pytest.raises(Interrupted, match="without saving; no checkpoint had been written yet"):
        train(
            tiny(data_dir, "train.max_iters=60"), run_name="b", echo=lambda m: None, progress=False
        )
    assert not (tmp_path / "runs" / "b").exists()


def test_sigterm_inside_one_long_eval_batch_stops_it_without_waiting_for_the_batch(
    data_dir, tmp_path, monkeypatch
):
    """One eval forward that would take minutes (block_size 100000): a SIGTERM inside it stops the
    run there."""
    monkeypatch.chdir(tmp_path)
    real, finished = GPT.forward, []

    def slow_eval_forward(self, *a, **k):
        if not self.training:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # the forward's remaining operations
                time.sleep(0.02)
            finished.append(True)
        return real(self, *a, **k)

    monkeypatch.setattr(GPT, "forward", slow_eval_forward)
    with pytest.raises(Interrupted, match="stopped by SIGTERM at step 0") as info:
        train(
            tiny(data_dir, "train.max_iters=5"),
            run_name="long",
            echo=lambda m: None,
            progress=False,
        )
    assert info.value.exit_code == 143 and not finished
    assert (
        json.loads((tmp_path / "runs" / "long" / "checkpoints" / "last" / "meta.json").read_text())[
            "step"
        ]
        == 0
    )


def test_sigterm_exits_143_and_the_hint_is_a_working_command(cli, data_dir, tmp_path, monkeypatch):
    """SIGTERM: status 143 (128+15), and the printed resume command (real config path, --set values)
    runs."""
    monkeypatch.chdir(tmp_path)
    import minigpt_cli.trainer.loop as T

    real_step = signals_after_step(monkeypatch, 3, signal.SIGTERM)
    res = cli(
        "train",
        TINY,
        "--run-name",
        "t",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=8",
        "--set",
        "train.sample_tokens=0",
    )
    assert res.exit_code == 143, res
    # A stop the user asked for is not reported as an error: one line saying what was saved.
    assert "error:" not in res.stderr, res
    lines = [
        l for l in res.stderr.splitlines() if l.startswith("stopped by SIGTERM at step 3; saved ")
    ]
    assert len(lines) == 1, res
    hint = lines[0].split("continue with: ", 1)[1]
    assert hint.startswith(f"minigpt train {TINY} --set ") and "CONFIG" not in hint
    monkeypatch.setattr(T, "train_step", real_step)
    args = shlex.split(hint)
    assert args[:2] == ["minigpt", "train"]
    done = cli(*args[1:], "--no-progress")
    assert done.exit_code == 0, done
    assert "trained to step 8" in done.stdout


def test_resume_from_an_older_checkpoint_rewinds_the_metrics(
    reference_run, data_dir, tmp_path, monkeypatch
):
    """Lose the tail of a run (as after a SIGKILL): resuming from the step-40 checkpoint repeats it
    exactly."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "k"
    shutil.copytree(reference_run, run)
    # Re-create the state of a run killed at step ~70 whose last checkpoint is the eval at step 40.
    cfg = tiny(data_dir, "train.max_iters=120", "model.dropout=0.1", "train.keep_every=40")
    src = run / "checkpoints" / "step-0000040"  # kept by the reference run itself
    assert json.loads((src / "meta.json").read_text())["step"] == 40
    shutil.rmtree(run / "checkpoints" / "last")
    shutil.copytree(src, run / "checkpoints" / "last")
    result = train(cfg, echo=lambda m: None, progress=False, resume=str(run))
    assert result.step == 120
    assert_same_run(reference_run, run)


def _digests(folder: Path) -> dict[str, str]:
    import hashlib

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_resume_from_a_kept_checkpoint_folder_continues_in_a_new_run_folder(
    cli, reference_run, data_dir, tmp_path, monkeypatch
):
    """A cool-down from a kept checkpoint: --resume RUN/checkpoints/step-0000040 trains a new run
    folder from step 40 on, with the losses and weights of the uninterrupted run, says where it
    went, and leaves RUN as it was; the dry run says the same, and --run-name names the new
    folder."""
    monkeypatch.chdir(tmp_path)
    ckpt = reference_run / "checkpoints" / "step-0000040"
    before = _digests(reference_run)
    common = ["--set", f"data.data_dir={data_dir}", "--set", f"train.out_dir={tmp_path}/runs"]
    for item in ("train.log_interval=1", "train.sample_tokens=0", "train.eval_interval=20"):
        common += ["--set", item]
    for item in ("train.max_iters=120", "model.dropout=0.1", "train.keep_every=40"):
        common += ["--set", item]
    dry = cli("train", TINY, *common, "--resume", ckpt, "--dry-run")
    assert dry.exit_code == 0, dry
    assert f"would continue {ckpt} from step 40 to train.max_iters 120 in a new run folder" in (
        dry.stdout
    ), dry
    res = cli("train", TINY, *common, "--resume", ckpt, "--run-name", "cool", "--no-progress")
    assert res.exit_code == 0, res
    new = tmp_path / "runs" / "cool"
    assert f"continuing {ckpt} (step 40) in a new run folder {new}" in res.stderr, res
    assert f"run folder {new}" in res.stdout, res
    assert_same_run(
        reference_run, new
    )  # the metrics before step 40 are the run's, the rest trained
    assert _digests(reference_run) == before
    # Without a checkpoint folder, --run-name still cannot name a resumed run's folder.
    both = cli("train", TINY, *common, "--resume", reference_run, "--run-name", "x")
    assert_user_error(both, "pass either --resume or --run-name")


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
    fresh = train(
        tiny(data_dir, "train.max_iters=5", "name=nobody"),
        echo=notes.append,
        progress=False,
        resume="auto",
    )
    assert fresh.step == 5 and any("starting a new one" in n for n in notes)


def test_resume_without_the_runs_tokenizer_says_where_it_came_from(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=4"), run_name="t", echo=lambda m: None, progress=False)
    (tmp_path / "runs" / "t" / "tokenizer.json").unlink()
    with pytest.raises(
        MinigptError,
        match=r"not found; a run keeps the tokenizer it was trained with: copy it back "
        r"from .*tokenizer-char.json",
    ):
        train(
            tiny(data_dir, "train.max_iters=8"),
            echo=lambda m: None,
            progress=False,
            resume="runs/t",
        )
    # A damaged copy of the config in the checkpoint says which file and how to mend it.
    shutil.copy(tmp_path / "runs" / "t" / "config.yaml", tmp_path / "good.yaml")
    (tmp_path / "runs" / "t" / "checkpoints" / "last" / "config.yaml").write_text("name: null\n")
    with pytest.raises(
        MinigptError, match=r"the checkpoint's config is damaged .*restore .*last/config.yaml"
    ):
        train(
            tiny(data_dir, "train.max_iters=8"),
            echo=lambda m: None,
            progress=False,
            resume="runs/t",
        )


def test_resume_takes_the_runs_tokenizer_by_its_path_and_refuses_another(
    data_dir, tmp_path, monkeypatch
):
    """What the tokenizer error says to do works: tokenizer.path at the run's tokenizer.json
    resumes; another tokenizer is refused before anything is prepared with it, by the dry run as by
    train."""
    from minigpt_cli.tokenizer.kinds import CharTokenizer
    from minigpt_cli.trainer.setup import plan

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=4"), run_name="t", echo=lambda m: None, progress=False)
    own = tmp_path / "runs" / "t" / "tokenizer.json"
    res = train(
        tiny(data_dir, "train.max_iters=6", f"tokenizer.path={own}"),
        echo=lambda m: None,
        progress=False,
        resume="runs/t",
    )
    assert res.step == 6
    abc = CharTokenizer("abc")
    abc.save(tmp_path / "other.json")
    other = tiny(data_dir, "train.max_iters=8", f"tokenizer.path={tmp_path / 'other.json'}")
    refused = r"the tokenizer file the config names differs from runs/t/tokenizer.json; point tokenizer.path at"
    with pytest.raises(MinigptError, match=refused):
        plan(other, None, "runs/t", lambda m: None, False)  # the dry run's set-up
    with pytest.raises(MinigptError, match=refused):
        train(other, echo=lambda m: None, progress=False, resume="runs/t")
    assert not (
        data_dir / "tinyshakespeare" / f"char-{abc.fingerprint()}"
    ).exists()  # nothing prepared with it


def test_resume_refuses_a_different_model(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=5"), run_name="m", echo=lambda m: None, progress=False)
    with pytest.raises(
        MinigptError, match=r"model\.n_layer is 3 here but 2 in the checkpoint \(checkpoints/last/"
    ):
        train(
            tiny(data_dir, "train.max_iters=5", "model.n_layer=3"),
            echo=lambda m: None,
            progress=False,
            resume="runs/m",
        )


def test_resume_with_a_longer_schedule_says_how_the_learning_rate_changes(
    data_dir, tmp_path, monkeypatch
):
    """Raising max_iters is allowed; a note names the change and the lr the run jumps to, which it
    uses."""
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
    lr_11 = [
        r["lr"]
        for r in records(tmp_path / "runs" / "l")
        if r["event"] == "train" and r["step"] == 11
    ]
    assert lr_11 == [pytest.approx(new_lr)]
    assert "train.max_iters 10 -> 30" in (tmp_path / "runs" / "l" / "train.log").read_text()
    assert "max_iters: 30" in (tmp_path / "runs" / "l" / "config.yaml").read_text()


def test_resume_under_another_dropout_kernel_says_so(data_dir, tmp_path, monkeypatch):
    """MINIGPT_FAST_DROPOUT changed between sessions: the masks differ, so the run is no longer
    bit-exact; a note says it."""
    from minigpt_cli.trainer.setup import DROPOUT_CHANGED

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINIGPT_FAST_DROPOUT", "0")
    train(
        tiny(data_dir, "train.max_iters=4", "model.dropout=0.1"),
        run_name="d",
        echo=lambda m: None,
        progress=False,
    )
    monkeypatch.setenv("MINIGPT_FAST_DROPOUT", "1")
    notes = []
    train(
        tiny(data_dir, "train.max_iters=6", "model.dropout=0.1"),
        echo=notes.append,
        progress=False,
        resume="runs/d",
    )
    assert DROPOUT_CHANGED.format(before="torch", now="minigpt") in notes
    env = json.loads((tmp_path / "runs" / "d" / "env.json").read_text())
    assert (
        env["dropout_kernel"] == "minigpt"
        and env["earlier_sessions"][-1]["dropout_kernel"] == "torch"
    )
    notes = []
    train(
        tiny(data_dir, "train.max_iters=8", "model.dropout=0.1"),
        echo=notes.append,
        progress=False,
        resume="runs/d",
    )
    assert not any(
        "dropout masks" in n for n in notes
    )  # the same kernel as the last session: nothing to say


def test_continuing_a_finished_run_evaluates_like_the_uninterrupted_one(
    data_dir, tmp_path, monkeypatch
):
    """The finished run's final eval (step 30, off the eval_interval grid) draws no batches the
    later evals would have drawn: with a schedule that does not depend on max_iters, every later
    loss matches."""
    monkeypatch.chdir(tmp_path)
    const = ("train.lr_schedule=constant", "train.warmup_iters=0")
    train(
        tiny(data_dir, "train.max_iters=40", *const),
        run_name="whole",
        echo=lambda m: None,
        progress=False,
    )
    train(
        tiny(data_dir, "train.max_iters=30", *const),
        run_name="cont",
        echo=lambda m: None,
        progress=False,
    )
    train(
        tiny(data_dir, "train.max_iters=40", *const),
        echo=lambda m: None,
        progress=False,
        resume="runs/cont",
    )
    whole, cont = curve(tmp_path / "runs" / "whole"), curve(tmp_path / "runs" / "cont")
    assert ("eval", 30) in cont and ("eval", 30) not in whole
    del cont[("eval", 30)]
    assert cont.keys() == whole.keys()
    for k in whole:
        assert abs(whole[k] - cont[k]) <= 1e-6, (k, whole[k], cont[k])
    # env.json describes the latest session and keeps the one before.
    env = json.loads((tmp_path / "runs" / "cont" / "env.json").read_text())
    assert [set(e) for e in env["earlier_sessions"]] == [set(env) - {"earlier_sessions"}]
    assert "earlier_sessions" not in json.loads(
        (tmp_path / "runs" / "whole" / "env.json").read_text()
    )


def test_resuming_a_finished_run_trains_nothing_and_says_how_to_go_on(
    cli, data_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=10"), run_name="f", echo=lambda m: None, progress=False)
    before = (tmp_path / "runs" / "f" / "metrics.jsonl").read_bytes()
    # --dry-run with --resume says what the resume would do, and does nothing.
    dry = ["train", TINY, "--dry-run", "--set", f"data.data_dir={data_dir}"]
    res = cli(*dry, "--resume", "runs/f", "--set", "train.max_iters=10")
    assert (
        res.exit_code == 0
        and "runs/f is at step 10, train.max_iters is 10: nothing would be trained" in res.stdout
    )
    res = cli(*dry, "--resume", "runs/f", "--set", "train.max_iters=30")
    assert res.exit_code == 0, res
    assert "would continue runs/f from step 10 to train.max_iters 30" in res.stdout
    assert "note: resuming with train.max_iters 10 -> 30" in res.stdout
    res = cli(*dry, "--resume", "auto", "--set", "name=nosuch")
    assert (
        res.exit_code == 0
        and "no run named 'nosuch' under runs/ yet; a new run would start" in res.stdout
    )
    assert_user_error(
        cli(*dry, "--resume", "runs/f", "--set", "model.n_layer=3"),
        "model.n_layer is 3 here but 2 in the checkpoint",
    )
    assert (tmp_path / "runs" / "f" / "metrics.jsonl").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["f"]
    res = cli(
        "train",
        TINY,
        "--resume",
        "runs/f",
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=10",
    )
    assert res.exit_code == 0, res
    assert "runs/f already reached train.max_iters=10; nothing was trained" in res.stdout, res
    assert "--set train.max_iters=20" in res.stdout and "n/a" not in res.stdout
    assert (tmp_path / "runs" / "f" / "metrics.jsonl").read_bytes() == before


def test_resume_sweeps_temporary_files_a_kill_left(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="w", echo=lambda m: None, progress=False)
    run = tmp_path / "runs" / "w"
    junk = [run / "checkpoints" / ".last.tmp-abc123", run / "checkpoints" / ".best.tmp-xyz"]
    for j in junk:
        j.mkdir()
        (j / "model.safetensors").write_bytes(b"half")
    (run / ".metrics.q1w2e3.jsonl").write_text("{}\n")
    res = train(
        tiny(data_dir, "train.max_iters=5"), resume="runs/w", echo=lambda m: None, progress=False
    )
    assert res.step == 5
    assert not any(j.exists() for j in junk) and not (run / ".metrics.q1w2e3.jsonl").exists()
    assert "removed 3 temporary file(s)" in (run / "train.log").read_text()


def test_sigint_through_the_cli_leaves_a_resumable_checkpoint(cli, data_dir, tmp_path, monkeypatch):
    args = [
        "train",
        TINY,
        "--run-name",
        "s",
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=100000",
        "--set",
        "train.eval_interval=100000",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "minigpt_cli", *map(str, args)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "runs" / "s" / "metrics.jsonl"
    # Until a few steps are logged or the process ends; the deadline only ends a hang (10x slowness
    # holds).
    deadline = time.monotonic() + 600
    while (
        time.monotonic() < deadline
        and proc.poll() is None
        and not (metrics.is_file() and len(metrics.read_text().splitlines()) > 3)
    ):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "--resume runs/s" in err and "Traceback" not in err
    last = tmp_path / "runs" / "s" / "checkpoints" / "last"
    step = json.loads((last / "meta.json").read_text())["step"]
    assert step > 0
    model, _ = checkpoint.load_model(last)
    assert model.num_params() > 0
    monkeypatch.chdir(tmp_path)
    done = cli(
        "train",
        TINY,
        "--resume",
        "runs/s",
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"train.max_iters={step + 10}",
        "--set",
        "train.eval_interval=100000",
    )
    assert done.exit_code == 0, done
    assert f"trained to step {step + 10}" in done.stdout


def test_sigint_during_the_eval_sample_stops_it_at_once(data_dir, tmp_path, monkeypatch):
    """Ctrl-C while samples.txt's text is generated: the sample ends at the next token, not after
    400."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=60", "train.sample_tokens=400")
    # The step-0 eval makes 5 train + 5 val forwards; the sample's forwards follow (one per token).
    forward, count = _counting_eval_forward(
        lambda n: n == 15 and os.kill(os.getpid(), signal.SIGINT)
    )
    monkeypatch.setattr(GPT, "forward", forward)
    with pytest.raises(Interrupted, match="stopped by SIGINT at step 0"):
        train(cfg, run_name="sm", echo=lambda m: None, progress=False)
    assert count["n"] == 15  # no forward after the one that saw the signal
    samples = (tmp_path / "runs" / "sm" / "samples.txt").read_text()
    assert "step 0" in samples


def test_resume_auto_continues_a_run_of_the_same_corpus_only(data_dir, tmp_path, monkeypatch):
    """Own text with --resume auto, beside a Shakespeare run of the same config name: a new run, not
    a refusal of the Shakespeare run (the README says "else a new run")."""
    monkeypatch.chdir(tmp_path)
    train(
        tiny(data_dir, "train.max_iters=4", "name=same"),
        run_name="plays",
        echo=lambda m: None,
        progress=False,
    )
    book = tmp_path / "book.txt"
    book.write_text((data_dir / "tinyshakespeare" / "input.txt").read_text()[:100_000])
    notes = []
    own = train(
        tiny(data_dir, "train.max_iters=4", "name=same", f"data.path={book}"),
        echo=notes.append,
        progress=False,
        resume="auto",
    )
    assert (
        own.run_dir.name != "plays"
        and own.step == 4
        and any("starting a new one" in n for n in notes)
    )
    again = train(
        tiny(data_dir, "train.max_iters=6", "name=same", f"data.path={book}"),
        echo=lambda m: None,
        progress=False,
        resume="auto",
    )
    assert again.run_dir == own.run_dir and again.step == 6  # its own corpus's run: continued


def test_a_resume_says_each_key_it_changes_and_the_run_keeps_them(
    cli, data_dir, tmp_path, monkeypatch
):
    """train.batch_size, grad_accum_steps, eval_iters and seed changed on a resume: one note per
    key, old -> new, in --dry-run, on stderr and in train.log, and env.json keeps them per
    session."""
    monkeypatch.chdir(tmp_path)
    train(
        tiny(data_dir, "train.max_iters=2", "train.eval_interval=2"),
        run_name="r",
        echo=lambda m: None,
        progress=False,
    )
    run = tmp_path / "runs" / "r"
    old = tiny(data_dir, "train.max_iters=2")
    changed = ["train.batch_size=4", "train.grad_accum_steps=2", "train.eval_iters=3", "seed=7"]
    args = [
        "train",
        TINY,
        "--resume",
        str(run),
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=4",
        "--set",
        "train.eval_interval=2",
        *[w for c in changed for w in ("--set", c)],
    ]
    dry = cli(*args, "--dry-run")
    real = cli(*args)
    assert dry.exit_code == 0 and real.exit_code == 0, (dry, real)
    expected = [
        f"note: --resume changes train.batch_size: {old.train.batch_size!r} -> 4",
        f"note: --resume changes train.grad_accum_steps: {old.train.grad_accum_steps!r} -> 2",
        f"note: --resume changes train.eval_iters: {old.train.eval_iters!r} -> 3",
        f"note: --resume changes seed: {old.seed!r} -> 7",
    ]
    for line in expected:
        assert line in dry.stdout, dry
        assert line in real.stderr, real
        assert line.removeprefix("note: ") in (run / "train.log").read_text()
    env = json.loads((run / "env.json").read_text())
    keys = (
        "seed",
        "train.batch_size",
        "train.grad_accum_steps",
        "train.eval_iters",
    )  # tiny() differs in more
    assert {k: env["config_changes"][k] for k in keys} == {
        "seed": [old.seed, 7],
        "train.batch_size": [old.train.batch_size, 4],
        "train.grad_accum_steps": [old.train.grad_accum_steps, 2],
        "train.eval_iters": [old.train.eval_iters, 3],
    }


def test_a_resume_that_changes_an_optimizer_setting_trains_with_the_new_value(data_dir, tmp_path):
    """torch.optim's load_state_dict takes each group's hyperparameters from the checkpoint; a
    resume that changes Muon's momentum and Newton-Schulz steps, AdamW's beta2 and the weight decay
    (its note says so) trains with the new values, and saves them."""
    muon = ["train.optimizer=muon", "train.eval_interval=2"]
    with working_dir(tmp_path):
        train(
            tiny(data_dir, "train.max_iters=2", *muon),
            run_name="r",
            echo=lambda m: None,
            progress=False,
        )
        changed = [
            "train.muon.momentum=0.8",
            "train.muon.ns_steps=3",
            "train.muon.weight_decay=0.05",
            "train.beta2=0.9",
            "train.weight_decay=0.02",
        ]
        notes: list[str] = []
        train(
            tiny(data_dir, "train.max_iters=4", *muon, *changed),
            echo=notes.append,
            progress=False,
            resume=str(tmp_path / "runs" / "r"),
        )
    assert any("--resume changes train.muon.momentum: 0.95 -> 0.8" in n for n in notes), notes
    groups = checkpoint.load_trainer_state(tmp_path / "runs" / "r" / "checkpoints" / "last")[
        "optimizer"
    ]["param_groups"]
    muon_groups = [g for g in groups if "ns_steps" in g]
    adamw_groups = [g for g in groups if "betas" in g]
    assert muon_groups and adamw_groups
    assert {(g["momentum"], g["ns_steps"], g["weight_decay"]) for g in muon_groups} == {
        (0.8, 3, 0.05)
    }
    assert {tuple(g["betas"]) for g in adamw_groups} == {(0.9, 0.9)}
    assert {g["weight_decay"] for g in adamw_groups} == {0.02, 0.0}  # matrices, then vectors
