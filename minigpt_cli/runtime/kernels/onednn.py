"""float32 linear layers on oneDNN for x86 CPUs with AVX-512, where MKL takes its AVX2 path on AMD
(1.48x a step, BENCHMARKS.md).

:func:`swap_linears` turns a model's ``nn.Linear`` into :class:`OneDNNLinear` (same parameters):
oneDNN where it pays, ``F.linear`` elsewhere. ``MINIGPT_ONEDNN=0`` leaves models alone."""

from __future__ import annotations

import functools
import platform
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .flags import env_flag

#: The environment variable that turns the swap off (``0``, ``false``, ``no``, ``off``).
ENV = "MINIGPT_ONEDNN"

#: Products smaller than this (2·M·K·N FLOPs) stay on ``F.linear``: a oneDNN call costs ~12 µs more, and
#: forward and backward through oneDNN win from about 4 MFLOP up (BENCHMARKS.md) ...
ONEDNN_MIN_FLOPS = 4_000_000
#: ... unless the weight has at least this many elements: one-token generation streams the weights,
#: and there oneDNN wins from about 128Ki elements (512 KiB) up.
ONEDNN_MIN_WEIGHT = 2**17

#: Said when compile: true takes the training step's linear layers off oneDNN (torch.compile keeps
#: its own kernels).
COMPILE_NOTE = (
    "note: compile: true keeps PyTorch's MKL matrix products; without it the linear layers run on "
    "oneDNN, 1.5x faster on the CPU of BENCHMARKS.md (compare with minigpt bench and compile=false)"
)


def requested() -> bool:
    """Whether ``MINIGPT_ONEDNN`` (default on) lets float32 CPU linear layers use oneDNN.

    Raises:
        MinigptError: the variable is neither on nor off.
    """
    return env_flag(
        ENV, "oneDNN for float32 CPU matrix products, the default", "PyTorch's own kernels"
    )


@functools.cache
def matmul_op():
    """oneDNN's ``mkldnn::_linear_pointwise`` (x @ wᵀ + b) or None where this PyTorch lacks it."""
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


@functools.cache
def multiplies_bfloat16() -> bool:
    """Whether this CPU has bfloat16 units (AVX512-BF16 or AMX, as oneDNN reports them); without
    them PyTorch emulates bfloat16 products, far slower than float32 ones."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def available() -> bool:
    """Whether this machine and PyTorch can run :func:`linear` on oneDNN (x86-64 with the op)."""
    return platform.machine().lower() in ("x86_64", "amd64") and matmul_op() is not None


@functools.cache
def wins() -> bool:
    """Whether oneDNN's products beat PyTorch's MKL ones on this CPU: an x86 CPU with AVX-512. On an
    AVX2-only CPU both run AVX2 code and oneDNN's backward adds transposed copies: a step of
    configs/speedrun-nanogpt-cpu.yaml in float32 took 137 ms on oneDNN, 98 ms on MKL, on an AMD
    EPYC of family 25, model 1 (Zen 3; BENCHMARKS.md)."""
    return available() and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _forward(
    x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], lead: torch.Size
) -> torch.Tensor:
    """x2 (rows, in) @ weightᵀ + bias on oneDNN, shaped (*lead, out); no autograd."""
    return matmul_op()(x2, weight, bias, "none", [], "").view(*lead, weight.size(0))


def transposed(x: torch.Tensor) -> torch.Tensor:
    """x (R, C) transposed into a new contiguous (C, R) tensor.

    PyTorch copies a transposed matrix with a serial blocked loop; read as
    (R, C/8, 8) → (C/8, 8, R), the same copy is an element-wise kernel that
    uses every thread.
    """
    R, C = x.shape
    if C % 8 or not x.is_contiguous():
        return x.t().contiguous()
    return x.view(R, C // 8, 8).permute(1, 2, 0).contiguous().view(C, R)


class _OneDNNLinear(torch.autograd.Function):
    """y = x Wᵀ + b on oneDNN, and its gradients (dx = dy W, dW = dyᵀ x, db = Σ dy)."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.size(-1))
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return _forward(x2, weight, bias, x.shape[:-1])

    @staticmethod
    @once_differentiable  # no second derivatives (oneDNN's op has no autograd formula)
    def backward(ctx, grad: torch.Tensor):
        op = matmul_op()
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.size(-1))
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = op(g2, weight.t(), None, "none", [], "").view(*grad.shape[:-1], weight.size(1))
        if ctx.needs_input_grad[1]:
            if weight.size(0) > weight.size(
                1
            ):  # measured: oneDNN runs ~20% faster with the narrow side as rows
                gw = transposed(op(transposed(x2), g2.t(), None, "none", [], ""))
            else:
                gw = op(transposed(g2), x2.t(), None, "none", [], "")
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def pays(rows: int, in_features: int, out_features: int) -> bool:
    """Whether a (rows × in) @ (in × out) product is big enough for oneDNN (the two thresholds
    above)."""
    return (
        2 * rows * in_features * out_features >= ONEDNN_MIN_FLOPS
        or in_features * out_features >= ONEDNN_MIN_WEIGHT
    )


def _functorch_active() -> bool:
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active()) if active is not None else False


def applies(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    """Whether :func:`linear` takes oneDNN for these operands (else ``F.linear``)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() >= 2
        and weight.dim() == 2
        and x.size(-1) == weight.size(1)  # else F.linear's own shape error
        and (bias is None or (bias.dtype == torch.float32 and bias.shape == weight.shape[:1]))
        and x.numel() > 0
        and pays(x.numel() // x.size(-1), x.size(-1), weight.size(0))
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        # Forward-mode AD and functorch transforms (jvp, vmap, grad) need F.linear's derivative
        # formulas.
        and getattr(torch.autograd.forward_ad, "_current_level", -1) < 0
        and not _functorch_active()
        and available()
    )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``F.linear`` on oneDNN where it pays: x (..., in) @ weight (out, in)ᵀ + bias (out,) → (...,
    out).

    oneDNN only where :func:`applies` (float32 on an x86 CPU, big enough, outside autocast,
    ``torch.compile`` and functorch); the results agree with ``F.linear`` to float32 rounding
    (summation order differs)."""
    if not applies(x, weight, bias):
        return F.linear(x, weight, bias)
    if bias is not None:
        bias = bias.contiguous()  # oneDNN reads the bias as dense
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return _OneDNNLinear.apply(x, weight, bias)
    return _forward(x.reshape(-1, x.size(-1)), weight, bias, x.shape[:-1])


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def swap_linears(model: nn.Module, enabled: Optional[bool] = None) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` by a :class:`OneDNNLinear`, in place, holding the
    same parameter tensors (state dict, weight tying and optimizers unaffected). ``enabled`` None:
    ``MINIGPT_ONEDNN`` (:func:`requested`) where oneDNN :func:`wins`. Returns ``model``.

    Raises:
        MinigptError: ``MINIGPT_ONEDNN`` is neither on nor off."""
    if enabled is None:
        enabled = requested() and wins()
    if not enabled:
        return model
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                fast = OneDNNLinear.__new__(OneDNNLinear)
                fast.__dict__.update(child.__dict__)  # the same Parameter objects, hooks and flags
                setattr(parent, name, fast)
    return model


def linear_kernel(
    model: nn.Module, tokens: int, device: torch.device, dtype: torch.dtype, compiled: bool = False
) -> str:
    """The kernel of ``model``'s linear layers on a batch of ``tokens`` at training ``dtype``:
    ``"oneDNN"``, ``"torch.mm"`` (PyTorch's own) or ``"oneDNN+torch.mm"`` when only some products
    pay or some layers were swapped."""
    if compiled or device.type != "cpu" or dtype != torch.float32 or not available():
        return "torch.mm"
    kinds = {
        "oneDNN"
        if isinstance(m, OneDNNLinear)
        and tokens > 0
        and pays(tokens, m.in_features, m.out_features)
        else "torch.mm"
        for m in model.modules()
        if isinstance(m, nn.Linear)
    }
    return "+".join(sorted(kinds)) or "torch.mm"
