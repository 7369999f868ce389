"""Faster kernels for the model's layers, swapped into a built model by whoever wants them.

The model (:mod:`minigpt_cli.model.gpt`) is architecture only and computes with
PyTorch's own modules. A command that wants other kernels replaces the
modules after building the model: the trainer, ``bench`` and ``generate``
call :func:`swap`. A swapped module keeps the same parameters (the same
tensors), so state-dict keys, weight tying and checkpoints are unchanged.

- :mod:`.onednn`: float32 linear layers on oneDNN (``MINIGPT_ONEDNN``);
- :mod:`.dropout`: dropout and causal attention with dropout on CPUs (``MINIGPT_FAST_DROPOUT``).
"""

from __future__ import annotations

import torch.nn as nn

from . import dropout, onednn


def check_settings() -> None:
    """Refuse a value of ``MINIGPT_ONEDNN`` or ``MINIGPT_FAST_DROPOUT`` that is neither on nor off, before any work.

    Raises:
        MinigptError: naming the variable and the values it takes.
    """
    onednn.requested()
    dropout.requested()


def swap(model: nn.Module) -> nn.Module:
    """Both swaps, each as its environment variable says: oneDNN linear layers and the fast dropout.

    Returns:
        ``model``, changed in place.

    Raises:
        MinigptError: ``MINIGPT_ONEDNN`` or ``MINIGPT_FAST_DROPOUT`` is neither on nor off.
    """
    return dropout.swap_dropout(onednn.swap_linears(model))
