"""When the learning rate is what, what each step trains on (the batch-size ramp and the
sequence-length warmup, and the tokens and FLOPs they add up to), and when the run evaluates.

No torch here: ``compare`` and ``plot`` count a run's tokens and FLOPs with these functions."""

from __future__ import annotations

import math
from typing import Callable, Iterator, Optional

from ..accounting import params
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


def batch_size_at(step: int, tc: TrainConfig) -> int:
    """Sequences per micro-batch at optimizer step ``step`` (0-based): the batch-size ramp.

    Over ``batch_size_warmup_iters`` = N steps the batch grows linearly in steps from b0 =
    ``batch_size_warmup_start`` (null: batch_size // 4, at least 1) to B = ``batch_size``, rounded
    down to whole sequences: b0 + floor((B - b0)·step / N); from step N on, B (GPT-3, Brown et al.
    2020, App. B, ramps the batch linearly over its first tokens)."""
    n, full = tc.batch_size_warmup_iters, tc.batch_size
    if step >= n:
        return full
    start = ramp_start(tc)
    return start + (full - start) * step // n


def ramp_start(tc: TrainConfig) -> int:
    """The batch-size ramp's first micro-batch, in sequences."""
    start = tc.batch_size_warmup_start
    return start if start is not None else max(1, tc.batch_size // 4)


def block_size_at(step: int, cfg: Config) -> int:
    """Tokens per training window at optimizer step ``step`` (0-based): the sequence-length warmup.

    With m = ``block_size_warmup_multiple``, T = ``model.block_size``, K = ceil(T / m) lengths and
    N = ``block_size_warmup_iters``: m·(1 + floor((K - 1)·step / N)), at most T, so the window
    grows from m to T in K equal stretches of steps, a multiple of m each (the last may be T);
    from step N on, T (Li et al. 2022, "The Stability-Efficiency Dilemma", arXiv 2108.06084)."""
    tc, full = cfg.train, cfg.model.block_size
    n, m = tc.block_size_warmup_iters, tc.block_size_warmup_multiple
    if step >= n:
        return full
    lengths = -(-full // m)
    return min(full, m * (1 + (lengths - 1) * step // n))


def step_sizes(cfg: Config) -> Iterator[tuple[int, int, int, int]]:
    """The steps before both ramps end as stretches of one shape: (first step, end step, batch,
    block), in order, covering 0 .. max(batch_size_warmup_iters, block_size_warmup_iters) (empty:
    no ramp). At most one stretch per size each ramp takes, whatever the number of steps."""
    tc = cfg.train
    n_batch, n_block = tc.batch_size_warmup_iters, tc.block_size_warmup_iters
    end = max(n_batch, n_block)
    # The steps where a size changes: the first step at which each ramp reaches its next value.
    starts = {0, end}
    if n_batch:
        b0, full = ramp_start(tc), tc.batch_size
        starts |= {-(-(v - b0) * n_batch // (full - b0)) for v in range(b0 + 1, full + 1)}
    if n_block:
        lengths = -(-cfg.model.block_size // tc.block_size_warmup_multiple)
        starts |= {-(-(k - 1) * n_block // (lengths - 1)) for k in range(2, lengths + 1)}
    edges = sorted(s for s in starts if s <= end)
    for a, b in zip(edges, edges[1:]):
        yield a, b, batch_size_at(a, tc), block_size_at(a, cfg)


def step_tokens(step: int, cfg: Config, world: int = 1) -> int:
    """Tokens optimizer step ``step`` (0-based) trains on, over ``world`` processes."""
    tc = cfg.train
    return batch_size_at(step, tc) * block_size_at(step, cfg) * tc.grad_accum_steps * world


def tokens_through(steps: int, cfg: Config, world: int = 1) -> int:
    """Tokens trained on in optimizer steps 0 .. ``steps`` - 1, over ``world`` processes: exact
    under the batch-size ramp and the sequence-length warmup."""
    return _through(steps, cfg, world, lambda block: 1)


def train_flops_through(steps: int, cfg: Config, world: int = 1) -> float:
    """Training FLOPs of optimizer steps 0 .. ``steps`` - 1, over ``world`` processes: each step's
    tokens times the training FLOPs per token at its window
    (:func:`~minigpt_cli.accounting.params.flops`, ``train_with_lm_head``: attention's share grows
    with the window)."""
    per_token: dict[int, float] = {}  # by window: a few distinct ones

    def flops(block: int) -> float:
        if block not in per_token:
            per_token[block] = params.flops(cfg.model, block)["train_with_lm_head"]
        return per_token[block]

    return _through(steps, cfg, world, flops)


def _through(steps: int, cfg: Config, world: int, per_token: Callable[[int], float]) -> float:
    """The sum over steps 0 .. ``steps`` - 1 of batch x window x ``per_token(window)``, times the
    accumulation and ``world``: one term per stretch of :func:`step_sizes`, then the full steps."""
    tc = cfg.train
    total, end = 0, 0
    for a, b, batch, block in step_sizes(cfg):
        if a >= steps:
            break
        total += (min(b, steps) - a) * batch * block * per_token(block)
        end = b
    full = cfg.model.block_size
    rest = max(steps - end, 0) * tc.batch_size * full * per_token(full)
    return (total + rest) * tc.grad_accum_steps * world
