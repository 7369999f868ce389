"""``minigpt bench --optimizers``: the training step's cost under AdamW, Muon (minigpt's
:class:`BatchedMuon`), ``torch.optim.Muon`` and Muon with each of its variants (Polar Express,
NorMuon, cautious weight decay), at a config's model and batch, measured in alternating rounds.

A round runs a few whole steps of each optimizer in turn (the trainer's :func:`train_step` on its
model, kernels and optimizer), timing the optimizer's own step inside them (:class:`_Timed`). The
ratios are the median of each round's ratio to AdamW's round (a paired design): a machine whose
speed drifts between rounds, as a shared or virtual one does by 10-20%, slows both sides of a ratio
alike. The clock is the wall clock, which is what a run's tokens/s sees (a CPU-time clock counts
OpenMP's waiting threads as work). BENCHMARKS.md, "Muon's step".
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Any, Callable, Optional

import torch

from ..config.schema import Config, TrainConfig
from ..model.gpt import GPT
from ..runtime.device import (
    CpuThreads,
    emulated_bfloat16_note,
    resolve_device,
    resolve_dtype,
    tune_runtime,
)
from ..runtime.kernels import swap as swap_kernels
from ..trainer.muon import BatchedMuon
from ..trainer.optim import MUON_PLAIN, MuonAdamW, adamw
from ..trainer.step import train_step
from .generation import sync
from .throughput import bench_vocab, busy_warning, random_batches


def _variant(**muon: Any) -> Callable[[torch.nn.Module, TrainConfig], MuonAdamW]:
    """The Muon of ``train.muon`` with the settings ``muon`` changed, for a model."""
    return lambda model, tc: MuonAdamW(
        model, tc.model_copy(update={"muon": tc.muon.model_copy(update=muon)})
    )


def _cautious(model: torch.nn.Module, tc: TrainConfig) -> MuonAdamW:
    """Muon with cautious weight decay, at train.muon.weight_decay or, where that is 0 (when it
    would not decay at all), 0.1: the cost does not depend on the value."""
    return _variant(cautious_weight_decay=True, weight_decay=tc.muon.weight_decay or 0.1)(model, tc)


#: What is compared: name -> the optimizer of a model, from the config's train section with
#: train.muon's variants off (:data:`MUON_PLAIN`): each ``muon+...`` row is that Muon with one
#: variant on.
OPTIMIZERS: dict[str, Callable[[torch.nn.Module, TrainConfig], Any]] = {
    "adamw": lambda model, tc: adamw([p for p in model.parameters() if p.requires_grad], tc),
    "muon": lambda model, tc: MuonAdamW(model, tc, muon_class=BatchedMuon),
    "torch.optim.Muon": lambda model, tc: MuonAdamW(model, tc, muon_class=torch.optim.Muon),
    "muon+polar-express": _variant(coefficients="polar-express"),
    "muon+gram": _variant(ns_method="gram"),
    "muon+normuon": _variant(normuon=True),
    "muon+cautious-wd": _cautious,
}

#: What :func:`bench_optimizers` says.

#: Whole steps of each optimizer per round.
ROUND_STEPS = 5
#: Steps of each optimizer by default: 20 rounds, enough for a 95% interval about +-0.05 wide on
#: this 2-core VM.
DEFAULT_ITERS = 100
#: Fewest rounds with a 95% interval for the median (:func:`median_interval`).
MIN_ROUNDS = 6


def median_interval(values: list[float], confidence: float = 0.95) -> Optional[tuple[float, float]]:
    """A distribution-free confidence interval for the median of ``values``: the j-th smallest and
    j-th largest, with j the largest rank at which P(Binomial(n, 1/2) < j) is at most (1 -
    confidence)/2 (the sign test's interval; Conover, "Practical Nonparametric Statistics", 3rd ed.,
    section 3.2). No assumption on the rounds' spread, which on a machine whose speed drifts is
    neither normal nor steady. Returns None where ``values`` are too few for any interval at
    ``confidence`` (fewer than 6 at 95%)."""
    from scipy.stats import binom

    n, tail = len(values), (1 - confidence) / 2
    j = int(
        binom.ppf(tail, n, 0.5)
    )  # the smallest k with P(X <= k) >= tail, so P(X <= j - 1) < tail
    if binom.cdf(j, n, 0.5) <= tail:
        j += 1
    if j < 1:
        return None
    ordered = sorted(values)
    return ordered[j - 1], ordered[n - j]


class _Timed:
    """An optimizer whose ``step`` adds its seconds to ``seconds`` (after the device's queued work),
    so that a training step's update is timed inside that step; everything else is the
    optimizer's."""

    def __init__(self, optimizer, device: torch.device):
        self.optimizer, self.device, self.seconds = optimizer, device, 0.0

    def __getattr__(self, name: str):
        return getattr(self.optimizer, name)

    def step(self, closure=None):
        sync(self.device)
        t = time.perf_counter()
        self.optimizer.step()
        sync(self.device)
        self.seconds += time.perf_counter() - t


def bench_optimizers(
    cfg: Config, iters: int = DEFAULT_ITERS, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Seconds per training step (forward, backward, clipping, update) and of its update alone, for
    each of :data:`OPTIMIZERS` at ``cfg``'s model and batch (its vocabulary: :func:`bench_vocab`) on
    random tokens, with the ratios to AdamW. ``train.muon``'s own settings hold for every Muon but
    its variants, which are off but in the row of each.

    ``iters`` whole steps of each, rounded up to rounds of :data:`ROUND_STEPS`, after a warm-up
    round (which, on a CPU, decides the thread count from the cores other processes leave free, as
    ``bench`` does). Returns ``step_s``/``optimizer_s``: the median seconds over rounds;
    ``step_ratio``/``optimizer_ratio``: the median of the rounds' ratios to AdamW's; ``rounds``:
    each round's seconds per step, by optimizer; ``step_ratio_interval``: a 95% interval for each
    step ratio but AdamW's own (:func:`median_interval`; None under :data:`MIN_ROUNDS` rounds);
    ``other_cores_busy``: the cores other processes kept busy meanwhile (CPU; None where unknown).
    """
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if note := emulated_bfloat16_note(device, dtype):
        echo(note)
    mc = cfg.model.model_copy(update={"vocab_size": bench_vocab(cfg)})
    tc = cfg.train.model_copy(update={"muon": cfg.train.muon.model_copy(update=MUON_PLAIN)})
    if tc.parallelism == "fsdp":
        echo(
            "note: train refuses Muon with train.parallelism fsdp; "
            "this times one process, unsharded"
        )
    tune_runtime(device)
    threads = CpuThreads(device, echo=echo)
    autocast = (
        torch.autocast(device_type=device.type, dtype=dtype)
        if dtype != torch.float32
        else nullcontext()
    )
    scaler = torch.amp.GradScaler(
        device.type, enabled=device.type == "cuda" and dtype == torch.float16
    )
    it = random_batches(mc.vocab_size, tc.batch_size, mc.block_size, device, cfg.seed)
    runs = {}
    for name, make in OPTIMIZERS.items():
        torch.manual_seed(cfg.seed)
        model = swap_kernels(GPT(mc).to(device)).train()
        runs[name] = (
            model,
            _Timed(make(model, tc), device),
            [p for p in model.parameters() if p.requires_grad],
        )

    def round_of(name: str) -> tuple[float, float]:
        """Seconds per whole step and per update over :data:`ROUND_STEPS` steps of optimizer
        ``name``."""
        model, opt, params = runs[name]
        opt.seconds = 0.0
        sync(device)
        t = time.perf_counter()
        for _ in range(ROUND_STEPS):
            train_step(model, opt, it, tc.grad_accum_steps, autocast, scaler, tc.grad_clip, params)
        sync(device)
        return (time.perf_counter() - t) / ROUND_STEPS, opt.seconds / ROUND_STEPS

    n_rounds = -(-iters // ROUND_STEPS)
    echo(
        f"optimizer step: {n_rounds} round{'s' * (n_rounds != 1)} of {ROUND_STEPS} steps of each "
        f"of {', '.join(runs)} in turn; batch {tc.batch_size} x {mc.block_size} x accum "
        f"{tc.grad_accum_steps}, {sum(p.numel() for p in runs['adamw'][2]):,} parameters, "
        f"{str(dtype).removeprefix('torch.')}, Muon {tc.muon.ns_steps} Newton-Schulz steps, on "
        f"{device}; each muon+X is Muon with variant X alone"
    )
    for name in runs:  # the warm-up round, over which the thread count is decided
        round_of(name)
    if threads.enabled and threads.poll(force=True) != threads.max_threads:
        for name in runs:  # other processes took cores: warm up again with fewer threads
            round_of(name)
    mark = threads.mark() if device.type == "cpu" else None
    rounds: dict[str, dict[str, list[float]]] = {
        "step": {n: [] for n in runs},
        "optimizer": {n: [] for n in runs},
    }
    for _ in range(n_rounds):
        for name in runs:
            seconds, update = round_of(name)
            rounds["step"][name].append(seconds)
            rounds["optimizer"][name].append(update)
    others = busy_warning(threads, mark, "the steps", echo)

    def paired(times: dict[str, list[float]]) -> dict[str, list[float]]:
        return {n: [a / b for a, b in zip(v, times["adamw"])] for n, v in times.items()}

    def ratios(times: dict[str, list[float]]) -> dict[str, float]:
        return {n: statistics.median(v) for n, v in paired(times).items()}

    return {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "ns_steps": tc.muon.ns_steps,
        "round_steps": ROUND_STEPS,
        "n_rounds": n_rounds,
        "other_cores_busy": others,
        "step_s": {n: statistics.median(v) for n, v in rounds["step"].items()},
        "optimizer_s": {n: statistics.median(v) for n, v in rounds["optimizer"].items()},
        "step_ratio": ratios(rounds["step"]),
        "optimizer_ratio": ratios(rounds["optimizer"]),
        "step_ratio_interval": {
            n: median_interval(v) if n != "adamw" else None
            for n, v in paired(rounds["step"]).items()
        },
        "rounds": rounds,
    }


def format_bench_optimizers(result: dict[str, Any]) -> str:
    """The table of :func:`bench_optimizers`: milliseconds, and the ratios to AdamW with their
    spread."""

    def interval(name: str) -> str:
        lo_hi = result["step_ratio_interval"][name]
        return (
            f"{lo_hi[0]:.3f}-{lo_hi[1]:.3f}"
            if lo_hi
            else "-"
            if name == "adamw"
            else f"n/a (<{MIN_ROUNDS} rounds)"
        )

    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'s' * (n != 1)}"

    lines = [
        f"{'optimizer':<18} {'step ms':>8} {'x AdamW':>8} {'95% interval':>17} {'update ms':>10} {'x AdamW':>8}"
    ]
    for name, s in result["step_s"].items():
        lines.append(
            f"{name:<18} {s * 1e3:8.1f} {result['step_ratio'][name]:8.3f} {interval(name):>17} "
            f"{result['optimizer_s'][name] * 1e3:10.2f} {result['optimizer_ratio'][name]:8.2f}"
        )
    per_round = [
        m / a for m, a in zip(result["rounds"]["step"]["muon"], result["rounds"]["step"]["adamw"])
    ]
    lines.append(
        f"muon's step / AdamW's, by round: {', '.join(f'{x:.3f}' for x in per_round)} "
        f"(median {result['step_ratio']['muon']:.3f}, 95% interval {interval('muon')} over "
        f"{plural(result['n_rounds'], 'round')}; {plural(result['threads'], 'thread')})"
    )
    lines.append(
        "step ms: a whole step (forward, backward, clipping, update), the median over rounds; update ms: "
        "the optimizer's step alone"
    )
    lines.append(
        "x AdamW: the median of each round's ratio to AdamW's round (not of the medians); the interval: "
        "the sign test's for that median"
    )
    return "\n".join(lines)
