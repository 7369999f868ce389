"""Training-memory estimate with AdamW, from a parameter count and a model config.

Arithmetic only, like :mod:`minigpt_cli.accounting.params` (which calls it with its exact
count as :func:`minigpt_cli.accounting.params.memory`): no tensor is built and torch is
never imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import MinigptError

if TYPE_CHECKING:  # pragma: no cover - typing only; keeps pydantic out of the import
    from ..config.schema import ModelConfig

#: Bytes per element of each training dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def check_memory_args(dtype: str, batch_size: int, seq_len: int) -> str:
    """The dtype to count with ("auto" counts as float32: the device is not known here).

    Raises:
        MinigptError: an unknown dtype, or ``batch_size`` or ``seq_len`` < 1.
    """
    if dtype == "auto":
        dtype = "float32"
    if dtype not in DTYPE_BYTES:
        raise MinigptError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    if batch_size < 1 or seq_len < 1:
        raise MinigptError(f"batch_size and seq_len must be at least 1, got {batch_size} and {seq_len}")
    return dtype


def training_memory(model_cfg: "ModelConfig", n_params: int, vocab_size: int, dtype: str, batch_size: int,
                    seq_len: int) -> dict[str, Any]:
    """Estimated bytes to train a model of ``n_params`` parameters with AdamW, by kind.

    Model states (Rajbhandari et al. 2020, ZeRO §3.1): float32 training keeps
    weights, gradients and Adam's two moments in float32, 4+4+8 = 16 bytes per
    parameter. Mixed precision (bfloat16/float16) keeps 16-bit weights and
    gradients plus a float32 master copy and float32 moments, 2+2+4+8 = 16
    bytes too (``torch.autocast`` over float32 parameters has the same total,
    split 4+4+8).

    Activations are an estimate: Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", §4.1, eq. 1) give
    s·b·h·(34 + 5·a·s/h) bytes per layer for 16-bit activations with dropout
    (s sequence, b batch, h width, a heads); the 5·a·s/h term holds the a·s²
    score matrices, which fused attention kernels (FlashAttention, SDPA, what
    the model trains with) never store, so the total leaves it out. The 34
    assumes a 4h GELU MLP, so SwiGLU and grouped-query models are
    approximated. float32 doubles it. The logits add 4·s·b·V bytes (float32
    for the loss, §4.3). Workspace, allocator slack and the CUDA context are
    not counted.

    Args:
        model_cfg: the model section (n_layer, n_embd, n_head are used).
        n_params: parameters in all, tied weights once.
        vocab_size: V, for the logits.
        dtype: float32, bfloat16, float16, or "auto" (counted as float32).
        batch_size, seq_len: sequences per step and tokens per sequence.

    Returns:
        A dict of byte counts: weights, gradients, master_weights,
        adam_moments, model_states, activations_estimate (standard attention),
        activations_estimate_fused (no s² term), logits, total_estimate
        (model states + activations_estimate_fused + logits: the figure
        ``train`` checks against the free memory); plus dtype,
        mixed_precision, batch_size, seq_len and the activation formula.

    Raises:
        MinigptError: unknown dtype, batch_size or seq_len < 1 (:func:`check_memory_args`).
    """
    dtype = check_memory_args(dtype, batch_size, seq_len)
    N = n_params
    nbytes = DTYPE_BYTES[dtype]
    mixed = nbytes < 4
    weights = N * nbytes
    grads = N * nbytes
    master = 4 * N if mixed else 0
    moments = 8 * N
    states = weights + grads + master + moments

    s, b, h, a, L = int(seq_len), int(batch_size), model_cfg.n_embd, model_cfg.n_head, model_cfg.n_layer
    scale = nbytes / 2  # the formula is for 16-bit activations
    per_layer = s * b * h * 34 + 5 * a * s * s * b
    act = int(L * per_layer * scale)
    act_fused = int(L * s * b * h * 34 * scale)
    logits = 4 * s * b * vocab_size
    return {
        "dtype": dtype,
        "mixed_precision": mixed,
        "batch_size": b,
        "seq_len": s,
        "weights": weights,
        "gradients": grads,
        "master_weights": master,
        "adam_moments": moments,
        "model_states": states,
        "activations_estimate": act,
        "activations_estimate_fused": act_fused,
        "logits": logits,
        "total_estimate": states + act_fused + logits,
        "activation_formula": "L*s*b*h*(34 + 5*a*s/h) bytes at 16 bit (Korthikanti et al. 2022, eq. 1)",
    }
