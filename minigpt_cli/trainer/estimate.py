"""How long the run will take: measured on its first eval batches and first optimizer steps, said once known."""

from __future__ import annotations

import math
from typing import Callable, Optional

from ..config.schema import TrainConfig

#: Eval batches timed before the first, rough figure (said during the first eval, long before it ends).
FIRST_BATCHES = 3
#: Optimizer steps timed for the measured figure, after the first (which pays for warm-up and compilation).
MEASURED_STEPS = 5
#: Estimates shorter than this go to train.log only; longer ones are also said.
SAY_FROM_S = 60.0
#: On a CPU, a run longer than this gets a line naming the CPU recipe.
LONG_ON_CPU_S = 30 * 60.0
#: A training step costs about 3 forward passes per micro-batch: the backward pass is about twice the
#: forward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1: C ≈ 6N per token, 2N forward).
STEP_PER_FORWARD = 3.0

#: The CPU recipes by config name: a run of one of them made long on purpose gets no pointer to them.
CPU_RECIPES = ("shakespeare-cpu", "shakespeare-cpu-long")
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
    """The evals still to run from ``step`` to ``max_iters`` (:func:`~.schedule.should_eval`'s points)."""
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
    ):
        """``on_cpu``: whether a long run gets the line naming the CPU recipe (a CPU run of another config)."""
        self.tc, self.step0, self.evaluated0 = tc, step, evaluated
        self.batches_per_eval, self.on_cpu, self.say, self.log = batches_per_eval, on_cpu, say, log
        self.batch_s: Optional[float] = None  # one eval micro-batch
        self._first_s = 0.0  # when the first batch of the current eval ended
        self.step_times: list[float] = []
        self.said_rough = self.said_measured = self.said_cpu = False

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
            return
        self.step_times.append(seconds)
        if len(self.step_times) == MEASURED_STEPS + 1:
            self.said_measured = True
            step_s = sum(self.step_times[1:]) / MEASURED_STEPS
            self._tell(
                self._seconds_left(step, step_s, False),
                f"{self.tc.max_iters - step:,} steps at {step_s:.3g} s" + self._evals_part(step),
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
        steps = max(self.tc.max_iters - step, 0)
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
