"""Training-memory estimate with AdamW (or Muon and AdamW), from a parameter count and a model
config: arithmetic only, no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import MinigptError

if TYPE_CHECKING:  # pragma: no cover - typing only; keeps pydantic out of the import
    from ..config.schema import ModelConfig

#: Bytes per element of each training dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def check_memory_args(dtype: str, batch_size: int, seq_len: int) -> str:
    """The dtype to count with ("auto": float32, the device is not known here). Raises MinigptError:
    an unknown dtype, or ``batch_size`` or ``seq_len`` < 1."""
    if dtype == "auto":
        dtype = "float32"
    if dtype not in DTYPE_BYTES:
        raise MinigptError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    if batch_size < 1 or seq_len < 1:
        raise MinigptError(
            f"batch_size and seq_len must be at least 1, got {batch_size} and {seq_len}"
        )
    return dtype


def training_memory(
    model_cfg: "ModelConfig",
    n_params: int,
    vocab_size: int,
    dtype: str,
    batch_size: int,
    seq_len: int,
    muon_params: int = 0,
) -> dict[str, Any]:
    """Estimated bytes to train a model of ``n_params`` parameters with AdamW, by kind;
    ``muon_params`` of them (``train.optimizer: muon``: the blocks' matrices) keep Muon's one
    float32 momentum buffer instead of Adam's two moments (``torch.optim.Muon``'s state).

    Model states (Rajbhandari et al. 2020, ZeRO §3.1): float32 keeps weights, gradients and Adam's
    two moments, 4+4+8 = 16 bytes per parameter; mixed precision keeps 16-bit weights and gradients
    plus float32 master weights and moments, 2+2+4+8 = 16 too (autocast over float32 parameters:
    4+4+8). Activations: Korthikanti et al. 2022 §4.1 eq. 1, s·b·h·(34 + 5·a·s/h) bytes per 16-bit
    layer (s tokens, b batch, h width, a heads); fused attention never stores the 5·a·s/h score
    term, so the total leaves it out; the 34 assumes a 4h GELU MLP (SwiGLU and GQA approximated);
    float32 doubles it. Logits: 4·s·b·V bytes (§4.3). Workspace, allocator slack and the CUDA
    context are not counted.

    Returns byte counts (weights, gradients, master_weights, adam_moments, muon_momentum,
    model_states, activations_estimate, activations_estimate_fused, logits, total_estimate: what
    ``train`` checks against free memory) plus optimizer, dtype, mixed_precision, batch_size,
    seq_len and the activation formula. Raises MinigptError: as :func:`check_memory_args`.
    """
    dtype = check_memory_args(dtype, batch_size, seq_len)
    N = n_params
    nbytes = DTYPE_BYTES[dtype]
    mixed = nbytes < 4
    weights = N * nbytes
    grads = N * nbytes
    master = 4 * N if mixed else 0
    moments = 8 * (N - muon_params)
    momentum = 4 * muon_params
    states = weights + grads + master + moments + momentum

    s, b, h, a, L = (
        int(seq_len),
        int(batch_size),
        model_cfg.n_embd,
        model_cfg.n_head,
        model_cfg.n_layer,
    )
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
        "optimizer": "muon" if muon_params else "adamw",
        "adam_moments": moments,
        "muon_momentum": momentum,
        "model_states": states,
        "activations_estimate": act,
        "activations_estimate_fused": act_fused,
        "logits": logits,
        "total_estimate": states + act_fused + logits,
        "activation_formula": "L*s*b*h*(34 + 5*a*s/h) bytes at 16 bit (Korthikanti et al. 2022, eq. 1)",
    }
