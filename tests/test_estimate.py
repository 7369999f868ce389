"""The run's time estimate: the evals left, the rough figure from eval batches, the measured one
from steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from minigpt_cli.config.schema import TrainConfig, load_config
from minigpt_cli.trainer.estimate import (
    CPU_RECIPE,
    MEASURED_STEPS,
    TimeEstimate,
    evals_left,
    human_seconds,
)
from minigpt_cli.trainer.schedule import should_eval


@pytest.mark.parametrize(
    "max_iters,interval,at_start",
    [
        (5000, 250, True),
        (30, 15, True),
        (31, 15, True),
        (7, 10, True),
        (0, 5, True),
        (20, 10, False),
        (25, 10, False),
    ],
)
def test_evals_left_counts_the_schedules_eval_points(max_iters, interval, at_start):
    tc = TrainConfig(
        max_iters=max_iters, eval_interval=interval, eval_at_start=at_start, warmup_iters=0
    )
    for step in sorted({0, 1, interval, interval + 1, max_iters // 2, max_iters, max_iters + 1}):
        for evaluated in (False, True):
            expected = sum(should_eval(s, tc) for s in range(step, max_iters + 1))
            if evaluated and step <= max_iters and should_eval(step, tc):
                expected -= 1
            assert evals_left(tc, step, evaluated) == expected, (step, evaluated)


def test_human_seconds():
    assert [human_seconds(s) for s in (40, 720, 7.2 * 3600)] == ["40 s", "12 min", "7.2 h"]


def estimate(tc, on_cpu=True):
    said, logged = [], []
    return (
        TimeEstimate(
            tc,
            0,
            False,
            batches_per_eval=2 * tc.eval_iters,
            on_cpu=on_cpu,
            say=said.append,
            log=logged.append,
        ),
        said,
        logged,
    )


def test_the_cpu_user_of_the_gpu_recipe_is_told_within_seconds():
    """shakespeare.yaml on a CPU: 400 eval batches at ~1.15 s, 5,000 steps; about 7 h, said during
    the first eval."""
    tc = TrainConfig(max_iters=5000, eval_interval=250, eval_iters=200)
    est, said, logged = estimate(tc)
    for done in range(1, 5):
        est.eval_batch(
            done, 1.15 * done + 3.0
        )  # the first batch pays 3 s of warm-up: left out of the rate
    # 21 evals x 400 batches x 1.15 s + 5,000 steps x 3 x 1.15 s = 9,660 + 17,250 s
    assert (
        said[0] == f"note: about {human_seconds(9660 + 17250)} to go (from the first eval batches)"
    )
    assert said[1] == CPU_RECIPE and len(logged) == 2
    for step in range(1, MEASURED_STEPS + 2):
        est.step_done(step, 9.0 if step == 1 else 4.0)  # the first step pays for warm-up: left out
    left = (5000 - MEASURED_STEPS - 1) * 4.0 + 20 * 400 * 1.15
    assert said[2].startswith(
        f"note: about {human_seconds(left)} to go (4,994 steps at 4 s and 20 evals at"
    )
    assert said.count(CPU_RECIPE) == 1  # said once


def test_a_short_run_is_only_logged():
    tc = TrainConfig(max_iters=30, eval_interval=15, eval_iters=5, warmup_iters=0)
    est, said, logged = estimate(tc)
    for done in range(1, 5):
        est.eval_batch(done, 0.01 * done)
    for step in range(1, 8):
        est.step_done(step, 0.02)
    assert said == [] and len(logged) == 2 and all("to go" in line for line in logged)


def test_a_long_gpu_run_gets_no_cpu_recipe():
    tc = TrainConfig(max_iters=100_000, eval_interval=1000, eval_iters=200)
    est, said, _ = estimate(tc, on_cpu=False)
    for done in range(1, 5):
        est.eval_batch(done, 0.1 * done)
    assert len(said) == 1 and CPU_RECIPE not in said


GPU_RECIPE = Path(__file__).resolve().parent.parent / "configs" / "shakespeare.yaml"


def test_the_gpu_recipes_dry_run_on_a_cpu_estimates_its_time_and_points_to_the_cpu_recipe(
    cli, data_dir
):
    """configs/shakespeare.yaml at its real size on the CPU: the dry run times a few steps of one
    sequence and says the run's time (5,000 steps at a measured rate, 21 evals), and that the CPU
    recipe is the one for this device (no 5,000 steps of a 10.7M-parameter model at batch 64 x 256
    fit 30 minutes of a CPU)."""
    res = cli(
        "train",
        GPU_RECIPE,
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "device=cpu",
        "--dry-run",
    )
    assert res.exit_code == 0, res
    (line,) = [l for l in res.stdout.splitlines() if l.startswith("  time to train ")]
    assert " about " in line and " on cpu (5,000 steps at " in line and "21 evals at " in line, line
    assert "timed from a few steps of 1 sequence, times 64" in line, line
    assert res.stdout.splitlines()[-1] == CPU_RECIPE, res.stdout  # with the notes, last


def test_the_speedrun_recipes_are_cpu_recipes(cli, data_dir, monkeypatch):
    """The nanogpt-gpu track's recipe is long on a CPU on purpose: its dry run there says its time
    and no pointer to the CPU recipe, however long it counts as."""
    from minigpt_cli.trainer import estimate

    monkeypatch.setattr(estimate, "LONG_ON_CPU_S", 0.0)  # every run counts as long
    recipe = Path(__file__).resolve().parent.parent / "configs" / "speedrun-nanogpt-gpu.yaml"
    # float32: a CPU without bfloat16 units (AVX2) would time its steps emulated, 20 s in all; and
    # one of its 6 layers (5 s of timed steps on a Zen 3): the pointer goes by the recipe's name.
    res = cli("train", recipe, "--set", f"data.data_dir={data_dir}", "--set", "dtype=float32",
              "--set", "model.n_layer=1", "--dry-run")  # fmt: skip
    assert res.exit_code == 0, res
    steps = load_config(recipe).train.max_iters
    assert f" on cpu ({steps:,} steps at " in res.stdout, res.stdout
    assert CPU_RECIPE not in res.stdout + res.stderr


def test_train_says_the_estimate_in_its_first_lines(cli, data_dir, tmp_path, monkeypatch):
    """A real run: the estimate follows the line naming the run folder, before any step, and
    train.log keeps it; a CPU recipe is not pointed to itself."""
    monkeypatch.chdir(tmp_path)
    tiny = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
    res = cli(
        "train",
        tiny,
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=3",
        "--set",
        "train.eval_interval=3",
        "--set",
        "train.eval_iters=1",
        "--run-name",
        "t",
        "--no-progress",
    )
    assert res.exit_code == 0, res
    lines = res.stderr.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("training "))
    said = lines[start + 1]
    assert said.startswith("time to train: about ") and " on cpu (3 steps at " in said, lines
    assert "that is long for a CPU" not in res.stderr
    assert said in (tmp_path / "runs" / "t" / "train.log").read_text()


def test_a_long_cpu_run_names_the_cpu_recipe_once(cli, data_dir, tmp_path, monkeypatch):
    """The note naming the CPU recipe comes with the estimate before the run, and the loop's own
    estimate after its first steps does not say it again (it did: twice in one run)."""
    from minigpt_cli.trainer import estimate

    monkeypatch.setattr(estimate, "LONG_ON_CPU_S", 0.0)  # every run counts as long
    monkeypatch.chdir(tmp_path)
    tiny = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
    res = cli(
        "train",
        tiny,
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"train.max_iters={estimate.MEASURED_STEPS + 4}",
        "--set",
        "train.eval_iters=1",
        "--run-name",
        "t",
        "--no-progress",
    )
    assert res.exit_code == 0, res
    assert (res.stdout + res.stderr).count("that is long for a CPU") == 1, res.stderr


def test_the_estimate_keeps_one_thread_where_one_is_faster():
    """Beside a busy process the threads picked over a small model's warm-up may be too many: the
    micro-batch timed again on one thread is kept, with one thread, where it is faster; else the
    picked count stays."""
    import torch

    from minigpt_cli.trainer.estimate import _one_thread_if_faster

    before = torch.get_num_threads()
    seen = []

    def timed(seconds):
        def run():
            seen.append(torch.get_num_threads())
            return seconds

        return run

    try:
        torch.set_num_threads(2)
        assert _one_thread_if_faster(timed(0.004), 0.17) == 0.004
        assert seen == [1] and torch.get_num_threads() == 1  # the faster count is kept
        torch.set_num_threads(2)
        assert _one_thread_if_faster(timed(0.2), 0.1) == 0.1
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_ramped_run_is_timed_again_past_its_ramps():
    """Inside a sequence-length warmup the small steps are scaled to full ones by their FLOPs, but
    the optimizer's update costs the same at every size, so the first figure runs long (50 minutes
    said for a 25-minute nanogpt-gpu run): five full steps after the ramp give the figure again."""
    tc = TrainConfig(max_iters=1000, eval_interval=1000, eval_iters=5, warmup_iters=0)
    said, logged = [], []
    est = TimeEstimate(
        tc,
        0,
        False,
        batches_per_eval=10,
        on_cpu=False,
        say=said.append,
        log=logged.append,
        full_steps=lambda a, b: sum(0.25 if s < 400 else 1.0 for s in range(a, b)),
        ramp_end=400,
    )
    for step in range(1, 401):  # a small step: 0.5 s where FLOPs say a quarter of a 1.5 s one
        est.step_done(step, 0.5)
    (first,) = said
    # 5 timed steps of 2.5 s are 1.25 full ones: 2 s each; the last eval, 10 batches of 2 / 3 s
    assert (
        first
        == f"note: about {human_seconds((394 * 0.25 + 600) * 2.0 + 10 * 2 / 3)} to go (994 steps at 2 s)"
    )
    for step in range(401, 401 + MEASURED_STEPS):  # the first full step warms up: left out
        est.step_done(step, 9.0 if step == 401 else 1.5)
    assert len(said) == 1  # not yet: the warm-up step and four more
    est.step_done(401 + MEASURED_STEPS, 1.5)
    step = 401 + MEASURED_STEPS
    assert said[1] == (
        f"note: about {human_seconds((1000 - step) * 1.5 + 10 * 0.5)} to go "
        f"({1000 - step:,} steps at 1.5 s, timed past the ramps)"
    )
    for step in range(step + 1, step + 50):
        est.step_done(step, 1.5)
    assert len(said) == 2 and len(logged) == 2  # once


def test_the_estimate_before_a_ramped_run_scales_the_passes_but_not_the_update(monkeypatch):
    """Before the run, a ramp's small steps cost their FLOPs' share of a full step's passes, and
    each its whole optimizer update: 1,100 steps whose first 400 are windows of 32 to 224 of 256."""
    import torch

    from minigpt_cli.accounting.steps import full_steps
    from minigpt_cli.trainer import estimate as est

    monkeypatch.setattr(est, "step_seconds", lambda cfg, device, dtype: (1.0, 0.25, 0.1, "a test"))
    cfg = load_config(
        "speedrun-nanogpt-gpu",
        [
            "train.max_iters=1100",
            "train.eval_interval=1100",
            "train.block_size_warmup_iters=400",
            "train.block_size_warmup_multiple=32",
            "model.vocab_size=65",
        ],
    )
    passes = full_steps(0, 1100, cfg)
    assert 700 + 180 < passes < 700 + 220  # the 400 ramped steps: about half a full step's FLOPs
    (line,), total = est.run_estimate(cfg, torch.device("cpu"), torch.float32, val_tokens=111_540)
    evals = est.eval_batches(cfg, 111_540) * 0.1
    assert total == pytest.approx(passes * 1.0 + 1100 * 0.25 + evals)
    assert line.startswith(f"about {human_seconds(total)} on cpu (1,100 steps at 1.25 s, 1 eval at")
