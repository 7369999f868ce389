"""Analytic parameter, FLOP and memory accounting, from a model config alone.

Everything here is arithmetic on a :class:`~minigpt_cli.config.ModelConfig`:
no tensor is built and torch is never imported, so ``minigpt count-params``
answers for Llama-2-7B in well under a second. The tests check every count
against ``sum(p.numel())`` of :class:`minigpt_cli.model.GPT` and against the
Hugging Face GPT-2 and Llama models, all built on the ``meta`` device.

The architecture counted is the one of ``model.py`` (DESIGN §3):

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
  GPT-2 small: 124,439,808 − 39,383,808 = 85,056,000; Kaplan's
  approximation N ≈ 12·L·d², which leaves out biases and norms, is 84,934,656
  (the "84.9M"); :attr:`ParamCount.non_embedding_matrices` gives that form for
  any architecture.
- Forward FLOPs per token: C_forward = 2N + 2·L·T·d_attn (Kaplan Table 1),
  N non-embedding, T the context, d_attn = n_head·head_dim = d. The
  de-embedding matmul 2·V·d is reported beside it but, as in Kaplan's C, left
  out of the total. Training is 3× forward (backward = 2× forward), so
  C ≈ 6·N·D for D tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .errors import MinigptError

if TYPE_CHECKING:  # pragma: no cover - typing only; keeps pydantic out of the import
    from .config import ModelConfig

#: Bytes per element of each training dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

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
        """Kaplan's approximate N: the blocks' weight matrices only (12·L·d² for GPT-2)."""
        return self.n_layer * self.layer.matrices


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
        = V·d + P·d + L·(12d² + 13d) + 2d (DESIGN §6).

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


def memory(
    model_cfg: "ModelConfig",
    dtype: str,
    batch_size: int,
    seq_len: int,
    vocab_size: Optional[int] = None,
) -> dict[str, Any]:
    """Estimated bytes to train the model with AdamW, by kind.

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
    score matrices, which fused attention kernels (FlashAttention, SDPA) never
    store. The 34 assumes a 4h GELU MLP, so SwiGLU and grouped-query models
    are approximated. float32 doubles it. The logits add 4·s·b·V bytes (float32 for the
    loss, §4.3). Workspace, allocator slack and the CUDA context are not
    counted.

    ``dtype`` "auto" is counted as float32 (the device is not known here).

    Returns:
        A dict of byte counts: weights, gradients, master_weights,
        adam_moments, model_states, activations_estimate (standard attention),
        activations_estimate_fused (no s² term), logits, total_estimate
        (model states + activations_estimate + logits); plus dtype,
        mixed_precision, batch_size, seq_len and the activation formula.

    Raises:
        MinigptError: unknown dtype, batch_size or seq_len < 1, no vocabulary size.
    """
    if dtype == "auto":
        dtype = "float32"
    if dtype not in DTYPE_BYTES:
        raise MinigptError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    if batch_size < 1 or seq_len < 1:
        raise MinigptError(f"batch_size and seq_len must be at least 1, got {batch_size} and {seq_len}")
    pc = count(model_cfg, vocab_size)
    N = pc.total
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
    logits = 4 * s * b * pc.vocab_size
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
        "total_estimate": states + act + logits,
        "activation_formula": "L*s*b*h*(34 + 5*a*s/h) bytes at 16 bit (Korthikanti et al. 2022, eq. 1)",
    }


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

    Keys DESIGN §4 promises: ``total``, ``non_embedding``, ``embedding``,
    ``per_layer`` (dict of one block's components, see :class:`LayerCount`),
    ``flops_per_token_forward``, ``flops_per_token_train``, ``seq_len``
    (default ``block_size``). Also: the component counts, ``shares``,
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


def human(n: float) -> str:
    """Abbreviate a count: 124439808 -> '124.4M', 2362368 -> '2.36M'; k, M, B, T."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            x = n / div
            return f"{x:.1f}{unit}" if abs(x) >= 10 else f"{x:.2f}{unit}"
    return f"{n:g}"


def human_flops(n: float) -> str:
    """FLOP counts with SI prefixes: 1.89e8 -> '189.0 MFLOP'."""
    for div, unit in ((1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            x = n / div
            return f"{x:.1f} {unit}FLOP" if abs(x) >= 10 else f"{x:.2f} {unit}FLOP"
    return f"{n:g} FLOP"


def human_bytes(n: float) -> str:
    """Bytes in binary units: 1536 -> '1.50 KiB'."""
    for div, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def format_report(rep: dict[str, Any], title: str) -> str:
    """Render a :func:`report` dict as a plain-text table for the terminal.

    Per-layer rows give their share of one layer; the other rows of the total.
    """
    m = rep["model"]
    pl = rep["per_layer"]
    total = rep["total"]
    L = rep["n_layer"]
    w = 50  # label column

    def line(label: str, n: float, abbrev: str, tail: str = "") -> str:
        return f"{label:<{w}}{int(n):>28,}  {abbrev:>11}{('  ' + tail) if tail else ''}"

    def row(label: str, n: int, note: str = "") -> str:
        return line(label, n, human(n), f"{100 * n / total:6.2f}%" + (f"  {note}" if note else ""))

    def lrow(label: str, n: int) -> str:
        return line(label, n, human(n), f"{100 * n / pl['total']:6.2f}% of a layer")

    kv = f", {m['n_kv_head']} KV heads" if m["n_kv_head"] != m["n_head"] else ""
    pos_note = "" if m["pos_encoding"] == "learned" else f"({m['pos_encoding']}: no parameters)"
    lines = [
        f"{title}: {total:,} parameters ({human(total)})",
        f"V={m['vocab_size']:,}  d={m['n_embd']:,}  L={L}  heads={m['n_head']}{kv}  "
        f"d_ff={m['d_ff']:,}  block={m['block_size']:,}",
        f"{m['norm']} ({m['norm_position']}-norm), {m['ffn']}, {m['pos_encoding']} positions, "
        f"bias {'on' if m['bias'] else 'off'}, {'tied' if m['tie_weights'] else 'untied'} lm_head",
        "",
        f"{'parameters':<{w}}{'count':>28}  {'':>11}  share",
        row("token embedding (wte, V·d)", rep["token_embedding"]),
        row("position embedding (wpe, block·d)", rep["position_embedding"], pos_note),
        row(f"{L} layers × {pl['total']:,}", rep["layers"]),
        lrow("  attention (Q, K, V, O)", pl["attention"]),
        lrow("    Q", pl["attn_q"]),
        lrow("    K", pl["attn_k"]),
        lrow("    V", pl["attn_v"]),
        lrow("    O", pl["attn_o"]),
        lrow("    of which biases", pl["attention_bias"]),
        lrow(f"  feed-forward ({m['ffn']})", pl["ffn"]),
    ]
    if pl["ffn_w3"]:  # Llama's names: w2(silu(w1·x) * w3·x)
        lines += [lrow("    W1 (gate)", pl["ffn_w1"]), lrow("    W3 (up)", pl["ffn_w3"])]
    else:
        lines.append(lrow("    W1 (up)", pl["ffn_w1"]))
    lines += [
        lrow("    W2 (down)", pl["ffn_w2"]),
        lrow("    of which biases", pl["ffn_bias"]),
        lrow("  2 norms", pl["norms"]),
        row("final norm", rep["final_norm"], "" if m["norm_position"] == "pre" else "(post-norm: none)"),
        row("lm_head (V·d)", rep["lm_head"], "(tied to wte)" if rep["tied"] else ""),
        row("total", total),
        row("embedding (wte + wpe + untied lm_head)", rep["embedding"]),
        row("non-embedding N (Kaplan et al. 2020)", rep["non_embedding"]),
        row("  weight matrices only (Kaplan's 12·L·d²)", rep["non_embedding_matrices"]),
    ]

    fl = rep["flops"]
    lines += [
        "",
        f"FLOPs per token at T={rep['seq_len']:,} (Kaplan et al. 2020, Table 1: 2N + 2·L·T·d)",
        line("  dense, 2N", fl["dense_forward"], human_flops(fl["dense_forward"])),
        line("  attention, 2·L·T·d", fl["attention_forward"], human_flops(fl["attention_forward"]),
             f"{100 * fl['attention_share']:.1f}% of forward"),
        line("forward", fl["forward"], human_flops(fl["forward"])),
        line("training (3× forward, ≈ 6N)", fl["train"], human_flops(fl["train"])),
        line("  lm_head 2·V·d (not in Kaplan's C)", fl["lm_head_forward"], human_flops(fl["lm_head_forward"])),
        line("  training with lm_head", fl["train_with_lm_head"], human_flops(fl["train_with_lm_head"])),
        line("  6(N+V·d) + 12·L·d·T (PaLM app. B, MFU)", fl["mfu_train"], human_flops(fl["mfu_train"])),
    ]
    if "training_flops" in rep:
        lines.append(line(f"training on D={human(rep['tokens'])} tokens (per token × D)",
                          rep["training_flops"], human_flops(rep["training_flops"]),
                          f"{rep['training_flops']:.3e}"))
    lines.append(line("Chinchilla-optimal tokens (20 per parameter)", rep["chinchilla_tokens"],
                      human(rep["chinchilla_tokens"])))

    lines += ["", "FLOPs per token of each matrix (forward 2·in·out, backward 4·in·out)"]
    for name, m in rep["linear_flops_per_token"].items():
        lines.append(f"  {name:<12} {m['in']:>7,} × {m['out']:<7,}  forward {m['forward']:>15,}  "
                     f"backward {m['backward']:>15,}")

    mem = rep["memory"]
    lines += [
        "",
        f"training memory with AdamW, {mem['dtype']}{' mixed precision' if mem['mixed_precision'] else ''}, "
        f"batch {mem['batch_size']} × T={mem['seq_len']:,}",
        line("  weights", mem["weights"], human_bytes(mem["weights"])),
        line("  gradients", mem["gradients"], human_bytes(mem["gradients"])),
    ]
    if mem["master_weights"]:
        lines.append(line("  float32 master weights", mem["master_weights"], human_bytes(mem["master_weights"])))
    lines += [
        line("  Adam moments (2 × float32)", mem["adam_moments"], human_bytes(mem["adam_moments"])),
        line("model states", mem["model_states"], human_bytes(mem["model_states"])),
        line("activations, estimate (Korthikanti et al. 2022)", mem["activations_estimate"],
             human_bytes(mem["activations_estimate"])),
        line("  with fused attention (no s² scores)", mem["activations_estimate_fused"],
             human_bytes(mem["activations_estimate_fused"])),
        line("logits (float32)", mem["logits"], human_bytes(mem["logits"])),
        line("total, estimate", mem["total_estimate"], human_bytes(mem["total_estimate"])),
    ]
    return "\n".join(lines)
