"""Muon with one batched Newton-Schulz call per matrix shape: ``torch.optim.Muon``'s arithmetic, fewer kernels.

``torch.optim.Muon`` orthogonalises its matrices one at a time: at ``configs/shakespeare-cpu.yaml``'s size that is
16 matrices of 4 shapes, three small products per iteration each. :class:`BatchedMuon` stacks the matrices of one
shape and runs the iteration on the stack (``torch.baddbmm``), as nanochat's ``MuonAdamW`` and modded-nanogpt do;
each matrix sees the same bfloat16 operations as under ``torch.optim.Muon``, so the updates agree
(tests/test_optim.py holds them equal over several steps). It takes 30% off the update there (BENCHMARKS.md).
"""

from __future__ import annotations

from collections import defaultdict

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


class BatchedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` (same arguments, same ``momentum_buffer`` state, so checkpoints load in either) whose
    step orthogonalises all same-shaped matrices of a group in one :func:`orthogonalize` call."""

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step: Nesterov (or plain) momentum, the orthogonalised update, decoupled weight decay."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            buckets: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    buckets[(p.shape, p.dtype, p.device)].append(p)
            for params in buckets.values():
                grads = [p.grad for p in params]
                for p in params:
                    if "momentum_buffer" not in self.state[p]:
                        self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
                bufs = [self.state[p]["momentum_buffer"] for p in params]
                torch._foreach_lerp_(bufs, grads, 1 - momentum)
                updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
                ortho = orthogonalize(torch.stack(updates), group["ns_coefficients"], group["ns_steps"], group["eps"])
                torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
                adjusted = _adjust_lr(lr, group["adjust_lr_fn"], params[0].shape)
                for p, u in zip(params, ortho.unbind(0)):  # a bfloat16 update into a float32 weight, as Muon adds it
                    p.add_(u, alpha=-adjusted)
        return loss
