"""Analytic parameter and FLOP accounting from a :class:`~minigpt_cli.config.schema.ModelConfig`
alone, no torch.

The architecture counted is the one GPT builds: ``wte`` V·d, a learned ``wpe`` block_size·d (other
position encodings hold no parameters); per layer W_Q and W_O d·d, W_K and W_V
d·(n_kv_head·head_dim) (grouped-query attention, Ainslie et al. 2023), W_1 d·d_ff and W_2 d_ff·d
plus SwiGLU's gate W_3 d·d_ff (Shazeer 2020), biases iff ``bias``, two norms of d (plus a bias of d
for LayerNorm with ``bias``), with ``qk_norm`` two gains of head_dim (Qwen3's q_norm/k_norm); a
final norm for Pre-LN only; ``lm_head`` V·d, 0 when tied; with ``value_embeddings`` a table
V·(n_kv_head·head_dim) and a gate value_gate_channels·n_kv_head in each of
``value_embedding_layers`` (nanochat).

Conventions (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1 and Table 1):
``embedding`` is every vocabulary or position matrix (``wte``, ``wpe``, an untied ``lm_head``, the
value embeddings); ``non_embedding`` = total − embedding is Kaplan's N, exact (GPT-2 small:
124,439,808 − 39,383,808 = 85,056,000), unchanged by tying the head (as Qwen2 reports it). nanoGPT's
printed count (``get_num_params``) subtracts only ``wpe``. Forward FLOPs per token C_forward = 2N +
2·L·T·d_attn, the de-embedding matmul 2·V·d reported beside it; training is 3× forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ..errors import MinigptError
from .memory import DTYPE_BYTES, training_memory  # noqa: F401 (DTYPE_BYTES re-exported)
from .report import format_report, human, human_bytes, human_flops  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # pragma: no cover - typing only; keeps pydantic out of the import
    from ..config.schema import ModelConfig

#: Tokens per parameter at the compute-optimal point (Hoffmann et al. 2022,
#: "Training Compute-Optimal Large Language Models", Table 3: about 20).
CHINCHILLA_TOKENS_PER_PARAM = 20


def linear_flops(n_in: int, n_out: int) -> tuple[int, int]:
    """FLOPs per token of one ``n_in -> n_out`` linear layer: (forward 2·in·out, a multiply and an
    add per weight; backward 4·in·out, the gradients of the input and of the weight), Kaplan et al.
    2020 §2.1."""
    return 2 * n_in * n_out, 4 * n_in * n_out


# ----------------------------------------------------------------------------- counting


@dataclass(frozen=True)
class LayerCount:
    """Parameters of one Transformer block, by component, each projection with its bias
    (``attn_bias`` and ``ffn_bias`` say how much is bias); ``ffn_w3`` is SwiGLU's third matrix (0
    otherwise); ``qk_norm`` the query and key gains (0 without ``qk_norm``), one of the ``norms``. A
    value-embedding gate, in every other layer only, is counted in :class:`ParamCount`."""

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
    qk_norm: int

    @property
    def attention(self) -> int:
        return self.attn_q + self.attn_k + self.attn_v + self.attn_o

    @property
    def ffn(self) -> int:
        return self.ffn_w1 + self.ffn_w3 + self.ffn_w2

    @property
    def norms(self) -> int:
        return self.norm_1 + self.norm_2 + self.qk_norm

    @property
    def matrices(self) -> int:
        """Weight-matrix entries only (no biases, no norms)."""
        return self.attention - self.attn_bias + self.ffn - self.ffn_bias

    @property
    def total(self) -> int:
        return self.attention + self.ffn + self.norms

    def to_dict(self) -> dict[str, int]:
        """The report's ``per_layer``, in its order (``attention_bias`` is ``attn_bias``)."""
        names = (
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_o",
            "attention",
            "attention_bias",
            "ffn_w1",
            "ffn_w3",
            "ffn_w2",
            "ffn",
            "ffn_bias",
            "qk_norm",
            "norms",
            "total",
        )
        return {
            name: getattr(self, "attn_bias" if name == "attention_bias" else name) for name in names
        }


@dataclass(frozen=True)
class ParamCount:
    """Exact parameter count of a model config, by component (tied weights once);
    ``value_embedding`` and ``value_gate``: all value-embedding tables and all their gates (0
    without ``value_embeddings``)."""

    vocab_size: int
    n_layer: int
    n_embd: int
    token_embedding: int
    position_embedding: int
    layer: LayerCount
    final_norm: int
    lm_head: int
    tied: bool
    value_embedding: int
    value_gate: int

    @property
    def layers(self) -> int:
        """All n_layer blocks together, value-embedding gates included."""
        return self.n_layer * self.layer.total + self.value_gate

    @property
    def total(self) -> int:
        return (
            self.token_embedding
            + self.position_embedding
            + self.value_embedding
            + self.layers
            + self.final_norm
            + self.lm_head
        )

    @property
    def embedding(self) -> int:
        """Vocabulary and position matrices: wte + wpe + the value embeddings + an untied
        lm_head."""
        return self.token_embedding + self.position_embedding + self.value_embedding + self.lm_head

    @property
    def non_embedding(self) -> int:
        """Kaplan et al. 2020's N, exact: total − embedding (biases and norms included)."""
        return self.total - self.embedding

    @property
    def non_embedding_matrices(self) -> int:
        """The blocks' weight matrices only, exactly (no biases, no norms): 12·L·d² for GPT-2,
        L·(4d² + 3·d·d_ff) for Llama-2-7B (full attention, SwiGLU); value-embedding gates
        included."""
        return self.n_layer * self.layer.matrices + self.value_gate

    @property
    def kaplan_approximation(self) -> int:
        """Kaplan et al. 2020's N ≈ 12·L·d² (Table 1, assuming d_attn = d and d_ff = 4d),
        literally."""
        return 12 * self.n_layer * self.n_embd**2

    @property
    def without_positions(self) -> int:
        """nanoGPT's count: total less the position table ``wpe`` only (karpathy/nanoGPT
        ``model.py``, ``get_num_params(non_embedding=True)``); GPT-2 small 123,653,376."""
        return self.total - self.position_embedding


def _vocab(model_cfg: "ModelConfig", vocab_size: Optional[int]) -> int:
    v = (
        vocab_size if vocab_size is not None else model_cfg.vocab_size
    )  # >= 1: the schema's and --vocab-size's bound
    if v is None:
        raise MinigptError(
            "model.vocab_size is null (it is taken from the tokenizer); pass --vocab-size N to count"
        )
    return int(v)


def count(model_cfg: "ModelConfig", vocab_size: Optional[int] = None) -> ParamCount:
    """The parameters of the model ``model_cfg`` describes, by component; ``vocab_size`` overrides
    its ``vocab_size`` (null in a training config, where the tokenizer decides). GPT-2 small:
    124,439,808 = V·d + P·d + L·(12d² + 13d) + 2d (the 124M of Radford et al. 2019). Raises
    MinigptError: no vocabulary size."""
    V = _vocab(model_cfg, vocab_size)
    d = model_cfg.n_embd
    kv = (
        model_cfg.kv_heads * model_cfg.head_dim
    )  # K and V width: n_kv_head < n_head shrinks them (GQA)
    d_ff = (
        model_cfg.ffn_hidden
    )  # model.d_ff, else 4d, or for SwiGLU 2/3 of it rounded up (Llama's 11008)
    b = 1 if model_cfg.bias else 0

    norm = d + (
        d * b if model_cfg.norm == "layernorm" else 0
    )  # a gain, plus a shift for LayerNorm with bias
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
        ffn_bias=b
        * ((2 if swiglu else 1) * d_ff + d),  # SwiGLU's gate and up projections both carry one
        norm_1=norm,
        norm_2=norm,
        qk_norm=2 * model_cfg.head_dim
        if model_cfg.qk_norm
        else 0,  # RMSNorm gains only, whatever model.norm
    )
    n_ve = len(model_cfg.value_embedding_layers)
    return ParamCount(
        vocab_size=V,
        n_layer=model_cfg.n_layer,
        n_embd=d,
        token_embedding=V * d,
        position_embedding=model_cfg.block_size * d if model_cfg.pos_encoding == "learned" else 0,
        layer=layer,
        final_norm=norm
        if model_cfg.norm_position == "pre"
        else 0,  # Post-LN ends on a block's own norm
        lm_head=0 if model_cfg.tie_weights else V * d,  # tied: wte's matrix, counted once
        tied=model_cfg.tie_weights,
        value_embedding=n_ve * V * kv,
        value_gate=n_ve * model_cfg.value_gate_channels * model_cfg.kv_heads,
    )


# ----------------------------------------------------------------------------- FLOPs


def flops(
    model_cfg: "ModelConfig", seq_len: int, vocab_size: Optional[int] = None
) -> dict[str, Any]:
    """FLOPs per token of one forward and one training step at context ``seq_len`` (>= 1, as
    --seq-len).

    Kaplan et al. 2020 Table 1: C_forward = 2N + 2·n_layer·n_ctx·d_attn, N non-embedding, d_attn =
    n_head·head_dim (grouped-query attention shrinks K/V, not the score or value matmuls); training
    is 3× forward. ``mfu_train`` is 6·(N + V·d) + 12·L·d·T, the form of PaLM (Chowdhery et al. 2022,
    appendix B) and nanoGPT's ``estimate_mfu``. Raises MinigptError: no vocabulary size (see
    :func:`count`)."""
    pc = count(model_cfg, vocab_size)
    L, d, T = model_cfg.n_layer, model_cfg.n_embd, int(seq_len)
    d_attn = model_cfg.n_head * model_cfg.head_dim
    N = pc.non_embedding
    dense = 2 * N  # a multiply and an add per weight
    attention = 2 * L * T * d_attn  # Q·Kᵀ and the weighted sum of V, per token, over a context of T
    forward = dense + attention
    head = 2 * pc.vocab_size * d  # the de-embedding, which Kaplan's C leaves out
    return {
        "seq_len": T,
        "dense_forward": dense,
        "attention_forward": attention,
        "forward": forward,
        "train": 3
        * forward,  # backward is twice the forward (the input's and the weight's gradients)
        "attention_share": attention / forward,
        "lm_head_forward": head,
        "forward_with_lm_head": forward + head,
        "train_with_lm_head": 3 * (forward + head),
        # PaLM's form counts the lm_head and both attention matmuls without a causal discount, as
        # nanoGPT does.
        "mfu_train": 6 * (N + pc.vocab_size * d) + 12 * L * d_attn * T,
    }


# ----------------------------------------------------------------------------- memory


def memory(
    model_cfg: "ModelConfig",
    dtype: str,
    batch_size: int,
    seq_len: int,
    vocab_size: Optional[int] = None,
    optimizer: str = "adamw",
) -> dict[str, Any]:
    """:func:`minigpt_cli.accounting.memory.training_memory` of the exact :func:`count` (its keys
    and errors, and no vocabulary size: a :class:`MinigptError`); with ``optimizer`` muon, the
    blocks' matrices (:attr:`ParamCount.non_embedding_matrices`, the parameters Muon updates) keep
    one momentum buffer."""
    pc = count(model_cfg, vocab_size)
    muon = pc.non_embedding_matrices if optimizer == "muon" else 0
    return training_memory(model_cfg, pc.total, pc.vocab_size, dtype, batch_size, seq_len, muon)


# ----------------------------------------------------------------------------- report


def linear_table(model_cfg: "ModelConfig", vocab_size: int) -> dict[str, dict[str, Any]]:
    """Forward and backward FLOPs per token of each matrix of one layer and the lm_head
    (:func:`linear_flops`)."""
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
    optimizer: str = "adamw",
) -> dict[str, Any]:
    """Everything ``count-params`` shows, as a JSON-ready dict: the counts of :class:`ParamCount`,
    ``per_layer``, ``shares``, ``flops`` (:func:`flops`, at ``seq_len``, default ``block_size``),
    ``memory`` (:func:`memory`, with ``optimizer``), ``model``, ``chinchilla_tokens`` (20 per
    parameter) and, with ``tokens`` D (>= 1, a whole number: count_params checks it),
    ``training_flops`` (per-token train FLOPs × D). Raises MinigptError: no vocabulary size."""
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
        "value_embedding": pc.value_embedding,
        "value_gate": pc.value_gate,
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
        "memory": memory(model_cfg, dtype, batch_size, T, pc.vocab_size, optimizer),
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
            "qk_norm": model_cfg.qk_norm,
            "logit_softcap": model_cfg.logit_softcap,
            "zero_init_proj": model_cfg.zero_init_proj,
            "value_embeddings": model_cfg.value_embeddings,
        },
    }
    if tokens is not None:
        rep["tokens"] = int(tokens)
        rep["training_flops"] = fl["train"] * int(tokens)
    return rep
