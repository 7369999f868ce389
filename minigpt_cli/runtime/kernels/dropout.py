"""Dropout and causal attention with dropout, faster on CPUs (measured in BENCHMARKS.md).

A keep-mask costs two random bytes per element from the default generator, so seeding and the saved
RNG state still reproduce a run: int16 compared with a threshold (``p`` rounded to a multiple of
2⁻¹⁶), kept values scaled by 1/(1 − that), keeping E[y] = x (inverted dropout, Srivastava et al.
2014 §10). :func:`attention` drops attention weights (Vaswani et al. 2017 §5.4) by blocks of queries
against only the keys each may see. ``MINIGPT_FAST_DROPOUT=0``, CUDA, ``torch.compile`` (but
for the attention's dropout on a CPU, which leaves the graph) and eval mode keep PyTorch's kernels;
under a CPU's bfloat16 autocast :func:`attention` with dropout runs in bfloat16 where the CPU has
bfloat16 units, otherwise in float32 (PyTorch's bfloat16 attention is 5x slower there), and the
bfloat16 activations take a bfloat16 mask: PyTorch's ``bernoulli_`` took 21% of a 6-layer,
384-wide model's step (BENCHMARKS.md)."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .flags import env_flag
from .onednn import multiplies_bfloat16

#: The environment variable that turns the fast dropout off (``0``, ``false``, ``no``, ``off``).
ENV = "MINIGPT_FAST_DROPOUT"

#: Resolution of the drop probability: masks compare int16 random values with a threshold.
LEVELS = 2**16


def drop_threshold(p: float) -> int:
    """The number of int16 values (of 65536) that drop an element: ``round(p · 65536)``."""
    return round(p * LEVELS)


def keep_mask(
    shape: tuple[int, ...],
    p: float,
    device: torch.device | str = "cpu",
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """A random dropout mask of ``shape`` and ``dtype`` (a bool operand would cost a conversion copy
    per use): 0 where dropped, 1 / (1 − the drop probability) where kept, rounded to ``dtype`` as
    PyTorch's own dropout rounds it; each element dropped with probability
    ``drop_threshold(p) / 65536``, independently, from two bytes of 64-bit words drawn with
    ``generator``. The comparison is made in float32 whatever ``dtype``: int16 values do not all fit
    bfloat16's 8 bits."""
    n = math.prod(shape)
    words = torch.empty((2 * n + 7) // 8, dtype=torch.int64, device=device)
    words.random_(-(2**63), None, generator=generator)  # the whole int64 range: every bit uniform
    values = words.view(torch.int16)[:n].view(shape)
    dropped = drop_threshold(p)
    scale = LEVELS / (LEVELS - dropped)
    # Kept iff value >= dropped - 32768, i.e. value - (dropped - 32769) >= 1: times the scale that
    # is >= scale (kept, clamped to the scale) or <= 0 (dropped, clamped to 0). Exact: the integers
    # fit float32. Four element-wise passes, 3x faster than a comparison and a bool-to-float
    # conversion.
    mask = values.float().sub_(dropped - LEVELS // 2 - 1).mul_(scale).clamp_(0.0, scale)
    return mask if dtype == torch.float32 else mask.to(dtype)


def usable(x: torch.Tensor, p: float) -> bool:
    """Whether :func:`dropout` takes the fast path (a floating-point tensor on a CPU, eager,
    0 < p < 1), else ``F.dropout``."""
    return (
        x.device.type == "cpu"
        and x.is_floating_point()
        and 0.0 < p < 1.0
        and drop_threshold(p) < LEVELS
        and not torch.compiler.is_compiling()
    )


class _Dropout(torch.autograd.Function):
    """y = x · mask; dx = dy · mask (mask: :func:`keep_mask`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        mask = keep_mask(x.shape, p, x.device, dtype=x.dtype)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)`` (x: any shape, floating point; 0 <= p <= 1), with
    :func:`keep_mask` on CPUs."""
    if training and usable(x, p):
        return _Dropout.apply(x, p)
    return F.dropout(x, p, training)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` computed by :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:  # evaluation and generation: nothing to drop, no call
            return x
        return dropout(x, self.p, self.training)


_causal_bias: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def causal_bias(T: int, dtype: torch.dtype) -> torch.Tensor:
    """(T, T): 0 on and below the diagonal, −inf above (query i sees keys 0..i); cached per size."""
    key = (T, dtype)
    if key not in _causal_bias:
        _causal_bias[key] = torch.full((T, T), float("-inf"), dtype=dtype).triu_(1)
    return _causal_bias[key]


#: Queries per block of :func:`causal_attention`: block i (rows i·64 … i·64+63) needs keys 0 … i·64+63 only, so
#: at T = 256 the (T × T) work is 62.5% of the full square's. Smaller blocks cost more calls than they save.
QUERY_BLOCK = 64


def query_blocks(T: int) -> list[tuple[int, int]]:
    """The (start, end) row ranges of :func:`causal_attention`'s blocks: at most 4 of at least
    :data:`QUERY_BLOCK`."""
    size = max(QUERY_BLOCK, -(-T // 4))
    return [(start, min(start + size, T)) for start in range(0, T, size)]


class _CausalAttention(torch.autograd.Function):
    """softmax(q kᵀ/√d + causal) ⊙ mask @ v, and its gradients, by blocks of queries.

    Forward (Vaswani et al. 2017 eq. 1, with dropout on the weights), for each
    block of query rows r0 … r1−1 against the keys 0 … r1−1 it may see:
    P = softmax(S), S = q kᵀ/√d + bias; y = (P ⊙ mask) v.
    Backward: dv = (P ⊙ mask)ᵀ dy; dP = (dy vᵀ) ⊙ mask;
    dS = P ⊙ (dP − rowsum(dP ⊙ P)) (the softmax Jacobian); dq = dS k/√d; dk = dSᵀ q/√d,
    dv and dk summed over the blocks (in float32).

    Every tensor is in q's dtype, float32 or bfloat16 (q, k, v and the masks alike); PyTorch's
    bfloat16 softmax and its backward compute in float32 inside, as autocast's softmax would.
    """

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *masks: torch.Tensor
    ) -> torch.Tensor:
        B, H, T, D = q.shape
        scale = 1.0 / math.sqrt(D)
        # The 1/√d goes on q (T·D products, not T·T), which dk's product reuses; the bias is added
        # in place (baddbmm would first copy it into the result).
        q3 = q.reshape(B * H, T, D) * scale
        k3, v3 = k.reshape(B * H, T, D), v.reshape(B * H, T, D)
        bias = causal_bias(T, q.dtype)
        y = q3.new_empty(B * H, T, D)
        probs = []
        for (r0, r1), mask in zip(query_blocks(T), masks):
            p = torch.softmax(
                torch.bmm(q3[:, r0:r1], k3[:, :r1].transpose(1, 2)).add_(bias[r0:r1, :r1]), -1
            )
            y[:, r0:r1] = torch.bmm(
                p * mask, v3[:, :r1]
            )  # (bmm's out= into a slice loops over the batch)
            probs.append(p)
        ctx.save_for_backward(q3, k3, v3, *probs, *masks)
        ctx.scale = scale
        return y.view(B, H, T, D)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q3, k3, v3, *saved = ctx.saved_tensors
        blocks = query_blocks(q3.size(1))
        probs, masks = saved[: len(blocks)], saved[len(blocks) :]
        shape = grad.shape
        g3 = grad.reshape(q3.shape)
        dq = torch.empty_like(q3)
        dk, dv = (torch.zeros_like(t, dtype=torch.float32) for t in (k3, v3))  # sums of blocks
        for (r0, r1), p, mask in zip(blocks, probs, masks):
            g = g3[:, r0:r1]
            dv[:, :r1] += torch.bmm((p * mask).transpose(1, 2), g)
            dprobs = torch.bmm(g, v3[:, :r1].transpose(1, 2)).mul_(mask)
            dscores = torch._softmax_backward_data(dprobs, p, -1, p.dtype)
            dq[:, r0:r1] = torch.bmm(dscores, k3[:, :r1])
            dk[:, :r1] += torch.bmm(dscores.transpose(1, 2), q3[:, r0:r1])  # q3 is q/√d
        dq.mul_(ctx.scale)
        dk, dv = dk.to(k3.dtype), dv.to(v3.dtype)  # float32: themselves
        return (dq.view(shape), dk.view(shape), dv.view(shape), *(None for _ in masks))


def attention_masks(
    B: int,
    H: int,
    T: int,
    p: float,
    device: torch.device | str = "cpu",
    generator: Optional[torch.Generator] = None,
    dtype: torch.dtype = torch.float32,
) -> list[torch.Tensor]:
    """:func:`keep_mask` (of ``dtype``) for each block of :func:`causal_attention`: (B·H, r1 − r0,
    r1) each."""
    return [
        keep_mask((B * H, r1 - r0, r1), p, device, generator, dtype) for r0, r1 in query_blocks(T)
    ]


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: list[torch.Tensor]
) -> torch.Tensor:
    """Causal attention of q, k, v (B, n_head, T, head_dim), float32 or bfloat16 (all one dtype, the
    masks too), its weights multiplied by ``masks`` (:func:`attention_masks`: one per block of
    :func:`query_blocks`); returns (B, n_head, T, head_dim) in their dtype."""
    return _CausalAttention.apply(q, k, v, *masks)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (same arguments and result); float32 causal attention with
    0 < ``dropout_p`` < 1 on a CPU, outside ``torch.compile``, runs :func:`causal_attention`
    instead. Under a CPU's bfloat16 autocast, causal attention with dropout runs
    :func:`causal_attention` in bfloat16 where the CPU has bfloat16 units
    (:func:`~.onednn.multiplies_bfloat16`; its products 2.5-3.5x float32's on a Zen 4;
    BENCHMARKS.md, "Session 29"); any other attention runs in float32 and its output is cast back: PyTorch's bfloat16 CPU attention took 5x float32's time, forward and
    backward, at shakespeare-cpu's size (BENCHMARKS.md, "What the CPU step costs"). Inside
    ``torch.compile`` on a CPU, attention with dropout leaves the graph and runs here eagerly:
    Inductor's backward of it under bfloat16 autocast gave NaN gradients to a 6-layer, 384-wide
    model whose eager step was finite (PyTorch 2.13; tests/test_dropout_kernel.py)."""
    if dropout_p > 0 and q.device.type == "cpu" and torch.compiler.is_compiling():
        return _eager_attention(q, k, v, attn_mask, dropout_p, is_causal)
    if (
        q.device.type == "cpu"
        and v.dtype == torch.bfloat16  # q and k may come float32 from RoPE (GPT's qkv)
        and torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    ):
        if (
            is_causal
            and attn_mask is None
            and q.shape == k.shape == v.shape
            and usable(v, dropout_p)
            and multiplies_bfloat16()
        ):
            B, H, T, _ = v.shape
            masks = attention_masks(B, H, T, dropout_p, v.device, dtype=torch.bfloat16)
            with torch.autocast("cpu", enabled=False):
                return causal_attention(q.to(v.dtype), k.to(v.dtype), v, masks)
        with torch.autocast("cpu", enabled=False):  # autocast would cast the float32 back
            y = attention(q.float(), k.float(), v.float(), attn_mask, dropout_p, is_causal)
        return y.to(v.dtype)
    if (
        is_causal
        and attn_mask is None
        and q.shape == k.shape == v.shape
        and q.dtype == torch.float32
        and usable(q, dropout_p)  # on a CPU, eager, 0 < p < 1
        and not torch.is_autocast_enabled("cpu")
    ):
        B, H, T, _ = q.shape
        return causal_attention(q, k, v, attention_masks(B, H, T, dropout_p, q.device))
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
    )


#: :func:`attention` outside any compiled graph (a graph break where it is called). PyTorch's own
#: lazy form of ``torch.compiler.disable`` (torch.optim's methods use it): that one imports
#: torch._dynamo at once, 1.9 s of every minigpt process's start on a 2-core Zen 3 (``minigpt
#: generate`` took 3.5-4.6 s, now 2.4-2.7 s); this one at its first call, only ever inside
#: torch.compile, where torch._dynamo is loaded already.
_eager_attention = torch._disable_dynamo(attention)


def requested() -> bool:
    """Whether ``MINIGPT_FAST_DROPOUT`` (default on) lets models take the fast dropout; MinigptError
    when it is neither on nor off."""
    return env_flag(ENV, "the fast CPU dropout, the default", "PyTorch's own dropout")


def dropout_kernel(
    model: nn.Module, device: torch.device, dtype: torch.dtype, compiled: bool = False
) -> str:
    """What runs ``model``'s dropout in training: ``"minigpt"`` (this module, whatever ``dtype``:
    under autocast the float32 embeddings and the bfloat16 activations alike), ``"torch"``,
    ``"minigpt+torch"`` (compiled on a CPU: the attention's here, eagerly, the rest PyTorch's in the
    graph) or ``"none"`` (p = 0)."""
    rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    if not any(rates):
        return "none"
    fast = any(isinstance(m, FastDropout) for m in model.modules())
    if not fast or device.type != "cpu":
        return "torch"
    return "minigpt+torch" if compiled else "minigpt"


def swap_dropout(model: nn.Module, enabled: Optional[bool] = None) -> nn.Module:
    """Give ``model`` the fast dropout, in place (no state-dict key changes): every ``nn.Dropout``
    becomes a :class:`FastDropout` (same ``p``), and every module with an ``attend`` attribute
    attends through :func:`attention`. ``enabled`` None: ``MINIGPT_FAST_DROPOUT`` (default on;
    MinigptError if neither on nor off)."""
    if enabled is None:
        enabled = requested()
    if not enabled:
        return model
    for parent in list(model.modules()):
        if hasattr(parent, "attend"):
            parent.attend = attention
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                fast = FastDropout.__new__(FastDropout)
                fast.__dict__.update(child.__dict__)
                setattr(parent, name, fast)
    return model
