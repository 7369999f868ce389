"""Analytic parameter, FLOP and memory accounting, from a model config alone.

Everything here is arithmetic on a :class:`~minigpt_cli.config.schema.ModelConfig`:
no tensor is built and torch is never imported, so ``minigpt count-params``
answers for Llama-2-7B in well under a second. The tests check every count
against ``sum(p.numel())`` of :class:`minigpt_cli.model.gpt.GPT` and against the
Hugging Face GPT-2 and Llama models, all built on the ``meta`` device.

The architecture counted is the one :class:`minigpt_cli.model.gpt.GPT` builds:

- token embedding ``wte``: V·d; learned positions ``wpe``: block_size·d;
  sinusoidal, RoPE and no positions hold no parameters;
- per layer, attention: W_Q and W_O d·d each, W_K and W_V d·(n_kv_head·head_dim)
  each (grouped-query attention, Ainslie et al. 2023), a bias on each iff
  ``bias``; feed-forward: W_1 d·d_ff and W_2 d_ff·d, plus the gate W_3 d·d_ff
  for SwiGLU (Shazeer 2020), biases iff ``bias``; two norms, each with a
  weight of d, plus a bias of d for LayerNorm with ``bias`` (RMSNorm has none);
- a final norm for Pre-LN only (Post-LN ends on a block's own norm);
- ``lm_head`` V·d without bias, 0 when tied to ``wte``.

Conventions (Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
§2.1 and Table 1):

- ``embedding`` is every vocabulary or position matrix: ``wte``, ``wpe`` and an
  untied ``lm_head`` (the "de-embedding"). ``non_embedding`` = total −
  embedding is Kaplan's N, counted exactly (biases and norms included). It
  does not change when the head is tied or untied, as with the
  "non-embedding parameters" Qwen2 (2024) reports for its untied models.
  GPT-2 small: 124,439,808 − 39,383,808 = 85,056,000. Kaplan's
  approximation N ≈ 12·L·d² (Table 1, for d_attn = d and d_ff = 4d) is
  :attr:`ParamCount.kaplan_approximation`: 84,934,656 for GPT-2 small (the
  "84.9M"), 6,442,450,944 for Llama-2-7B, whose exact weight-matrix count
  (:attr:`ParamCount.non_embedding_matrices`, SwiGLU's three d·d_ff matrices)
  is 6,476,005,376.
- nanoGPT's printed count (karpathy/nanoGPT ``model.py``,
  ``get_num_params(non_embedding=True)``) subtracts only the position table:
  :attr:`ParamCount.without_positions`, 123,653,376 for GPT-2 small.
- Forward FLOPs per token: C_forward = 2N + 2·L·T·d_attn (Kaplan Table 1),
  N non-embedding, T the context, d_attn = n_head·head_dim = d. The
  de-embedding matmul 2·V·d is reported beside it but, as in Kaplan's C, left
  out of the total. Training is 3× forward (backward = 2× forward), so
  C ≈ 6·N·D for D tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ..errors import MinigptError
from .memory import DTYPE_BYTES, check_memory_args, training_memory  # noqa: F401 (DTYPE_BYTES re-exported)
from .report import format_report, human, human_bytes, human_flops  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # pragma: no cover - typing only; keeps pydantic out of the import
    from ..config.schema import ModelConfig

#: Tokens per parameter at the compute-optimal point (Hoffmann et al. 2022,
#: "Training Compute-Optimal Large Language Models", Table 3: about 20).
CHINCHILLA_TOKENS_PER_PARAM = 20


def linear_flops(n_in: int, n_out: int) -> tuple[int, int]:
    """FLOPs per token of one ``n_in -> n_out`` linear layer: (forward, backward).

    Forward is one multiply and one add per weight, 2·in·out; backward computes
    the gradients of both the input and the weight, twice that, 4·in·out
    (Kaplan et al. 2020 §2.1). 768×3072: (4,718,592, 9,437,184).
    """
    return 2 * n_in * n_out, 4 * n_in * n_out


# ----------------------------------------------------------------------------- counting


@dataclass(frozen=True)
class LayerCount:
    """Parameters of one Transformer block, by component.

    Each projection's count includes its bias; ``attn_bias`` and ``ffn_bias``
    say how much of the sub-layer is bias. ``ffn_w3`` is SwiGLU's gate (0
    otherwise); ``ffn_w1`` is the up projection, ``ffn_w2`` the down one.
    """

    attn_q: int
    attn_k: int
    attn_v: int
    attn_o: int
    attn_bias: int
    ffn_w1: int
    ffn_w3: int
    ffn_w2: int
    ffn_bias: int
    norm_1: int
    norm_2: int

    @property
    def attention(self) -> int:
        return self.attn_q + self.attn_k + self.attn_v + self.attn_o

    @property
    def ffn(self) -> int:
        return self.ffn_w1 + self.ffn_w3 + self.ffn_w2

    @property
    def norms(self) -> int:
        return self.norm_1 + self.norm_2

    @property
    def matrices(self) -> int:
        """Weight-matrix entries only (no biases, no norms)."""
        return self.attention - self.attn_bias + self.ffn - self.ffn_bias

    @property
    def total(self) -> int:
        return self.attention + self.ffn + self.norms

    def to_dict(self) -> dict[str, int]:
        return {
            "attn_q": self.attn_q,
            "attn_k": self.attn_k,
            "attn_v": self.attn_v,
            "attn_o": self.attn_o,
            "attention": self.attention,
            "attention_bias": self.attn_bias,
            "ffn_w1": self.ffn_w1,
            "ffn_w3": self.ffn_w3,
            "ffn_w2": self.ffn_w2,
            "ffn": self.ffn,
            "ffn_bias": self.ffn_bias,
            "norms": self.norms,
            "total": self.total,
        }


@dataclass(frozen=True)
class ParamCount:
    """Exact parameter count of a model config, by component (tied weights once)."""

    vocab_size: int
    n_layer: int
    n_embd: int
    token_embedding: int
    position_embedding: int
    layer: LayerCount
    final_norm: int
    lm_head: int
    tied: bool

    @property
    def layers(self) -> int:
        """All n_layer blocks together."""
        return self.n_layer * self.layer.total

    @property
    def total(self) -> int:
        return (
            self.token_embedding + self.position_embedding + self.layers
            + self.final_norm + self.lm_head
        )

    @property
    def embedding(self) -> int:
        """Vocabulary and position matrices: wte + wpe + an untied lm_head."""
        return self.token_embedding + self.position_embedding + self.lm_head

    @property
    def non_embedding(self) -> int:
        """Kaplan et al. 2020's N, exact: total − embedding (biases and norms included)."""
        return self.total - self.embedding

    @property
    def non_embedding_matrices(self) -> int:
        """The blocks' weight matrices only, exactly (no biases, no norms): 12·L·d² for GPT-2,
        L·(4d² + 3·d·d_ff) for Llama-2-7B (full attention, SwiGLU)."""
        return self.n_layer * self.layer.matrices

    @property
    def kaplan_approximation(self) -> int:
        """Kaplan et al. 2020's N ≈ 12·L·d² (Table 1, assuming d_attn = d and d_ff = 4d), literally."""
        return 12 * self.n_layer * self.n_embd**2

    @property
    def without_positions(self) -> int:
        """nanoGPT's count: total less the position table ``wpe`` only (karpathy/nanoGPT
        ``model.py``, ``get_num_params(non_embedding=True)``); GPT-2 small 123,653,376."""
        return self.total - self.position_embedding


def _vocab(model_cfg: "ModelConfig", vocab_size: Optional[int]) -> int:
    v = vocab_size if vocab_size is not None else model_cfg.vocab_size
    if v is None:
        raise MinigptError(
            "model.vocab_size is null (it is taken from the tokenizer); "
            "pass --vocab-size N to count parameters"
        )
    if v < 1:
        raise MinigptError(f"vocab size must be positive, got {v}")
    return int(v)


def count(model_cfg: "ModelConfig", vocab_size: Optional[int] = None) -> ParamCount:
    """Count the parameters of the model ``model_cfg`` describes, by component.

    Args:
        model_cfg: the model section of a config.
        vocab_size: overrides ``model_cfg.vocab_size`` (which may be null in a
            training config, where the tokenizer decides).

    Returns:
        A :class:`ParamCount`. GPT-2 small: total 124,439,808
        = V·d + P·d + L·(12d² + 13d) + 2d (wte, wpe, 12 blocks with biases and
        two LayerNorms each, the final LayerNorm; the 124M of Radford et al. 2019).

    Raises:
        MinigptError: neither ``vocab_size`` nor ``model_cfg.vocab_size`` is set.
    """
    V = _vocab(model_cfg, vocab_size)
    d = model_cfg.n_embd
    kv = model_cfg.kv_heads * model_cfg.head_dim
    d_ff = model_cfg.ffn_hidden
    b = 1 if model_cfg.bias else 0

    norm = d + (d * b if model_cfg.norm == "layernorm" else 0)
    swiglu = model_cfg.ffn == "swiglu"
    layer = LayerCount(
        attn_q=d * d + b * d,
        attn_k=d * kv + b * kv,
        attn_v=d * kv + b * kv,
        attn_o=d * d + b * d,
        attn_bias=b * (2 * d + 2 * kv),
        ffn_w1=d * d_ff + b * d_ff,
        ffn_w3=(d * d_ff + b * d_ff) if swiglu else 0,
        ffn_w2=d_ff * d + b * d,
        ffn_bias=b * ((2 if swiglu else 1) * d_ff + d),
        norm_1=norm,
        norm_2=norm,
    )
    return ParamCount(
        vocab_size=V,
        n_layer=model_cfg.n_layer,
        n_embd=d,
        token_embedding=V * d,
        position_embedding=model_cfg.block_size * d if model_cfg.pos_encoding == "learned" else 0,
        layer=layer,
        final_norm=norm if model_cfg.norm_position == "pre" else 0,
        lm_head=0 if model_cfg.tie_weights else V * d,
        tied=model_cfg.tie_weights,
    )


# ----------------------------------------------------------------------------- FLOPs


def flops(model_cfg: "ModelConfig", seq_len: int, vocab_size: Optional[int] = None) -> dict[str, Any]:
    """FLOPs per token of one forward and one training step, at context ``seq_len``.

    Kaplan et al. 2020 Table 1: C_forward = 2N + 2·n_layer·n_ctx·d_attn, with N
    the non-embedding count and d_attn = n_head·head_dim (= d; grouped-query
    attention shrinks K/V, not the score or value matmuls). Training costs
    3× forward. GPT-2 small: the attention term is 10% of the forward at
    T=1024 and 31% at T=4096.

    Returned keys (FLOPs per token unless named otherwise):
        seq_len; dense_forward (2N); attention_forward (2·L·T·d);
        forward (their sum); train (3× forward); attention_share (of forward);
        lm_head_forward (2·V·d, Kaplan's de-embedding, not in ``forward``);
        forward_with_lm_head, train_with_lm_head (with it);
        mfu_train: 6·(N + V·d) + 12·L·d·T, the form of PaLM (Chowdhery et al.
        2022, appendix B) and nanoGPT's ``estimate_mfu``, which counts the
        lm_head matmul and both attention matmuls without a causal discount.

    Raises:
        MinigptError: ``seq_len`` < 1, or no vocabulary size (see :func:`count`).
    """
    if seq_len < 1:
        raise MinigptError(f"seq_len must be at least 1, got {seq_len}")
    pc = count(model_cfg, vocab_size)
    L, d, T = model_cfg.n_layer, model_cfg.n_embd, int(seq_len)
    d_attn = model_cfg.n_head * model_cfg.head_dim
    N = pc.non_embedding
    dense = 2 * N
    attention = 2 * L * T * d_attn
    forward = dense + attention
    head = 2 * pc.vocab_size * d
    return {
        "seq_len": T,
        "dense_forward": dense,
        "attention_forward": attention,
        "forward": forward,
        "train": 3 * forward,
        "attention_share": attention / forward,
        "lm_head_forward": head,
        "forward_with_lm_head": forward + head,
        "train_with_lm_head": 3 * (forward + head),
        "mfu_train": 6 * (N + pc.vocab_size * d) + 12 * L * d_attn * T,
    }


# ----------------------------------------------------------------------------- memory


def memory(model_cfg: "ModelConfig", dtype: str, batch_size: int, seq_len: int,
           vocab_size: Optional[int] = None) -> dict[str, Any]:
    """Estimated bytes to train the model with AdamW, by kind: weights, gradients, master weights,
    Adam moments, activations and logits of the exact :func:`count`.

    The formulas (ZeRO's 16 bytes per parameter, Korthikanti et al. 2022's
    activations), the keys and the errors are those of
    :func:`minigpt_cli.accounting.memory.training_memory`; no vocabulary size is
    a :class:`MinigptError` too (see :func:`count`).
    """
    check_memory_args(dtype, batch_size, seq_len)
    pc = count(model_cfg, vocab_size)
    return training_memory(model_cfg, pc.total, pc.vocab_size, dtype, batch_size, seq_len)


# ----------------------------------------------------------------------------- report


def linear_table(model_cfg: "ModelConfig", vocab_size: int) -> dict[str, dict[str, Any]]:
    """Forward and backward FLOPs per token of each weight matrix of one layer (and the lm_head).

    A linear layer in→out costs 2·in·out FLOPs per token forward (a multiply
    and an add per weight) and twice that backward (gradients with respect to
    the input and to the weight); Kaplan et al. 2020 §2.1.
    """
    d, kv, dff = model_cfg.n_embd, model_cfg.kv_heads * model_cfg.head_dim, model_cfg.ffn_hidden
    shapes = {"attn_q": (d, d), "attn_k": (d, kv), "attn_v": (d, kv), "attn_o": (d, d)}
    if model_cfg.ffn == "swiglu":
        shapes.update({"ffn_w1_gate": (d, dff), "ffn_w3_up": (d, dff), "ffn_w2_down": (dff, d)})
    else:
        shapes.update({"ffn_up": (d, dff), "ffn_down": (dff, d)})
    shapes["lm_head"] = (d, vocab_size)
    out = {}
    for name, (n_in, n_out) in shapes.items():
        fwd, bwd = linear_flops(n_in, n_out)
        out[name] = {"in": n_in, "out": n_out, "forward": fwd, "backward": bwd}
    return out


def report(
    model_cfg: "ModelConfig",
    *,
    seq_len: Optional[int] = None,
    tokens: Optional[int] = None,
    vocab_size: Optional[int] = None,
    dtype: str = "float32",
    batch_size: int = 1,
) -> dict[str, Any]:
    """Everything ``count-params`` shows, as a JSON-ready dict.

    Keys: ``total``, ``non_embedding``, ``embedding``, ``total_without_positions``
    (nanoGPT's count), ``non_embedding_matrices`` (exact) and
    ``kaplan_approximation`` (12·L·d²), ``per_layer`` (dict of one block's
    components, see :class:`LayerCount`), ``flops_per_token_forward``,
    ``flops_per_token_train``, ``seq_len`` (default ``block_size``). Also:
    the component counts, ``shares``,
    ``flops`` (see :func:`flops`), ``memory`` (see :func:`memory`), the model
    sizes under ``model``, ``chinchilla_tokens`` (20 per parameter), and with
    ``tokens`` = D: ``tokens`` and ``training_flops`` (per-token train FLOPs × D).

    Raises:
        MinigptError: no vocabulary size, or a non-positive seq_len or tokens.
    """
    pc = count(model_cfg, vocab_size)
    T = model_cfg.block_size if seq_len is None else int(seq_len)
    fl = flops(model_cfg, T, pc.vocab_size)
    layer = pc.layer
    total = pc.total
    rep: dict[str, Any] = {
        "total": total,
        "non_embedding": pc.non_embedding,
        "embedding": pc.embedding,
        "token_embedding": pc.token_embedding,
        "position_embedding": pc.position_embedding,
        "per_layer": layer.to_dict(),
        "n_layer": pc.n_layer,
        "layers": pc.layers,
        "final_norm": pc.final_norm,
        "lm_head": pc.lm_head,
        "tied": pc.tied,
        "non_embedding_matrices": pc.non_embedding_matrices,
        "kaplan_approximation": pc.kaplan_approximation,
        "total_without_positions": pc.without_positions,
        "shares": {
            "attention_of_layer": layer.attention / layer.total,
            "ffn_of_layer": layer.ffn / layer.total,
            "norms_of_layer": layer.norms / layer.total,
            "embedding_of_total": pc.embedding / total,
            "non_embedding_of_total": pc.non_embedding / total,
        },
        "seq_len": T,
        "linear_flops_per_token": linear_table(model_cfg, pc.vocab_size),
        "flops_per_token_forward": fl["forward"],
        "flops_per_token_train": fl["train"],
        "attention_flops_share": fl["attention_share"],
        "flops": fl,
        "chinchilla_tokens": CHINCHILLA_TOKENS_PER_PARAM * total,
        "memory": memory(model_cfg, dtype, batch_size, T, pc.vocab_size),
        "model": {
            "vocab_size": pc.vocab_size,
            "n_layer": model_cfg.n_layer,
            "n_head": model_cfg.n_head,
            "n_kv_head": model_cfg.kv_heads,
            "n_embd": model_cfg.n_embd,
            "d_ff": model_cfg.ffn_hidden,
            "block_size": model_cfg.block_size,
            "pos_encoding": model_cfg.pos_encoding,
            "norm": model_cfg.norm,
            "norm_position": model_cfg.norm_position,
            "ffn": model_cfg.ffn,
            "bias": model_cfg.bias,
            "tie_weights": model_cfg.tie_weights,
        },
    }
    if tokens is not None:
        if tokens < 1:
            raise MinigptError(f"tokens must be at least 1, got {tokens}")
        rep["tokens"] = int(tokens)
        rep["training_flops"] = fl["train"] * int(tokens)
    return rep
