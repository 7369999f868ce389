"""The optimizer ``train.optimizer`` names: AdamW for every parameter, or Muon for the blocks'
matrices and AdamW for the rest (:class:`MuonAdamW`), and the learning rate each group takes from
the schedule."""

from __future__ import annotations

from typing import Any

import torch

from ..config.schema import TrainConfig
from .muon import BatchedMuon


def adamw(params: list[torch.Tensor], tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with weight decay on matrices only (nanoGPT)."""
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    try:  # one fused kernel per step (CUDA; CPU since torch 2.4): measured 7% faster on 2 CPU cores
        return torch.optim.AdamW(
            groups, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), fused=True
        )
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(
            groups, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), foreach=True
        )


def muon_params(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """The names of the trainable parameters Muon updates and those AdamW updates, in
    ``named_parameters`` order.

    Muon: every 2-D matrix inside the blocks (``model.h``) that is not an embedding table. AdamW:
    the embeddings, the output head (tied or not) and every 1-D gain and bias. Muon orthogonalises a
    matrix's update, which suits a hidden layer's map from one activation space to another; an
    embedding's rows are looked up one token at a time and the head's scale sets the logits, so both
    stay with AdamW, as do vectors, which have no matrix to orthogonalise (Jordan et al. 2024, the
    Muon README; Liu et al. 2025, "Muon is Scalable", arXiv 2502.16982).
    """
    embeddings = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()
    }
    hidden = {id(p) for p in model.h.parameters() if p.dim() == 2 and id(p) not in embeddings}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, p in named if id(p) in hidden], [n for n, p in named if id(p) not in hidden]


#: The ``train.muon`` variant settings of plain Muon (``torch.optim.Muon`` has no others).
MUON_PLAIN = {
    "coefficients": "quintic",
    "ns_method": "standard",
    "normuon": False,
    "beta2": 0.95,
    "cautious_weight_decay": False,
}


class MuonAdamW:
    """Muon for the blocks' matrices and AdamW for the rest (:func:`muon_params`), stepped as one
    optimizer.

    Its state dict has ``torch.optim``'s layout, AdamW's parameters first, then Muon's (indices go
    on counting), so a checkpoint's trainer state reads as a single optimizer's. Muon's learning
    rate is AdamW's times ``muon_scale`` (:func:`set_lr`), so both follow the schedule's shape from
    their own base rates.
    """

    def __init__(self, model: torch.nn.Module, tc: TrainConfig, muon_class: type = BatchedMuon):
        by_name = dict(model.named_parameters())
        muon_names, adamw_names = muon_params(model)
        mc = tc.muon
        variants = {
            "coefficients": mc.coefficients,
            "ns_method": mc.ns_method,
            "normuon": mc.normuon,
            "beta2": mc.beta2,
            "cautious_weight_decay": mc.cautious_weight_decay,
        }
        if muon_class is torch.optim.Muon:  # the reference it is compared with: plain Muon only
            assert variants == MUON_PLAIN, variants
            variants = {}
        self.adamw = adamw([by_name[n] for n in adamw_names], tc)
        self.muon = muon_class(
            [by_name[n] for n in muon_names],
            lr=mc.learning_rate,
            weight_decay=mc.weight_decay,
            momentum=mc.momentum,
            nesterov=mc.nesterov,
            ns_steps=mc.ns_steps,
            adjust_lr_fn=mc.adjust_lr,
            **variants,
        )
        self.muon_scale = mc.learning_rate / tc.learning_rate

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.adamw.param_groups + self.muon.param_groups

    @property
    def state(self) -> dict:
        return {**self.adamw.state, **self.muon.state}

    def step(self, closure=None) -> None:
        self.adamw.step()
        self.muon.step()

    @property
    def parts(self) -> list[torch.optim.Optimizer]:
        """The two ``torch.optim`` optimizers it steps (for :func:`step_unless`)."""
        return [self.adamw, self.muon]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)
        self.muon.zero_grad(set_to_none)

    def _split(self) -> int:
        """How many parameters AdamW holds: where Muon's indices start in the joint state dict."""
        return sum(len(g["params"]) for g in self.adamw.param_groups)

    def state_dict(self) -> dict[str, Any]:
        a, m, n = self.adamw.state_dict(), self.muon.state_dict(), self._split()
        return {
            "state": {**a["state"], **{i + n: s for i, s in m["state"].items()}},
            "param_groups": a["param_groups"]
            + [{**g, "params": [i + n for i in g["params"]]} for g in m["param_groups"]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a joint state dict (:meth:`state_dict`'s layout).

        Raises:
            ValueError: another number of parameters or groups (``torch.optim``'s message).
        """
        k, n = len(self.adamw.param_groups), self._split()
        groups = state["param_groups"]
        self.adamw.load_state_dict(
            {
                "state": {i: s for i, s in state["state"].items() if i < n},
                "param_groups": groups[:k],
            }
        )
        self.muon.load_state_dict(
            {
                "state": {i - n: s for i, s in state["state"].items() if i >= n},
                "param_groups": [{**g, "params": [i - n for i in g["params"]]} for g in groups[k:]],
            }
        )


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.Optimizer | MuonAdamW:
    """The optimizer of ``train.optimizer``: AdamW over every trainable parameter, or
    :class:`MuonAdamW`."""
    if tc.optimizer == "muon":
        return MuonAdamW(model, tc)
    return adamw([p for p in model.parameters() if p.requires_grad], tc)


def set_lr(optimizer: torch.optim.Optimizer | MuonAdamW, lr: float) -> None:
    """Set the learning rate of every group to ``lr`` from the schedule (Muon's: ``lr`` times
    ``muon_scale``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    for group in optimizer.muon.param_groups if isinstance(optimizer, MuonAdamW) else []:
        group["lr"] = lr * optimizer.muon_scale


def step_unless(optimizer: torch.optim.Optimizer | MuonAdamW, skip: torch.Tensor) -> None:
    """``optimizer.step()``, leaving every weight, moment and step count as it was where ``skip`` (a
    0-dim float32 tensor on the device: 1.0 skips, 0.0 steps) is 1, decided on the device without a
    host sync.

    It uses torch.amp's ``found_inf`` protocol (``GradScaler.step`` sets the attribute the same
    way): the fused AdamW kernel returns early where it is 1 and takes the step count back;
    :class:`~.muon.BatchedMuon` keeps the old values by ``torch.where``. Where the step is taken the
    arithmetic is that of a plain ``step()``. An AdamW that is not fused (a device without the fused
    kernel) cannot take the flag: the host reads it there, and on a CPU, where the read waits for
    nothing and the plain step skips the masked update's copies (2-3% of the CPU recipe's step).
    """
    parts = optimizer.parts if isinstance(optimizer, MuonAdamW) else [optimizer]
    fused = all(getattr(p, "defaults", {}).get("fused", True) for p in parts)
    if skip.device.type == "cpu" or not fused:
        if not bool(skip):  # a host read: free on a CPU (nothing queued), needed without fusion
            optimizer.step()
        return
    for part in parts:
        part.found_inf = skip
    try:
        optimizer.step()
    finally:
        for part in parts:
            del part.found_inf
