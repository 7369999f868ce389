"""Checkpoints: the save policy (Checkpointer), kills mid-write, damaged files, and what a checkpoint holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minigpt_cli import checkpoint, runs
from minigpt_cli.checkpoint import Checkpointer
from minigpt_cli.config import load_config
from minigpt_cli.model import GPT

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny.yaml"


@pytest.fixture
def policy(tmp_path):
    """A Checkpointer over a tiny model whose snapshot says which step it is at."""
    cfg = load_config(TINY, ["model.vocab_size=65", "train.keep_every=4"])
    model = GPT(cfg.model)
    step = {"n": 0}

    def snapshot():
        return model, {"step": step["n"]}, {"name": cfg.name, "step": step["n"]}

    return Checkpointer(tmp_path, cfg, snapshot), step


def saved(run_dir: Path) -> dict[str, int]:
    """Each checkpoint folder of the run and the step its meta.json names."""
    root = run_dir / runs.CHECKPOINTS
    return {d.name: runs.read_meta(d)["step"] for d in sorted(root.iterdir())} if root.is_dir() else {}


def test_an_eval_saves_best_only_when_it_improves_and_last_always(policy, tmp_path):
    ckpt, step = policy
    step["n"] = 0
    ckpt.after_eval(improved=True)
    assert saved(tmp_path) == {"best": 0, "last": 0}
    step["n"] = 2
    ckpt.after_eval(improved=False)
    assert saved(tmp_path) == {"best": 0, "last": 2}
    assert ckpt.last_step() == 2


def test_kept_checkpoints_every_keep_every_steps(policy, tmp_path):
    ckpt, step = policy
    for n in range(1, 10):
        step["n"] = n
        ckpt.after_step(n)
    assert saved(tmp_path) == {"step-0000004": 4, "step-0000008": 8}
    step["n"] = 9
    ckpt.on_stop()
    assert saved(tmp_path)["last"] == 9


def test_a_process_that_does_not_write_saves_nothing(policy, tmp_path):
    ckpt, _ = policy
    ckpt.enabled = False
    ckpt.after_eval(improved=True)
    ckpt.after_step(4)
    ckpt.on_stop()
    assert saved(tmp_path) == {} and ckpt.last_step() is None


def test_a_saved_checkpoint_rebuilds_the_model_alone(tmp_path):
    cfg = load_config(TINY, ["model.vocab_size=65"])
    torch.manual_seed(0)
    model = GPT(cfg.model)
    checkpoint.save(runs.checkpoint_dir(tmp_path, runs.LAST), model, cfg, {"step": 3}, {"step": 3})
    loaded, loaded_cfg = checkpoint.load_model(runs.checkpoint_dir(tmp_path, runs.LAST))
    assert loaded_cfg.model == cfg.model
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert checkpoint.load_trainer_state(runs.checkpoint_dir(tmp_path, runs.LAST)) == {"step": 3}
    meta = json.loads((runs.checkpoint_dir(tmp_path, runs.LAST) / runs.META).read_text())
    assert meta == {"step": 3}
