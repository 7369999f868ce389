"""Weight EMA, the batch-size ramp and the sequence-length warmup (issue 39, section 2): the EMA
against one computed by hand, the ramps' sizes and token counts against their formulas and a sum
over every step, bit-exact resume of each, and generate, evaluate and export on the EMA weights."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from helpers import assert_user_error, curve, records, tiny, working_dir
from safetensors.torch import load_file

from minigpt_cli.accounting import params
from minigpt_cli.accounting.steps import (
    batch_size_at,
    block_size_at,
    full_steps,
    step_sizes,
    step_tokens,
    tokens_through,
    train_flops_through,
)
from minigpt_cli.config.schema import load_config
from minigpt_cli.data.pipeline import BatchSampler
from minigpt_cli.errors import Interrupted, MinigptError
from minigpt_cli.run import checkpoint
from minigpt_cli.run import folder as runs
from minigpt_cli.sample.load import load_run
from minigpt_cli.trainer import train
from minigpt_cli.trainer.ema import WeightEMA

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


# ----------------------------------------------------------------------------- the EMA


def test_the_ema_is_the_average_taken_by_hand_and_a_skipped_step_leaves_it():
    """decay 0.5 from step 2: steps 1-2 copy the weights, step 3 averages, step 4 is skipped (its
    weights are not folded in), step 5 averages again; computed here in plain floats."""
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema = WeightEMA(model, decay=0.5, start=2)
    by_hand = 1.0
    for step, (w, skipped) in enumerate([(2.0, 0), (4.0, 0), (8.0, 0), (100.0, 1), (16.0, 0)], 1):
        with torch.no_grad():
            model.weight.fill_(w)
        ema.update(step, torch.tensor(float(skipped)))
        if not skipped:
            by_hand = w if step <= 2 else 0.5 * by_hand + 0.5 * w
        assert ema.state_dict()["weight"].item() == by_hand, step
    assert by_hand == 0.5 * (0.5 * 4.0 + 0.5 * 8.0) + 0.5 * 16.0
    # Applied: the model holds the average inside, its own weights bit for bit after.
    with ema.applied():
        assert model.weight.item() == by_hand
    assert model.weight.item() == 16.0


def test_the_ema_names_its_tensors_as_the_checkpoint_names_the_weights():
    """Tied weights once, under the names model.safetensors uses: the files swap one for the
    other."""
    from minigpt_cli.model.gpt import GPT

    cfg = load_config(TINY, ["model.vocab_size=65"])
    model = GPT(cfg.model)
    assert set(WeightEMA(model, 0.9).state_dict()) == set(checkpoint.model_state(model))


# ----------------------------------------------------------------------------- the ramps


def ramped(*sets: str):
    return load_config(
        TINY,
        [
            "model.vocab_size=65",
            "train.batch_size=8",
            "train.batch_size_warmup_iters=6",
            "train.batch_size_warmup_start=2",
            "train.block_size_warmup_iters=6",
            "train.block_size_warmup_multiple=8",
            *sets,
        ],
    )


def test_the_ramps_sizes_follow_their_formulas():
    """Batch b0 + floor((B - b0)·s / N): 2 + s for B 8, N 6; window 8·(1 + floor(3·s / 6)) for
    block 32 in steps of 8; then the full sizes."""
    cfg = ramped()
    assert [batch_size_at(s, cfg.train) for s in range(9)] == [2, 3, 4, 5, 6, 7, 8, 8, 8]
    assert [block_size_at(s, cfg) for s in range(9)] == [8, 8, 16, 16, 24, 24, 32, 32, 32]
    # null start: a quarter of batch_size; a block_size the multiple does not divide ends on it.
    cfg = ramped("train.batch_size_warmup_start=null", "model.block_size=30")
    assert batch_size_at(0, cfg.train) == 2
    assert [block_size_at(s, cfg) for s in range(7)] == [8, 8, 16, 16, 24, 24, 30]
    # Off (the default): the full sizes from step 0.
    plain = load_config(TINY, ["model.vocab_size=65"])
    assert (batch_size_at(0, plain.train), block_size_at(0, plain)) == (8, 32)
    assert list(step_sizes(plain)) == []


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["train.block_size_warmup_iters=0"],
        ["train.batch_size_warmup_iters=0", "train.block_size_warmup_iters=13"],
        ["train.batch_size_warmup_iters=1000", "train.grad_accum_steps=3"],
    ],
)
def test_tokens_and_flops_are_the_sum_over_every_step(sets):
    """The stretches of step_sizes add up to the sum over every step of its tokens (and FLOPs at
    its window), at any count of steps, inside and past the ramps."""
    cfg = ramped(*sets)
    for n in (0, 1, 5, 6, 7, 40, 1001):
        tokens = sum(step_tokens(s, cfg, world=2) for s in range(n))
        assert tokens_through(n, cfg, world=2) == tokens, n
        flops = sum(
            step_tokens(s, cfg)
            * params.flops(cfg.model, block_size_at(s, cfg))["train_with_lm_head"]
            for s in range(n)
        )
        assert train_flops_through(n, cfg) == pytest.approx(flops, rel=1e-12), n
    # Past the ramps, a step is a full step; inside, a fraction of one.
    assert full_steps(1500, 1510, cfg) == pytest.approx(10.0)
    assert 0 < full_steps(0, 5, cfg) < 5


def test_the_sampler_draws_each_steps_shape_and_resumes_at_a_step():
    """With 2 micro-batches a step, draws 0-1 are step 0's shape, 2-3 step 1's; set_state at a step
    draws what the uninterrupted sampler drew there."""
    cfg = ramped()
    tokens = torch.arange(1000).numpy()

    def sampler():
        return BatchSampler(
            tokens,
            32,
            8,
            seed=0,
            device=torch.device("cpu"),
            sizes=lambda s: (batch_size_at(s, cfg.train), block_size_at(s, cfg)),
            accum=2,
        )

    s = sampler()
    shapes, states, draws = [], {}, []
    for i in range(16):
        if i % 2 == 0:
            states[i // 2] = s.state()
        x, y = s.next()
        shapes.append(tuple(x.shape))
        draws.append(x)
        assert torch.equal(y[:, :-1], x[:, 1:])
    assert shapes[:6] == [(2, 8), (2, 8), (3, 8), (3, 8), (4, 16), (4, 16)]
    assert shapes[-2:] == [(8, 32), (8, 32)]
    again = sampler()
    again.set_state(states[3], 3)
    assert torch.equal(again.next()[0], draws[6])


# ----------------------------------------------------------------------------- resume


def stop_after_step(monkeypatch, n: int):
    """A real SIGINT as the n-th train_step returns; the real train_step, to put back."""
    import minigpt_cli.trainer.loop as T

    real = T.train_step
    calls = {"n": 0}

    def step(*a, **k):
        out = real(*a, **k)
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(T, "train_step", step)
    return real


SWITCHES = {
    "ema": ["train.ema_decay=0.9", "train.ema_start=3"],
    "batch-ramp": ["train.batch_size_warmup_iters=20", "train.grad_accum_steps=2"],
    "block-warmup": ["train.block_size_warmup_iters=20", "train.block_size_warmup_multiple=8"],
    "all": [
        "train.ema_decay=0.8",
        "train.batch_size_warmup_iters=16",
        "train.block_size_warmup_iters=24",
        "train.block_size_warmup_multiple=8",
    ],
}


@pytest.mark.parametrize("name", SWITCHES)
def test_a_resumed_run_is_bit_for_bit_the_uninterrupted_one(name, data_dir, tmp_path, monkeypatch):
    """30 steps straight against 13 + a SIGINT + --resume (inside the ramps): the same losses at
    every logged step, the same weights and EMA weights, bit for bit, and the tokens of
    metrics.jsonl the exact count."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=30", "train.eval_interval=10", *SWITCHES[name])
    train(cfg, run_name="straight", echo=lambda m: None, progress=False)
    import minigpt_cli.trainer.loop as T

    real = stop_after_step(monkeypatch, 13)
    with pytest.raises(Interrupted, match="step 13"):
        train(cfg, run_name="resumed", echo=lambda m: None, progress=False)
    monkeypatch.setattr(T, "train_step", real)
    train(cfg, echo=lambda m: None, progress=False, resume="runs/resumed")
    a, b = tmp_path / "runs" / "straight", tmp_path / "runs" / "resumed"
    assert curve(a) == curve(b)
    ema = cfg.train.ema_decay is not None
    files = ["model.safetensors"] + (["ema.safetensors"] if ema else [])
    for which in (runs.LAST, runs.BEST):
        for f in files:
            wa, wb = (load_file(r / "checkpoints" / which / f) for r in (a, b))
            assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), (which, f)
    assert (b / "checkpoints" / "last" / "ema.safetensors").is_file() == ema
    for r in records(b):
        assert r["tokens"] == tokens_through(r["step"], cfg), r
    evals = [r for r in records(b) if r["event"] == "eval"]
    assert evals and all(r.get("ema", False) == ema for r in evals)


def test_ema_switched_on_at_a_resume_starts_from_the_weights_and_says_so(
    data_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cfg = tiny(data_dir, "train.max_iters=10", "train.eval_interval=10")
    train(cfg, run_name="r", echo=lambda m: None, progress=False)
    said = []
    more = tiny(data_dir, "train.max_iters=12", "train.eval_interval=10", "train.ema_decay=0.5")
    train(more, echo=said.append, progress=False, resume="runs/r")
    assert any("holds no EMA weights" in line and "step 10" in line for line in said), said
    assert (tmp_path / "runs/r/checkpoints/last/ema.safetensors").is_file()


# ----------------------------------------------------------------------------- using the EMA


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory, data_dir):
    work = tmp_path_factory.mktemp("ema")
    with working_dir(work):
        cfg = tiny(data_dir, "train.max_iters=30", "train.eval_interval=15", "train.ema_decay=0.9")
        train(cfg, run_name="ema", echo=lambda m: None, progress=False)
    return work / "runs" / "ema"


def test_the_run_evaluates_its_ema_weights_and_evaluate_gives_that_loss_back(ema_run, cli):
    res = cli("evaluate", "--run", str(ema_run), "--json")
    assert res.exit_code == 0, res
    out = json.loads(res.stdout)
    assert out["weights"] == "ema" and out["loss"] == pytest.approx(out["logged_loss"], abs=1e-6)
    assert "using the EMA weights" in res.stderr
    raw = cli("evaluate", "--run", str(ema_run), "--json", "--raw-weights")
    assert raw.exit_code == 0, raw
    out_raw = json.loads(raw.stdout)
    # The raw weights score otherwise, and the EMA's logged loss is not theirs to compare with.
    assert out_raw["weights"] == "raw" and out_raw["logged_loss"] is None
    assert out_raw["loss"] != out["loss"]
    assert "raw trained weights" in raw.stderr


def test_generate_and_export_use_the_ema_weights_and_say_so(ema_run, cli, tmp_path):
    ckpt = ema_run / "checkpoints" / "best"
    ema, raw = load_file(ckpt / "ema.safetensors"), load_file(ckpt / "model.safetensors")
    assert any(not torch.equal(ema[k], raw[k]) for k in ema)
    loaded = load_run(ema_run)
    assert loaded.ema and "EMA weights" in loaded.describe()
    state = checkpoint.model_state(loaded.model)
    assert all(torch.equal(state[k], ema[k]) for k in ema)
    state = checkpoint.model_state(load_run(ema_run, ema=False).model)
    assert all(torch.equal(state[k], raw[k]) for k in raw)
    res = cli("generate", "--run", str(ema_run), "--max-new-tokens", "5")
    assert res.exit_code == 0 and "using the EMA weights" in res.stderr, res
    out = tmp_path / "exported"
    res = cli("export", str(ema_run), "--output", str(out))
    assert res.exit_code == 0 and "using the EMA weights" in res.stderr, res
    exported = load_file(out / "model.safetensors")
    assert torch.equal(exported["transformer.wte.weight"], ema["wte.weight"])
    res = cli("export", str(ema_run), "--output", str(out), "--force", "--raw-weights")
    assert res.exit_code == 0, res
    assert torch.equal(
        load_file(out / "model.safetensors")["transformer.wte.weight"], raw["wte.weight"]
    )


def test_a_run_without_ema_loads_as_before_and_says_nothing(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(
        tiny(data_dir, "train.max_iters=2"), run_name="plain", echo=lambda m: None, progress=False
    )
    loaded = load_run(tmp_path / "runs" / "plain")
    assert not loaded.ema and loaded.weights_note() is None
    assert not (tmp_path / "runs/plain/checkpoints/last/ema.safetensors").exists()
    assert all("ema" not in r for r in records(tmp_path / "runs" / "plain"))
    # --raw-weights there changes nothing, and says so.
    note = load_run(tmp_path / "runs" / "plain", ema=False).weights_note()
    assert note.startswith("note: --raw-weights has no effect") and "train.ema_decay null" in note


def test_a_checkpoint_whose_listed_ema_file_is_missing_is_refused_not_read_raw(
    ema_run, cli, tmp_path
):
    """meta.json lists ema.safetensors; without it the raw weights would pass for the run's
    average. evaluate, generate and export refuse in one line (and --raw-weights reads the rest);
    a resume refuses too, as its EMA could not continue exactly."""
    run = tmp_path / "ema"
    shutil.copytree(ema_run, run)
    (runs.resolve(run / "checkpoints" / "best") / "ema.safetensors").unlink()
    for args in (
        ["evaluate", "--run", str(run)],
        ["generate", "--run", str(run), "--max-new-tokens", "5"],
        ["export", str(run), "--output", str(tmp_path / "out")],
    ):
        assert_user_error(cli(*args), "ema.safetensors is missing", "meta.json lists it",
                          "--raw-weights")  # fmt: skip
    assert not (tmp_path / "out").exists()
    res = cli("evaluate", "--run", str(run), "--raw-weights")
    assert res.exit_code == 0 and "raw trained weights" in res.stderr, res
    with pytest.raises(MinigptError, match="ema.safetensors is missing"):
        checkpoint.read_ema(
            runs.resolve(run / "checkpoints" / "best"), load_run(run, ema=False).model
        )


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "sets, words",
    [
        (
            ["train.batch_size_warmup_iters=10", "train.batch_size_warmup_start=8"],
            "train.batch_size_warmup_start (8) must be below train.batch_size (8)",
        ),
        (
            ["train.block_size_warmup_iters=10", "train.block_size_warmup_multiple=32"],
            "train.block_size_warmup_multiple (32) must be below model.block_size (32)",
        ),
        (
            ["train.ema_decay=0.99", "train.parallelism=fsdp"],
            "train.ema_decay cannot run with train.parallelism fsdp",
        ),
        (["train.ema_decay=1.0"], "train.ema_decay"),
    ],
)
def test_combinations_that_cannot_work_are_refused_in_one_line(sets, words, cli, tmp_path):
    with working_dir(tmp_path):
        res = cli("train", str(TINY), "--dry-run", *[a for s in sets for a in ("--set", s)])
    assert_user_error(res, words)
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- the accounting


def test_a_token_budget_gives_the_fewest_steps_that_reach_it_under_a_ramp():
    from minigpt_cli.experiments.sweep import Budget

    cfg = ramped()
    for tokens in (1, 300, 2_000, 50_000):
        steps = Budget(tokens=float(tokens)).steps(cfg)
        assert tokens_through(steps, cfg) >= tokens > tokens_through(steps - 1, cfg), tokens


def test_plot_counts_a_ramped_runs_flops_step_by_step(data_dir, tmp_path, monkeypatch):
    from minigpt_cli.experiments.plot import read_curves

    monkeypatch.chdir(tmp_path)
    cfg = tiny(
        data_dir,
        "train.max_iters=8",
        "train.eval_interval=4",
        "train.batch_size_warmup_iters=6",
        "train.block_size_warmup_iters=6",
        "train.block_size_warmup_multiple=8",
    )
    train(cfg, run_name="r", echo=lambda m: None, progress=False)
    curves = read_curves(tmp_path / "runs" / "r", "flops")
    saved = load_config(tmp_path / "runs" / "r" / "config.yaml")
    assert [x for x, *_ in curves.evals] == [train_flops_through(s, saved) for s in (0, 4, 8)]
    # Below a full step's FLOPs times the steps: the ramps' steps are smaller.
    assert curves.evals[-1][0] < 8 * train_flops_through(
        1,
        saved.model_copy(
            update={
                "train": saved.train.model_copy(
                    update={"batch_size_warmup_iters": 0, "block_size_warmup_iters": 0}
                )
            }
        ),
    )
