"""Muon with one batched Newton-Schulz call per matrix shape: ``torch.optim.Muon``'s arithmetic, fewer kernels.

``torch.optim.Muon`` orthogonalises its matrices one at a time: at ``configs/shakespeare-cpu.yaml``'s size that is
16 matrices of 4 shapes, three small products per iteration each. :class:`BatchedMuon` stacks the matrices of one
shape and runs the iteration on the stack (``torch.baddbmm``), as nanochat's ``MuonAdamW`` and modded-nanogpt do;
each matrix sees the same bfloat16 operations as under ``torch.optim.Muon``, so the updates agree
(tests/test_optim.py holds them equal over several steps). It takes 30% off the update there (BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.optim._muon import _adjust_lr  # torch.optim.Muon's own per-shape scale, so both scale alike


def orthogonalize(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of ``torch.optim.Muon`` on a stack of matrices, in bfloat16.

    ``g``: (B, m, n); returns (B, m, n) bfloat16, each matrix about U·S'·Vᵀ (S' near 1) where U·S·Vᵀ is its SVD
    (Jordan et al. 2024, "Muon: an optimizer for hidden layers"; torch/optim/_muon.py's
    ``_zeropower_via_newtonschulz``, batched: tall matrices are iterated transposed, as there).
    """
    a, b, c = coefficients
    x = g.bfloat16()
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class _Bucket:
    """The matrices of one shape in one group, with their momentum buffers as views of one stacked tensor, so that
    momentum is one operation on the stack rather than one per matrix. ``state[p]["momentum_buffer"]`` holds the
    views (torch.optim.Muon's state, so checkpoints load in either)."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.stack: Optional[torch.Tensor] = None
        self.views: list[torch.Tensor] = []

    def buffers(self, state) -> torch.Tensor:
        """The stacked momentum buffers (zeros before the first step); rebuilt from ``state`` when
        ``load_state_dict`` has put tensors of its own there."""
        if self.stack is None or any(state[p].get("momentum_buffer") is not v for p, v in zip(self.params, self.views)):
            self.stack = torch.stack([state[p]["momentum_buffer"] if "momentum_buffer" in state[p]
                                      else torch.zeros_like(p) for p in self.params])
            self.views = list(self.stack.unbind(0))
            for p, v in zip(self.params, self.views):
                state[p]["momentum_buffer"] = v
        return self.stack


class BatchedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` (same arguments, same ``momentum_buffer`` state, so checkpoints load in either) whose
    step orthogonalises all same-shaped matrices of a group in one :func:`orthogonalize` call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._buckets: dict[tuple, _Bucket] = {}

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step: Nesterov (or plain) momentum, the orthogonalised update, decoupled weight decay."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            shapes: dict[tuple, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    shapes.setdefault((p.shape, p.dtype, p.device), []).append(p)
            for params in shapes.values():
                key = (gi, *map(id, params))
                if key not in self._buckets:
                    self._buckets[key] = _Bucket(params)
                bucket = self._buckets[key]
                bufs = bucket.buffers(self.state)
                grads = torch.stack([p.grad for p in params])
                bufs.lerp_(grads, 1 - momentum)
                update = grads.lerp_(bufs, momentum) if group["nesterov"] else bufs
                ortho = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                adjusted = _adjust_lr(lr, group["adjust_lr_fn"], params[0].shape)
                for p, u in zip(params, ortho.unbind(0)):  # a bfloat16 update into a float32 weight, as Muon adds it
                    if decay:
                        p.mul_(1 - lr * decay)
                    p.add_(u, alpha=-adjusted)
        return loss
