"""The learning-rate schedule, the eval points, and what --dry-run prints."""

from __future__ import annotations

import pytest
from helpers import TINY

from minigpt_cli.config import TrainConfig, load_config
from minigpt_cli.model import GPT
from minigpt_cli.trainer import lr_at, should_eval


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
