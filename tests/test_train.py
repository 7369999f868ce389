"""The training loop's parts: schedule, optimizer groups, a short real run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from minigpt_cli.config import TrainConfig, load_config
from minigpt_cli.model import GPT
from minigpt_cli.trainer import lr_at, make_optimizer, should_eval, train

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_cosine_schedule_with_warmup():
    tc = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, max_iters=2000)
    assert lr_at(0, tc) > 0  # the very first step already learns
    assert lr_at(0, tc) == pytest.approx(1e-3 / 101)
    assert lr_at(99, tc) == pytest.approx(1e-3 * 100 / 101)
    assert lr_at(100, tc) == pytest.approx(1e-3)
    mid = 100 + (2000 - 100) // 2
    assert lr_at(mid, tc) == pytest.approx((1e-3 + 1e-4) / 2)
    assert lr_at(2000, tc) == pytest.approx(1e-4)
    steps = [lr_at(s, tc) for s in range(100, 2001)]
    assert all(a >= b for a, b in zip(steps, steps[1:]))


def test_other_schedules():
    lin = TrainConfig(learning_rate=1.0, min_lr=0.0, warmup_iters=0, max_iters=100, lr_schedule="linear")
    assert lr_at(50, lin) == pytest.approx(0.5)
    const = TrainConfig(learning_rate=0.3, min_lr=0.0, warmup_iters=10, max_iters=100, lr_schedule="constant")
    assert lr_at(60, const) == pytest.approx(0.3)
    # The original Transformer (Vaswani et al. 2017 eq. 3): d^-0.5 · min(s^-0.5, s·w^-1.5), peak at s = w.
    inv = TrainConfig(learning_rate=1.0, min_lr=0.0, warmup_iters=4000, max_iters=10**6, lr_schedule="inverse_sqrt")
    assert lr_at(3999, inv, n_embd=512) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    assert lr_at(15999, inv, n_embd=512) == pytest.approx(512 ** -0.5 * 16000 ** -0.5)


def test_eval_points():
    tc = TrainConfig(eval_interval=10, max_iters=25)
    assert [s for s in range(26) if should_eval(s, tc)] == [0, 10, 20, 25]


def test_weight_decay_on_matrices_only():
    cfg = load_config(CONFIGS / "tiny.yaml").model.model_copy(update={"vocab_size": 65, "bias": True})
    model = GPT(cfg)
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == model.num_params()


def test_tiny_run_learns_and_logs(tmp_path, data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(CONFIGS / "tiny.yaml", [f"data.data_dir={data_dir}", "train.max_iters=60",
                                              "train.eval_interval=30", "train.eval_iters=20"])
    result = train(cfg, run_name="t", echo=lambda m: None, progress=False)
    lines = [json.loads(l) for l in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [l for l in lines if l["event"] == "eval"]
    trains = [l for l in lines if l["event"] == "train"]
    assert [e["step"] for e in evals] == [0, 30, 60]
    # Loss at initialisation ≈ ln(65); it then falls.
    assert abs(evals[0]["val_loss"] - math.log(65)) < 0.1
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    assert evals[-1]["train_loss"] < evals[0]["train_loss"] - 0.5
    for l in lines:
        assert {"step", "event", "elapsed_s"} <= set(l)
    for l in trains:
        assert {"loss", "lr", "tokens_per_sec"} <= set(l) and l["lr"] > 0 and l["tokens_per_sec"] > 0
    for e in evals:
        assert {"train_loss", "val_loss"} <= set(e)
    assert result.best_val_loss == min(e["val_loss"] for e in evals)
    # Every file and folder of the run gets the mode a plain open()/mkdir() would under the umask:
    # no 0600 files from tempfile.mkstemp, no 0700 checkpoint folders from mkdtemp.
    import os

    umask = os.umask(0)
    os.umask(umask)
    modes = {p.relative_to(result.run_dir).as_posix(): p.stat().st_mode & 0o777
             for p in result.run_dir.rglob("*") if p.name != ".lock"}
    assert {"loss.png", "metrics.jsonl", "checkpoints/last", "checkpoints/last/model.safetensors"} <= set(modes)
    wrong = {k: oct(m) for k, m in modes.items()
             if m != (0o777 if (result.run_dir / k).is_dir() else 0o666) & ~umask}
    assert not wrong, wrong


def test_a_model_too_large_for_memory_is_refused_before_anything_is_made(cli, data_dir, tmp_path, monkeypatch):
    """10 million layers: the estimate (count-params' accounting) exceeds the free memory; no run folder."""
    from helpers import assert_user_error

    import minigpt_cli.runtime as T

    monkeypatch.chdir(tmp_path)
    res = cli("train", CONFIGS / "tiny.yaml", "--set", f"data.data_dir={data_dir}", "--set", "model.n_layer=10000000")
    assert_user_error(res, "this model needs about", "123,520,003,136 parameters", "free", "model.n_layer",
                      notes_ok=True)
    assert not (tmp_path / "runs").exists()
    # The estimate against a pretend 1 MiB machine: even the tiny model is refused; with plenty, it trains.
    monkeypatch.setattr(T, "available_memory", lambda device: 2**20)
    cfg = load_config(CONFIGS / "tiny.yaml", [f"data.data_dir={data_dir}"])
    with pytest.raises(T.MinigptError, match="but cpu has 1.00 MiB free"):
        T.check_memory(cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": 65})}),
                       torch.device("cpu"), torch.float32)


def test_running_out_of_memory_is_one_line(cli, data_dir, tmp_path, monkeypatch):
    """The allocator failing after the estimate passed: one line, exit 2, the fix named."""
    from helpers import assert_user_error

    import minigpt_cli.trainer.loop as T

    monkeypatch.chdir(tmp_path)

    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 786432 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(T, "train_step", oom)
    res = cli("train", CONFIGS / "tiny.yaml", "--set", f"data.data_dir={data_dir}", "--run-name", "o")
    assert_user_error(res, "out of memory", "can't allocate memory", "train.batch_size", notes_ok=True)
