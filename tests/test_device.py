"""``device.tune_runtime``: on glibc, CPU training stops faulting its activation memory back in every step."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, resource, sys
from contextlib import nullcontext
import torch
from minigpt_cli.config import ModelConfig, TrainConfig
from minigpt_cli.device import tune_runtime
from minigpt_cli.model import GPT
from minigpt_cli.train import make_optimizer, train_step

torch.set_num_threads(1)
if sys.argv[1] == "tuned":
    tune_runtime(torch.device("cpu"))
torch.manual_seed(0)
cfg = ModelConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, bias=False, vocab_size=65)
model = GPT(cfg)
opt = make_optimizer(model, TrainConfig(), torch.device("cpu"))
scaler = torch.amp.GradScaler("cpu", enabled=False)
params = list(model.parameters())

def batches():
    while True:
        x = torch.randint(0, 65, (12, 65))
        yield x[:, :-1], x[:, 1:]

it = batches()
for _ in range(5):
    train_step(model, opt, it, 1, nullcontext(), scaler, 1.0, params)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    train_step(model, opt, it, 1, nullcontext(), scaler, 1.0, params)
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_cpu_training_steps_stop_page_faulting():
    """nanoGPT's CPU-recipe model, batch 12 x 64: page faults per training step with and without the tuning."""
    faults = {}
    for mode in ("default", "tuned"):
        out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
        faults[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert faults["default"] > 50, faults  # glibc hands activations back to the OS and faults them in again
    assert faults["tuned"] < faults["default"] / 5, faults
