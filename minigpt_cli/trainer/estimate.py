"""How long the run will take: before it, from a few timed steps of a throwaway model
(:func:`run_estimate`); during it, measured on its first eval batches and first optimizer steps
(:class:`TimeEstimate`)."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from typing import Callable, Optional

from ..accounting.steps import full_steps
from ..config.schema import Config, TrainConfig
from ..data.pipeline import full_eval_steps

#: Eval batches timed before the first, rough figure (said during the first eval, long before it
#: ends).
FIRST_BATCHES = 3
#: Optimizer steps timed for the measured figure, after the first (which pays for warm-up and
#: compilation).
MEASURED_STEPS = 5
#: Estimates shorter than this go to train.log only; longer ones are also said.
SAY_FROM_S = 60.0
#: On a CPU, a run longer than this gets a line naming the CPU recipe.
LONG_ON_CPU_S = 30 * 60.0
#: A training step costs about 3 forward passes per micro-batch: the backward pass is about twice the
#: forward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1: C ≈ 6N per token, 2N forward).
STEP_PER_FORWARD = 3.0

#: The recipes sized for a CPU, by config name (the speedrun's included: its nanogpt-gpu recipe is
#: an hour long there on purpose): a long run of one of them gets no pointer to the CPU recipe.
CPU_RECIPES = (
    "shakespeare-cpu",
    "shakespeare-cpu-long",
    "speedrun-nanogpt-cpu",
    "speedrun-nanogpt-gpu",
)
CPU_RECIPE = (
    "note: that is long for a CPU; configs/shakespeare-cpu.yaml is the recipe sized for one "
    "(under a minute on 2 cores; shakespeare-cpu-long.yaml: 3 minutes)"
)


def human_seconds(seconds: float) -> str:
    """``40 s``, ``12 min``, ``7.2 h``: a duration in the unit a person would say."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def evals_left(tc: TrainConfig, step: int, evaluated: bool) -> int:
    """The evals still to run from ``step`` to ``max_iters`` (:func:`~.schedule.should_eval`'s
    points)."""
    if step > tc.max_iters:
        return 0
    first = math.ceil(step / tc.eval_interval) * tc.eval_interval
    count = (tc.max_iters - first) // tc.eval_interval + 1 if first <= tc.max_iters else 0
    count += tc.max_iters % tc.eval_interval != 0
    if step == 0 and not tc.eval_at_start and tc.max_iters > 0:
        count -= 1
    elif evaluated and (step % tc.eval_interval == 0 or step == tc.max_iters):
        count -= 1  # the eval at this step already ran
    return max(count, 0)


def eval_batches(cfg: Config, val_tokens: Optional[int], world: int = 1) -> int:
    """Micro-batches one process reads at each eval: ``eval_iters × grad_accum_steps`` a split, or
    for the val split with ``train.eval_full_val`` its whole windows
    (:func:`~minigpt_cli.data.pipeline.full_eval_steps`; ``val_tokens`` None, not known yet: counted
    as a sampled split)."""
    tc = cfg.train
    sampled = tc.eval_iters * tc.grad_accum_steps
    if not tc.eval_full_val or val_tokens is None:
        return 2 * sampled
    return sampled + full_eval_steps(val_tokens, cfg.model.block_size, tc.batch_size, world)


class TimeEstimate:
    """The run's remaining wall time, from its own first eval batches and optimizer steps."""

    def __init__(
        self,
        tc: TrainConfig,
        step: int,
        evaluated: bool,
        batches_per_eval: int,
        on_cpu: bool,
        say: Callable[[str], None],
        log: Callable[[str], None],
        full_steps: Optional[Callable[[int, int], float]] = None,
        ramp_end: int = 0,
    ):
        """``on_cpu``: whether a long run gets the line naming the CPU recipe (a CPU run of another
        config). ``full_steps(a, b)``: steps a .. b - 1 counted as steps past the batch-size ramp
        and sequence-length warmup (:func:`~.schedule.full_steps`); None: b - a. ``ramp_end``: the
        first step past both ramps (0: none), after which the steps are timed again."""
        self.tc, self.step0, self.evaluated0 = tc, step, evaluated
        self.full_steps = full_steps or (lambda a, b: float(max(b - a, 0)))
        self.batches_per_eval, self.on_cpu, self.say, self.log = batches_per_eval, on_cpu, say, log
        self.batch_s: Optional[float] = None  # one eval micro-batch
        self._first_s = 0.0  # when the first batch of the current eval ended
        self.step_times: list[float] = []
        self.said_rough = self.said_measured = self.said_cpu = False
        # Inside a ramp the measured figure scales small steps by their FLOPs, but the optimizer's
        # update costs the same at every size: at the nanogpt-gpu recipe's sequence-length warmup
        # it said 50 minutes for a 25-minute run. Steps past the ramp are timed once more.
        self.ramp_end = ramp_end if ramp_end > step else 0
        self.full_times: list[float] = []

    def eval_batch(self, done: int, seconds: float) -> None:
        """An eval batch ended: ``done`` batches of this eval in ``seconds``."""
        if done == 1:
            self._first_s = seconds
            self.batch_s = self.batch_s if self.batch_s is not None else seconds
            return
        self.batch_s = (seconds - self._first_s) / (done - 1)
        if done == FIRST_BATCHES + 1 and not (self.said_rough or self.step_times):
            self.said_rough = True
            step_s = STEP_PER_FORWARD * self.tc.grad_accum_steps * self.batch_s
            self._tell(
                self._seconds_left(self.step0, step_s, self.evaluated0),
                "from the first eval batches",
            )

    def step_done(self, step: int, seconds: float) -> None:
        """Optimizer step ``step`` took ``seconds`` (evals excluded)."""
        if self.said_measured:
            self._past_ramp(step, seconds)
            return
        self.step_times.append(seconds)
        if len(self.step_times) == MEASURED_STEPS + 1:
            self.said_measured = True
            # Seconds of a full step: the timed steps may be smaller ones, inside a ramp.
            step_s = sum(self.step_times[1:]) / self.full_steps(step - MEASURED_STEPS, step)
            self._tell(
                self._seconds_left(step, step_s, False),
                f"{self.tc.max_iters - step:,} steps at {step_s:.3g} s" + self._evals_part(step),
            )

    def _past_ramp(self, step: int, seconds: float) -> None:
        """Time :data:`MEASURED_STEPS` full steps after the first past the ramps (a new shape's
        warm-up), and say the estimate again from them."""
        if not self.ramp_end or step <= self.ramp_end + 1:
            return
        self.full_times.append(seconds)
        if len(self.full_times) == MEASURED_STEPS:
            self.ramp_end = 0
            step_s = sum(self.full_times) / MEASURED_STEPS
            self._tell(
                self._seconds_left(step, step_s, False),
                f"{self.tc.max_iters - step:,} steps at {step_s:.3g} s"
                + self._evals_part(step)
                + ", timed past the ramps",
            )

    def _eval_s(self, step_s: float) -> float:
        batch_s = (
            self.batch_s
            if self.batch_s is not None
            else step_s / (STEP_PER_FORWARD * self.tc.grad_accum_steps)
        )
        return self.batches_per_eval * batch_s

    def _evals_part(self, step: int) -> str:
        n = evals_left(self.tc, step, False)
        return (
            f" and {n} eval{'s' * (n != 1)} at {human_seconds(self._eval_s(0.0))}"
            if n and self.batch_s
            else ""
        )

    def _seconds_left(self, step: int, step_s: float, evaluated: bool) -> float:
        steps = self.full_steps(step, self.tc.max_iters)
        return steps * step_s + evals_left(self.tc, step, evaluated) * self._eval_s(step_s)

    def _tell(self, seconds: float, how: str) -> None:
        line = f"note: about {human_seconds(seconds)} to go ({how})"
        self.log(line.removeprefix("note: "))
        if seconds >= SAY_FROM_S:
            self.say(line)
        if self.on_cpu and seconds > LONG_ON_CPU_S and not self.said_cpu:
            self.said_cpu = True
            self.say(CPU_RECIPE)
            self.log(CPU_RECIPE.removeprefix("note: "))


#: A timed micro-batch of the whole train.batch_size is run only when one sequence's step predicts it under
#: this many seconds; else one sequence's time is scaled by the batch (a CPU at the GPU recipe's size).
WHOLE_BATCH_UNDER_S = 1.0


def _timed(fn: Callable[[], None], device, repeats: int = 2) -> float:
    """The fastest of ``repeats`` calls of ``fn``, in seconds, the device's queue drained around
    each."""
    import torch

    def sync() -> None:  # the device's queued kernels done: the time is theirs, not their launch's
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()

    best = math.inf
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def _one_thread_if_faster(timed: Callable[[], float], seconds: float) -> float:
    """``seconds`` of a micro-batch on the threads :class:`~minigpt_cli.runtime.device.CpuThreads`
    picked, or its time on one thread (``timed``), which is then kept, where that is faster. The
    pick reads the machine's load over a small model's warm-up, a few milliseconds of
    ``/proc/stat``'s 10 ms ticks: beside a busy process it can keep 2 threads, whose spinning made a
    tiny model's step 45 times slower (0.17 s against 0.0038), where train, measuring over 2 s,
    drops to one."""
    import torch

    many = torch.get_num_threads()
    torch.set_num_threads(1)
    single = timed()
    if single < seconds:
        return single
    torch.set_num_threads(many)
    return seconds


def step_seconds(cfg: Config, device, dtype) -> tuple[float, float, float, str]:
    """Seconds of one optimizer step of ``cfg``'s model on ``device`` (its forward-backward passes,
    then its optimizer update) and of one eval micro-batch, and how they were timed, from a few
    steps of a throwaway model on random tokens (eager: no compile, one process), on as many CPU
    threads as the other processes leave cores (as train's :class:`CpuThreads` picks), or on one
    where that is faster (:func:`_one_thread_if_faster`).

    The step is ``grad_accum_steps`` forward-backward passes of ``train.batch_size`` sequences of
    ``block_size`` tokens and one optimizer step; a pass of one sequence is timed and scaled by the
    batch when the whole batch would take long (:data:`WHOLE_BATCH_UNDER_S`); an eval batch is a
    forward pass, a third of a forward-backward (:data:`STEP_PER_FORWARD`)."""
    import torch

    from ..model.gpt import GPT
    from ..runtime.device import CpuThreads
    from ..runtime.kernels import swap as swap_kernels
    from .optim import make_optimizer

    mc, tc = cfg.model, cfg.train
    model = swap_kernels(GPT(mc)).to(device).train()
    optimizer = make_optimizer(model, tc)
    autocast = torch.autocast(device.type, dtype) if dtype != torch.float32 else nullcontext()

    def pass_of(batch: int) -> Callable[[], None]:
        x = torch.randint(0, mc.vocab_size, (batch, mc.block_size), device=device)

        def run() -> None:
            with autocast:
                _, loss = model(x, x)
            loss.backward()

        return run

    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients stay for the next timed update

    threads = CpuThreads(device)
    try:
        # One thread meanwhile: the warm-up measures the other processes' load without fighting it.
        if threads.enabled:
            torch.set_num_threads(1)
        pass_of(1)()  # warm-up: the first call allocates and picks kernels
        update()
        threads.poll(force=True)  # the thread count train's own CpuThreads would pick now
        one = _timed(pass_of(1), device)
        whole = one * tc.batch_size < WHOLE_BATCH_UNDER_S
        batch = tc.batch_size if whole else 1

        def micro_batch() -> float:
            return _timed(pass_of(batch), device) * (tc.batch_size // batch)

        micro = micro_batch() if whole else one * tc.batch_size  # the pass just timed, scaled
        if threads.enabled and torch.get_num_threads() > 1:
            micro = _one_thread_if_faster(micro_batch, micro)
        how = f"batch {tc.batch_size}" if whole else f"1 sequence, times {tc.batch_size}"
        opt_s = _timed(update, device)
    finally:
        threads.restore()
    return micro * tc.grad_accum_steps, opt_s, micro / STEP_PER_FORWARD, how


def run_estimate(
    cfg: Config,
    device,
    dtype,
    step: int = 0,
    evaluated: bool = False,
    val_tokens: Optional[int] = None,
) -> tuple[list[str], float]:
    """What ``train`` and ``--dry-run`` say before training: the run's time on ``device`` from
    ``step`` on (:func:`step_seconds`; ``about 7.2 h on cpu (...)``), then on a CPU, past
    :data:`LONG_ON_CPU_S`, the note naming the CPU recipe; and that time in seconds.
    ``val_tokens``: the val split's size, which ``train.eval_full_val`` scores whole at each eval
    (None: not known)."""
    tc = cfg.train
    passes_s, update_s, batch_s, how = step_seconds(cfg, device, dtype)
    step_s = passes_s + update_s
    if device.type == "cuda":  # the throwaway model's memory back to the device, for the run's
        import torch

        torch.cuda.empty_cache()
    steps, evals = max(tc.max_iters - step, 0), evals_left(tc, step, evaluated)
    eval_s = eval_batches(cfg, val_tokens) * batch_s  # the train and val splits
    # A ramp's smaller steps cost their share of a full step's passes, by FLOPs; the optimizer's
    # update costs the same at every size (Muon's was a fifth of the nanogpt-gpu recipe's step).
    total = full_steps(step, tc.max_iters, cfg) * passes_s + steps * update_s + evals * eval_s
    lines = [
        f"about {human_seconds(total)} on {device.type} ({steps:,} steps at {step_s:.3g} s, "
        f"{evals} eval{'s' * (evals != 1)} at {human_seconds(eval_s)}; timed from a few "
        f"{'eager ' if cfg.compile else ''}steps of {how})"
    ]
    if device.type == "cpu" and total > LONG_ON_CPU_S and cfg.name not in CPU_RECIPES:
        lines.append(CPU_RECIPE)
    return lines, total
