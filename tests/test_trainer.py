"""The Trainer in-process on a tiny model: what the loop asks its components, and what it leaves behind."""

from __future__ import annotations

import json
import math
import signal
import threading
from pathlib import Path

import pytest
import torch

from minigpt_cli.checkpoint import Checkpointer
from minigpt_cli.config import load_config
from minigpt_cli.trainer import train
from minigpt_cli.trainer.evaluate import Evaluator

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny.yaml"


def tiny(data_dir, *extra):
    return load_config(TINY, [f"data.data_dir={data_dir}", "train.log_interval=1", "train.sample_tokens=0", *extra])


def test_the_loop_asks_the_evaluator_and_the_checkpointer(data_dir, tmp_path, monkeypatch):
    """Evals at 0, every eval_interval and at the end; best on improvement, last after each eval, kept steps."""
    monkeypatch.chdir(tmp_path)
    evals, saves = [], []
    real_losses, real_save = Evaluator.losses, Checkpointer.save

    def losses(self, model, step):
        evals.append(step)
        return real_losses(self, model, step)

    def save(self, which):
        saves.append(which)
        return real_save(self, which)

    monkeypatch.setattr(Evaluator, "losses", losses)
    monkeypatch.setattr(Checkpointer, "save", save)
    res = train(tiny(data_dir, "train.max_iters=9", "train.eval_interval=4", "train.keep_every=3"), "loop",
                echo=lambda m: None, progress=False)
    assert res.step == 9 and evals == [0, 4, 8, 9]
    assert saves.count("last") == 4 and saves.count("best") >= 1
    assert [s for s in saves if s.startswith("step-")] == ["step-0000003", "step-0000006", "step-0000009"]
    assert saves[:2] == ["best", "last"]  # step 0's eval is the first best
    assert [r["step"] for r in map(json.loads, (res.run_dir / "metrics.jsonl").read_text().splitlines())
            if r["event"] == "train"] == list(range(1, 10))


def test_train_leaves_no_global_state_behind(data_dir, tmp_path, monkeypatch):
    """A sweep calls train in-process many times: handlers, threads and flags are as they were, and runs repeat."""
    monkeypatch.chdir(tmp_path)
    sigs = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    before = ({s: signal.getsignal(s) for s in sigs}, torch.get_num_threads(),
              torch.backends.cuda.matmul.allow_tf32, {t for t in threading.enumerate() if not t.daemon})
    results = [train(tiny(data_dir, "train.max_iters=6", "train.eval_interval=3"), f"r{i}", echo=lambda m: None,
                     progress=False) for i in range(2)]
    after = ({s: signal.getsignal(s) for s in sigs}, torch.get_num_threads(),
             torch.backends.cuda.matmul.allow_tf32, {t for t in threading.enumerate() if not t.daemon})
    assert after == before
    a, b = results
    assert a.run_dir != b.run_dir and a.val_loss == b.val_loss and a.train_loss == b.train_loss
    assert math.isfinite(a.best_val_loss)


def test_the_thread_count_is_put_back_after_a_run_that_changed_it(data_dir, tmp_path, monkeypatch):
    """Other processes took a core mid-run (the trainer dropped to 1 thread); afterwards the count is restored."""
    from minigpt_cli import runtime

    if torch.get_num_threads() < 2:
        pytest.skip("needs 2 threads to drop one")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.chdir(tmp_path)
    start = torch.get_num_threads()

    def busy_elsewhere(self, force=False):
        torch.set_num_threads(1)  # what poll does when other processes keep the cores busy
        return 1

    monkeypatch.setattr(runtime.CpuThreads, "poll", busy_elsewhere)
    train(tiny(data_dir, "train.max_iters=2", "train.eval_interval=2"), "t", echo=lambda m: None, progress=False)
    assert torch.get_num_threads() == start
