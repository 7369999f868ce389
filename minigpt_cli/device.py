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


# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_runtime(device: torch.device) -> None:
    """Per-process settings that make training and sampling faster on ``device``.

    CUDA: TF32 matrix products and convolutions (nanoGPT's settings; float32
    matmuls keep float32 storage and a 10-bit mantissa inside the tensor cores).

    CPU on glibc: keep freed memory in the process. By default glibc serves
    large blocks (activations of a few MiB) with ``mmap`` and returns them to
    the OS when freed, so each training step faults the same pages back in
    (zero-filled by the kernel: a few hundred page faults a step for the
    4-layer CPU recipe). Raising the mmap threshold to its maximum (32 MiB on
    64-bit) and the trim threshold to 1 GiB keeps those blocks for reuse, as
    the jemalloc/tcmalloc preload of Intel's PyTorch CPU tuning guide does.
    Elsewhere (macOS, musl) nothing is changed.
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device.type == "cpu":
        import ctypes
        import ctypes.util
        import platform

        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
            libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
        except (OSError, AttributeError):
            pass
