"""Faster kernels swapped into a built model (the model itself computes with PyTorch's own modules).

A swapped module keeps the same parameter tensors, so state-dict keys, weight tying and checkpoints
are unchanged.

- :mod:`.onednn`: float32 linear layers on oneDNN (``MINIGPT_ONEDNN``);
- :mod:`.dropout`: dropout and causal attention with dropout on CPUs (``MINIGPT_FAST_DROPOUT``)."""

from __future__ import annotations

import torch.nn as nn

from . import dropout, onednn


def check_settings() -> None:
    """Refuse a value of ``MINIGPT_ONEDNN`` or ``MINIGPT_FAST_DROPOUT`` that is neither on nor off,
    before any work (MinigptError naming the variable and its values)."""
    onednn.requested()
    dropout.requested()


def swap(model: nn.Module) -> nn.Module:
    """Both swaps, each as its environment variable says (oneDNN linear layers, the fast dropout);
    returns ``model``, changed in place; MinigptError for a variable neither on nor off."""
    return dropout.swap_dropout(onednn.swap_linears(model))
