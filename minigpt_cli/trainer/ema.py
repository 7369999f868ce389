"""Weight EMA: an exponential moving average of the weights, kept on the device beside them.

After each optimizer step ``ema ← ema + (1 - decay)·(w - ema)``, i.e. ``decay·ema +
(1 - decay)·w``
(Polyak & Juditsky 1992, "Acceleration of stochastic approximation by averaging", in the
exponential form of torch.optim.swa_utils' ``get_ema_multi_avg_fn``). Up to ``train.ema_start``
the average equals the weights.
Evals and samples run on it (:meth:`WeightEMA.applied`), and each checkpoint saves it beside the
weights (``ema.safetensors``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping

import torch


class WeightEMA:
    """The moving average of a model's parameters, one float tensor per parameter (tied ones once),
    named as the checkpoint's ``model.safetensors`` names them.

    Not torch.optim.swa_utils.AveragedModel: its update reads its step count on the host, and it
    cannot leave a step out on the device (a skipped step)."""

    def __init__(self, model: torch.nn.Module, decay: float, start: int = 0):
        # named_parameters lists a tied weight once, under its first name (wte.weight): the names
        # of model_state, which drops the tied lm_head.weight.
        named = list(model.named_parameters())
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.shadow = [p.detach().clone() for p in self.params]
        self.decay, self.start = decay, start

    @torch.no_grad()
    def update(self, step: int, skipped: torch.Tensor) -> None:
        """Fold in the weights after optimizer step ``step`` (1-based: the steps taken so far).
        ``skipped`` (a 0-dim device tensor, 1.0 where the step's update was skipped) zeroes the
        weight of the fold, so a skipped step leaves the average as it was; nothing is read on the
        host."""
        rate = 1.0 if step <= self.start else 1.0 - self.decay
        # lerp with weight 1 is the weights exactly, with weight 0 the average exactly.
        weight = (1.0 - skipped.float()) * rate
        torch._foreach_lerp_(self.shadow, [p.detach() for p in self.params], weight)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the average inside, its own weights again (bit for bit) after."""
        with torch.no_grad():
            kept = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.detach() for p in self.params], self.shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.detach() for p in self.params], kept)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The average by parameter name, on the CPU (what ``ema.safetensors`` holds)."""
        return {n: t.detach().contiguous().cpu() for n, t in zip(self.names, self.shadow)}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take the average from a checkpoint's ``ema.safetensors`` (names checked there)."""
        for name, t in zip(self.names, self.shadow):
            t.copy_(state[name])
