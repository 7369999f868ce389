"""One optimizer step and the loss estimate: the trainer's arithmetic (the optimizer:
:mod:`.optim`)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Iterable, Iterator, Mapping, Optional

import torch

from ..runtime.distributed import Dist, all_sum
from .optim import step_unless


@torch.no_grad()
def estimate_loss(
    model: torch.nn.Module,
    splits: Mapping[str, Iterable[tuple[torch.Tensor, torch.Tensor]]],
    autocast,
    d: Dist = Dist(),
    should_stop: Optional[Callable[[], bool]] = None,
) -> Optional[dict[str, float]]:
    """Mean loss per scored token of each split's batches (x, y), in eval mode, without gradients;
    targets of -1 are not scored (the loss's ``ignore_index``; a batch may score none). None when
    ``should_stop`` (asked before every batch, the same answer on every rank) cut it short. Each
    batch's mean loss is weighted by its scored targets; the sums are float64, taken over the ranks
    before dividing, so the result does not depend on how the windows were split into micro-batches
    or processes. The host reads each split's sums once, at its end."""
    model.eval()
    out = {}
    try:
        for split, batches in splits.items():
            total = None
            for x, y in batches:
                if should_stop is not None and should_stop():
                    return None
                with autocast:
                    _, loss = model(x, y)
                scored = (y >= 0).sum().double()
                # where no target is scored the mean is 0/0: that batch adds nothing
                part = torch.stack([torch.where(scored > 0, loss.double() * scored, 0.0), scored])
                total = part if total is None else total + part
            loss_sum, count = all_sum(total, d).tolist()
            out[split] = loss_sum / count
    finally:
        model.train()
    return out


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator,
    accum: int,
    autocast,
    scaler: torch.amp.GradScaler,
    grad_clip: float,
    params: list[torch.Tensor],
    dist: Dist = Dist(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``accum`` micro-batches; returns (this process's mean loss, skipped),
    both 0-dim tensors on the device that nothing here reads: the host never waits on the step.

    ``skipped`` is float32 1.0 where the loss or the gradient norm was not finite (the norm only
    with ``grad_clip`` > 0), else 0.0. Such a step's update is skipped on the device
    (:func:`~.optim.step_unless`): weights, moments and step counts stay as they were. Under
    torchrun the processes decide together, on the sum of their losses (and on the norm of the
    all-reduced gradients), so that none steps alone. DDP syncs gradients on the last micro-step
    only; FSDP reduce-scatters at every one (whole gradients would cost the memory sharding saves).
    """
    loss_sum = None
    for micro in range(accum):
        x, y = next(batches)
        sync = nullcontext()
        if hasattr(model, "no_sync") and micro < accum - 1:
            sync = model.no_sync()
        with sync:
            with autocast:
                _, loss = model(x, y)
                loss = loss / accum
            scaler.scale(loss).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    scaler.unscale_(optimizer)  # gradients unscaled before clipping (a no-op without a scaler)
    finite = torch.isfinite(all_sum(loss_sum, dist))
    if grad_clip > 0:
        # Clipping by a non-finite norm makes the gradients NaN; harmless, as that step's update is
        # skipped.
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
        finite = finite & torch.isfinite(_whole(norm))
    skipped = (~finite).float()
    overflow = skipped
    if scaler.is_enabled() and grad_clip <= 0:
        # float16's scaler skips overflowing gradients too, without counting them (as scaler.step
        # did).
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        overflow = torch.maximum(skipped, (~torch.isfinite(_whole(norm))).float())
    step_unless(optimizer, overflow)
    scaler.update()  # a smaller scale after an overflow; unscale_ recorded it on the device
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, skipped


def _whole(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm as a plain tensor: under FSDP it is a DTensor, whose whole value each rank
    takes."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class Prefetcher:
    """A :class:`~minigpt_cli.data.pipeline.BatchSampler` one batch ahead: each ``next`` hands out
    the batch drawn before and draws the following one, whose pinned, ``non_blocking`` copy to the
    GPU is queued while the device still runs the work already sent (the step never waits on the
    host, so the host is ahead).

    :meth:`state` is the sampler's state before the batch held, so a checkpoint resumes at the batch
    the next step takes, as without the prefetch; the batches are the sampler's, in its order."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.ahead: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.before: Optional[torch.Tensor] = None  # the sampler's state before drawing `ahead`

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.ahead if self.ahead is not None else self.sampler.next()
        self.before = self.sampler.state()
        self.ahead = self.sampler.next()
        return batch

    def state(self) -> torch.Tensor:
        return self.before if self.ahead is not None else self.sampler.state()

    def set_state(self, state: torch.Tensor, step: int = 0) -> None:
        self.sampler.set_state(state, step)
        self.ahead = self.before = None
