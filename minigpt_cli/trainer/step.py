"""One optimizer step and the loss estimate: the trainer's arithmetic (the optimizer: :mod:`.optim`)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Iterable, Iterator, Mapping, Optional

import torch

from ..runtime.distributed import Dist, all_sum


@torch.no_grad()
def estimate_loss(
    model: torch.nn.Module,
    splits: Mapping[str, Iterable[tuple[torch.Tensor, torch.Tensor]]],
    n_windows: int,
    autocast,
    d: Dist = Dist(),
    should_stop: Optional[Callable[[], bool]] = None,
) -> Optional[dict[str, float]]:
    """Mean loss per window of each split, in eval mode, without gradients; None when ``should_stop`` (asked
    before every batch, the same answer on every rank) cut it short. Sums are float64, taken over the ranks
    before dividing, so the result does not depend on how the ``n_windows`` were split into micro-batches
    or processes."""
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
                part = loss.detach().double() * x.size(0)
                total = part if total is None else total + part
            out[split] = (all_sum(total, d) / n_windows).item()
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
) -> tuple[torch.Tensor, bool]:
    """One optimizer step over ``accum`` micro-batches; returns (this process's mean loss, whether it was applied).

    DDP syncs gradients on the last micro-step only; FSDP reduce-scatters at every one (whole gradients would
    cost the memory sharding saves). A non-finite loss or gradient skips the update; under torchrun the
    processes decide together, on the sum of their losses, so that none steps alone.
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
    finite = bool(
        torch.isfinite(all_sum(loss_sum, dist))
    )  # one host sync per optimizer step, none per micro-step
    if finite and grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
        finite = bool(torch.isfinite(norm))
    if finite:
        scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, finite
