"""The training step's cost under each optimizer: AdamW, ``torch.optim.Muon`` and minigpt's :class:`BatchedMuon`,
measured in one sitting, in turns, so that a machine whose speed drifts slows each alike (scripts/optimizer-bench.py;
BENCHMARKS.md, "Muon's step")."""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Any, Callable

import torch

from ..config.schema import Config
from ..model.gpt import GPT
from ..runtime.device import resolve_device, resolve_dtype, tune_runtime
from ..runtime.kernels import swap as swap_kernels
from ..trainer.muon import BatchedMuon
from ..trainer.optim import MuonAdamW, adamw
from ..trainer.step import train_step
from .generation import sync

#: What is compared: name -> the optimizer for a model, from the config's train section.
OPTIMIZERS: dict[str, Callable[[torch.nn.Module, Any], Any]] = {
    "adamw": lambda model, tc: adamw([p for p in model.parameters() if p.requires_grad], tc),
    "torch.optim.Muon": lambda model, tc: MuonAdamW(model, tc, muon_class=torch.optim.Muon),
    "BatchedMuon": lambda model, tc: MuonAdamW(model, tc, muon_class=BatchedMuon),
}


def bench_optimizers(cfg: Config, vocab_size: int = 65, steps: int = 10, rounds: int = 5,
                     echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Median seconds (on a CPU: CPU seconds of this process) of a whole training step (forward, backward,
    clipping, update) and of the optimizer's step alone, per optimizer of :data:`OPTIMIZERS`, at ``cfg``'s model
    and batch size on random tokens, and each as a ratio of AdamW's. Each of ``rounds`` rounds times ``steps``
    steps of every optimizer in turn."""
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    mc = cfg.model.model_copy(update={"vocab_size": cfg.model.vocab_size or vocab_size})
    tc = cfg.train.model_copy(update={"optimizer": "muon"})
    tune_runtime(device)
    autocast = torch.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    g = torch.Generator().manual_seed(cfg.seed)

    def batches():
        while True:
            x = torch.randint(0, mc.vocab_size, (tc.batch_size, mc.block_size + 1), generator=g)
            yield x[:, :-1].to(device), x[:, 1:].to(device)

    it = batches()
    runs = {}
    for name, make in OPTIMIZERS.items():
        torch.manual_seed(cfg.seed)
        model = swap_kernels(GPT(mc).to(device)).train()
        runs[name] = (model, make(model, tc), [p for p in model.parameters() if p.requires_grad])
    step_s: dict[str, list[float]] = {name: [] for name in runs}
    opt_s: dict[str, list[float]] = {name: [] for name in runs}

    def timed(fn, n: int) -> float:
        """Seconds per call: wall-clock time, or on a CPU this process's CPU time (on a machine that others
        load, the time the step computed rather than the time it waited for a core)."""
        clock = time.process_time if device.type == "cpu" else time.perf_counter
        sync(device)
        t = clock()
        for _ in range(n):
            fn()
        sync(device)
        return (clock() - t) / n

    echo(f"optimizer step: {rounds} rounds x {steps} steps each of {', '.join(runs)}; batch {tc.batch_size} x "
         f"{mc.block_size}, {sum(p.numel() for p in runs['adamw'][2]):,} parameters, on {device}")
    for r in range(rounds + 1):  # round 0 warms up
        for name, (model, opt, params) in runs.items():
            step = lambda: train_step(model, opt, it, tc.grad_accum_steps, autocast, scaler,  # noqa: E731
                                      tc.grad_clip, params)
            seconds = timed(step, steps)
            model(*next(it))[1].backward()  # gradients in place, for the optimizer's step alone
            update = timed(opt.step, steps)
            opt.zero_grad(set_to_none=True)
            if r:
                step_s[name].append(seconds)
                opt_s[name].append(update)
    med = {name: statistics.median(v) for name, v in step_s.items()}
    med_opt = {name: statistics.median(v) for name, v in opt_s.items()}
    return {"device": str(device), "clock": "process_time" if device.type == "cpu" else "perf_counter",
            "threads": torch.get_num_threads(), "dtype": str(dtype).removeprefix("torch."), "steps": steps,
            "rounds": rounds,
            "step_s": med, "optimizer_s": med_opt, "step_ratio": {n: med[n] / med["adamw"] for n in med},
            "optimizer_ratio": {n: med_opt[n] / med_opt["adamw"] for n in med_opt}, "step_s_rounds": step_s}


def format_bench_optimizers(result: dict[str, Any]) -> str:
    """The table of :func:`bench_optimizers`: milliseconds and ratios to AdamW."""
    lines = [f"{'optimizer':<18} {'step ms':>8} {'x AdamW':>8} {'update ms':>10} {'x AdamW':>8}"]
    for name, s in result["step_s"].items():
        lines.append(f"{name:<18} {s * 1e3:8.1f} {result['step_ratio'][name]:8.2f} "
                     f"{result['optimizer_s'][name] * 1e3:10.2f} {result['optimizer_ratio'][name]:8.2f}")
    return "\n".join(lines)
