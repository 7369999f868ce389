"""Which device and dtype a run uses (DESIGN §2: ``device``, ``dtype``)."""

from __future__ import annotations

import torch

from .errors import MinigptError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA, then MPS, then CPU; an explicit device must exist.

    Raises:
        MinigptError: the named device is not available on this machine.
    """
    import re

    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        raise MinigptError(f"device {name!r} is not one of auto, cpu, cuda, cuda:N, mps")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise MinigptError(f"device: {name} was asked for, but this machine has no CUDA GPU; use device: auto or cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise MinigptError(
                f"device: {name} was asked for, but this machine has {torch.cuda.device_count()} CUDA GPU(s); "
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise MinigptError("device: mps was asked for, but MPS is not available here; use device: auto or cpu")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA where supported, else float16 on CUDA, float32 elsewhere."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
