"""Muon with batched Newton-Schulz iterations: ``torch.optim.Muon``'s arithmetic, fewer and larger
products.

``torch.optim.Muon`` orthogonalises its matrices one at a time: at
``configs/shakespeare-cpu.yaml``'s size that is 16 matrices of 4 shapes, three small products per
iteration each, 240 a step. :class:`BatchedMuon` stacks the matrices of one shape and runs the
iteration on the stack (``torch.baddbmm``), as nanochat's ``MuonAdamW`` and modded-nanogpt do, and
takes the middle product of every stack whose Gram matrices have one size in a single call: 45 a
step there. Each matrix sees the same bfloat16 operations as under ``torch.optim.Muon``, so the
updates agree (tests/test_optim.py holds them equal over several steps). BENCHMARKS.md, "Muon's
step", has the cost.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.optim._muon import (
    _adjust_lr,
)  # torch.optim.Muon's own per-shape scale, so both scale alike


def orthogonalize(
    stacks: Sequence[torch.Tensor], coefficients: tuple[float, float, float], steps: int, eps: float
) -> list[torch.Tensor]:
    """The quintic Newton-Schulz iteration of ``torch.optim.Muon`` on stacks of matrices, in
    bfloat16.

    ``stacks``: tensors of shape (B_i, m_i, n_i); returns one (B_i, m_i, n_i) bfloat16 tensor each,
    every matrix about U·S'·Vᵀ (S' near 1) where U·S·Vᵀ is its SVD (Jordan et al. 2024, "Muon: an
    optimizer for hidden layers"; torch/optim/_muon.py's ``_zeropower_via_newtonschulz``). An
    iteration is X ← aX + (bA + cA²)X with A = XXᵀ. ``torch.optim.Muon`` iterates a tall matrix Y
    transposed; here Y stays as it is and the iteration reads Y ← aY + Y(bA + cA²) with A = YᵀY, the
    same products of the same numbers, since A and bA + cA² are symmetric, so no copy is transposed
    on the way in or out. The bA + cA² of all stacks whose A has one size is one ``torch.baddbmm``
    call.
    """
    a, b, c = coefficients
    xs = []
    for g in stacks:
        x = g.bfloat16()
        xs.append(x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps))  # spectral norm at most 1
    tall = [x.size(-2) > x.size(-1) for x in xs]
    by_side: dict[int, list[int]] = {}  # the side of A -> the stacks with an A of that size
    for i, x in enumerate(xs):
        by_side.setdefault(min(x.shape[-2:]), []).append(i)
    sides = [
        (
            members,
            [xs[i].size(0) for i in members],  # each side's Gram matrices, one buffer for all steps
            torch.empty(
                sum(xs[i].size(0) for i in members),
                side,
                side,
                dtype=torch.bfloat16,
                device=xs[members[0]].device,
            ),
        )
        for side, members in by_side.items()
    ]
    for _ in range(steps):
        for members, sizes, grams in sides:
            for i, gram in zip(members, grams.split(sizes)):
                torch.bmm(xs[i].mT, xs[i], out=gram) if tall[i] else torch.bmm(
                    xs[i], xs[i].mT, out=gram
                )
            polys = torch.baddbmm(grams, grams, grams, beta=b, alpha=c).split(sizes)
            for i, poly in zip(members, polys):
                xs[i] = (
                    torch.baddbmm(xs[i], xs[i], poly, beta=a)
                    if tall[i]
                    else torch.baddbmm(xs[i], poly, xs[i], beta=a)
                )
    return xs


class _Stack:
    """The matrices of one shape in one group, with their momentum buffers as views of one stacked
    tensor, so that momentum is one operation on the stack rather than one per matrix.
    ``state[p]["momentum_buffer"]`` holds the views (torch.optim.Muon's state, so checkpoints load
    in either)."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.stack: Optional[torch.Tensor] = None
        self.views: list[torch.Tensor] = []

    def buffers(self, state) -> torch.Tensor:
        """The stacked momentum buffers (zeros before the first step); rebuilt from ``state`` when
        ``load_state_dict`` has put tensors of its own there."""
        if self.stack is None or any(
            state[p].get("momentum_buffer") is not v for p, v in zip(self.params, self.views)
        ):
            self.stack = torch.stack(
                [
                    state[p]["momentum_buffer"]
                    if "momentum_buffer" in state[p]
                    else torch.zeros_like(p)
                    for p in self.params
                ]
            )
            self.views = list(self.stack.unbind(0))
            for p, v in zip(self.params, self.views):
                state[p]["momentum_buffer"] = v
        return self.stack


class BatchedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` (same arguments, same ``momentum_buffer`` state, so checkpoints load in
    either) whose step orthogonalises all the matrices of a group in one :func:`orthogonalize`
    call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stacks: dict[tuple, list[_Stack]] = {}

    def _stacks_of(self, gi: int, group: dict) -> list[_Stack]:
        """The group's matrices that have a gradient, stacked by shape (kept from step to step)."""
        live = [p for p in group["params"] if p.grad is not None]
        key = (gi, *map(id, live))
        if key not in self._stacks:
            shapes: dict[tuple, list[torch.Tensor]] = {}
            for p in live:
                shapes.setdefault((p.shape, p.dtype, p.device), []).append(p)
            self._stacks[key] = [_Stack(params) for params in shapes.values()]
        return self._stacks[key]

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step: Nesterov (or plain) momentum, the orthogonalised update, decoupled weight
        decay.

        With a ``found_inf`` attribute (a 0-dim float32 tensor, torch.amp's protocol, set by
        :func:`~.optim.step_unless`) of 1.0 every momentum buffer and weight keeps its value, chosen
        on the device by ``torch.where``; each new value is computed out of place by the same
        operations as in place, so a step that is taken is the same to the bit."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        keep = None if found_inf is None else found_inf.bool()
        for gi, group in enumerate(self.param_groups):
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            stacks = self._stacks_of(gi, group)
            updates = []
            for s in stacks:
                bufs = s.buffers(self.state)
                grads = torch.stack([p.grad for p in s.params])
                # In place when every step is taken (no flag): the copies of the masked path cost
                # ~10% of the optimizer step on a CPU, and the values are the same.
                moved = (
                    bufs.lerp_(grads, 1 - momentum)
                    if keep is None
                    else bufs.lerp(grads, 1 - momentum)
                )
                updates.append(grads.lerp_(moved, momentum) if group["nesterov"] else moved)
                if keep is not None:
                    _assign(bufs, moved, keep)
            orthos = orthogonalize(
                updates, group["ns_coefficients"], group["ns_steps"], group["eps"]
            )
            for s, ortho in zip(stacks, orthos):
                alpha = -_adjust_lr(lr, group["adjust_lr_fn"], s.params[0].shape)
                if keep is None:
                    if decay:
                        torch._foreach_mul_(s.params, 1 - lr * decay)
                    # a bfloat16 update into a float32 weight, as Muon adds it
                    torch._foreach_add_(s.params, ortho.unbind(0), alpha=alpha)
                    continue
                new = torch._foreach_mul(s.params, 1 - lr * decay) if decay else list(s.params)
                new = torch._foreach_add(new, ortho.unbind(0), alpha=alpha)
                for p, value in zip(s.params, new):
                    _assign(p, value, keep)
        return loss


def _assign(old: torch.Tensor, new: torch.Tensor, keep: Optional[torch.Tensor]) -> None:
    """``old`` ← ``new`` in place, unless ``keep`` (a 0-dim bool tensor) is true: then ``old``
    stays."""
    old.copy_(new if keep is None else torch.where(keep, old, new))
