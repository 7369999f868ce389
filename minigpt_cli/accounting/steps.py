"""What each optimizer step trains on under the batch-size ramp and the sequence-length warmup
(``train.batch_size_warmup_*``, ``train.block_size_warmup_*``), and the tokens and training FLOPs
the steps add up to: the trainer's sampler and accounting, the time estimates, ``compare`` and
``plot`` all count with these. No torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

from . import params

if TYPE_CHECKING:  # pragma: no cover - typing only; keeps pydantic out of the import
    from ..config.schema import Config, TrainConfig


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


def full_steps(start: int, end: int, cfg: Config) -> float:
    """Optimizer steps ``start`` .. ``end`` - 1 as a number of steps past the ramps, by their
    training FLOPs (:func:`train_flops_through`): ``end - start`` without a ramp; what the time
    estimates multiply a full step's seconds by."""
    tc = cfg.train
    if not (tc.batch_size_warmup_iters or tc.block_size_warmup_iters):
        return float(max(end - start, 0))
    T = cfg.model.block_size
    full = (
        tc.batch_size * T * tc.grad_accum_steps * params.flops(cfg.model, T)["train_with_lm_head"]
    )
    between = train_flops_through(end, cfg) - train_flops_through(start, cfg)
    return max(between, 0) / full


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
