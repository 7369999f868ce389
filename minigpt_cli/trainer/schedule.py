"""When the learning rate is what, and when the run evaluates (what each step trains on:
:mod:`minigpt_cli.accounting.steps`)."""

from __future__ import annotations

import math
from typing import Optional

from ..config.schema import Config, TrainConfig


def lr_at(step: int, tc: TrainConfig, n_embd: int = 512) -> float:
    """Learning rate for optimizer step ``step`` (0-based).

    Linear warmup reaching ``learning_rate`` after ``warmup_iters`` steps and
    above zero on the first (nanoGPT: lr·(step+1)/(warmup+1)), then

    - cosine: half a cosine from learning_rate down to min_lr at lr_decay_iters
      (Loshchilov & Hutter 2017, SGDR, without restarts);
    - linear: a straight line down to min_lr;
    - constant: learning_rate;
    - inverse_sqrt: d^-0.5 · min(s^-0.5, s · warmup^-1.5) with s = step+1,
      scaled by learning_rate (Vaswani et al. 2017 §5.3; learning_rate 1 gives
      the paper's values);
    - wsd (warmup-stable-decay): learning_rate up to :func:`wsd_decay_start`,
      then down to min_lr at max_iters, linearly or as 1 - sqrt of the decay's
      progress (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training
      Beyond Fixed Training Durations", arXiv 2405.18392).
    """
    if tc.lr_schedule == "inverse_sqrt":
        s = step + 1
        w = max(tc.warmup_iters, 1)
        return tc.learning_rate * n_embd**-0.5 * min(s**-0.5, s * w**-1.5)
    if step < tc.warmup_iters:
        return tc.learning_rate * (step + 1) / (tc.warmup_iters + 1)
    if tc.lr_schedule == "constant":
        return tc.learning_rate
    if tc.lr_schedule == "wsd":
        start = wsd_decay_start(tc)
        if step <= start:
            return tc.learning_rate
        ratio = min((step - start) / max(tc.max_iters - start, 1), 1.0)
        coeff = 1.0 - (ratio if tc.decay_shape == "linear" else math.sqrt(ratio))
        return tc.min_lr + coeff * (tc.learning_rate - tc.min_lr)
    decay_iters = tc.lr_decay_iters or tc.max_iters
    if step >= decay_iters:
        return tc.min_lr
    span = max(decay_iters - tc.warmup_iters, 1)
    ratio = (step - tc.warmup_iters) / span
    if tc.lr_schedule == "linear":
        coeff = 1.0 - ratio
    else:
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return tc.min_lr + coeff * (tc.learning_rate - tc.min_lr)


def wsd_decay_start(tc: TrainConfig) -> int:
    """The step at which the wsd schedule starts to decay: ``round(decay_fraction · max_iters)``
    steps before ``max_iters``, and not before the warmup ends.

    Steps up to it run at learning_rate whatever ``max_iters`` is, so a run resumed from a
    checkpoint at step k <= this step with another ``max_iters`` (a cool-down) makes the updates of
    a run trained straight to the new ``max_iters``, as long as k is also at or before that run's
    decay start."""
    return max(tc.warmup_iters, tc.max_iters - round(tc.decay_fraction * tc.max_iters))


def should_eval(step: int, tc: TrainConfig) -> bool:
    """Evaluate before the first step (if ``eval_at_start``), every ``eval_interval`` steps, and
    after the last."""
    if step == 0 and not tc.eval_at_start and tc.max_iters > 0:
        return False
    return step % tc.eval_interval == 0 or step == tc.max_iters


#: The ``train`` keys that shape the learning-rate schedule (:func:`lr_at`).
SCHEDULE_KEYS = (
    "max_iters",
    "learning_rate",
    "min_lr",
    "warmup_iters",
    "lr_decay_iters",
    "lr_schedule",
    "decay_fraction",
    "decay_shape",
)


def schedule_note(cfg: Config, saved: Config, step: int) -> Optional[str]:
    """The note a resume prints when the schedule keys differ from the checkpoint's config, else
    None.

    Resuming with other schedule values is allowed (raising ``max_iters`` is
    how a finished run trains further), but the learning rate from ``step`` on
    follows the new values, so with the default ``lr_decay_iters: null`` the
    cosine stretches to the new ``max_iters`` and the lr jumps at the resume
    step. The note names the changed keys and the lr before and after.
    """
    old, new = saved.train, cfg.train
    muon = (
        new.optimizer == "muon"
    )  # Muon's group: its own base rate on the same shape (optim.set_lr)

    def value(tc, key: str):
        return tc.muon.learning_rate if key == "muon.learning_rate" else getattr(tc, key)

    keys = [*SCHEDULE_KEYS, *(["muon.learning_rate"] if muon else [])]
    changed = [k for k in keys if value(old, k) != value(new, k)]
    if not changed:
        return None
    what = ", ".join(f"train.{k} {value(old, k)} -> {value(new, k)}" for k in changed)

    def rates(tc) -> list[float]:
        lr = lr_at(step, tc, cfg.model.n_embd)
        return [lr, lr * tc.muon.learning_rate / tc.learning_rate] if muon else [lr]

    def jump(lr_old: float, lr_new: float) -> str:
        return "unchanged" if math.isclose(lr_old, lr_new, rel_tol=1e-9) else f"was {lr_old:.3e}"

    (lr_old, *muon_old), (lr_new, *muon_new) = rates(old), rates(new)
    muon_part = "".join(f", Muon's {b:.3e} ({jump(a, b)})" for a, b in zip(muon_old, muon_new))
    return (
        f"note: resuming with {what}; the learning-rate schedule follows the new values "
        f"from here: lr {lr_new:.3e} at step {step} ({jump(lr_old, lr_new)}){muon_part}"
    )
