"""The decoder-only Transformer (GPT) and its variants: architecture only, no I/O.

nanoGPT's layout and GPT-2's names (``wte``, ``wpe``, ``h``, ``ln_f``, ``lm_head``, ``c_attn``,
``c_proj``, ``c_fc``); each switch is a field of :class:`~minigpt_cli.config.schema.ModelConfig`,
with its source there. Linear layers, dropout and attention are plain torch modules and SDPA; a
command may swap in faster kernels with the same parameters (:mod:`minigpt_cli.runtime.kernels`)."""

from __future__ import annotations

import math
from typing import Optional, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..config.schema import ModelConfig

# ----------------------------------------------------------------------------- parts


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) * g (Zhang & Sennrich 2019, eq. 4).

    Computed in float32 and cast back, as Hugging Face's ``LlamaRMSNorm``.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        # One fused call (the same values as x * rsqrt(mean(x²) + eps), bit for bit): four
        # element-wise passes each way made RMSNorm slower than LayerNorm's single kernel
        # (EXPERIMENTS.md, "LayerNorm against RMSNorm").
        x = F.rms_norm(x.float(), (x.size(-1),), eps=self.eps)
        return self.weight * x.to(dtype)


def qk_rms_norm(qk: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm, n_head: int) -> torch.Tensor:
    """``q_norm`` on the first ``n_head`` heads of qk (B, T, heads, hs) and ``k_norm`` on the rest,
    in one normalisation and one product with the two gains side by side: the values of the two
    :class:`RMSNorm` calls, bit for bit, in half their element-wise passes, and one tensor that
    :func:`rotate_heads` rotates at once. Returns (B, T, heads, hs), in float32 where a gain is."""
    dtype, heads = qk.dtype, qk.size(-2)
    gain = torch.cat(
        (q_norm.weight.expand(n_head, -1), k_norm.weight.expand(heads - n_head, -1))
    )  # (heads, hs)
    return gain * F.rms_norm(qk.float(), (qk.size(-1),), eps=q_norm.eps).to(dtype)


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The configured norm over the last dimension (n_embd)."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)


def sinusoidal_table(
    n_pos: int, dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Sinusoidal position table, shape (n_pos, dim), in ``dtype`` (computed in float64).

    p[t, 2i] = sin(t·ω_i), p[t, 2i+1] = cos(t·ω_i), ω_i = base^(-2i/dim)
    (Vaswani et al. 2017 §3.5). ``dim`` must be even.
    """
    t = torch.arange(n_pos, dtype=torch.float64)[:, None]
    omega = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = t * omega  # (n_pos, dim/2)
    table = torch.empty(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (T, head_dim), float32.

    θ_i = base^(-2i/head_dim) for i < head_dim/2, angle = position·θ_i, laid
    out twice ([θ_0..θ_{h/2-1}, θ_0..θ_{h/2-1}]) for the rotate-half form
    (Su et al. 2021 eq. 34; GPT-NeoX / Hugging Face ``LlamaRotaryEmbedding``,
    computed as it does, in float32).
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    inv_freq = inv_freq.to(positions.device)
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    return emb.cos(), emb.sin()


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keep_float32: bool = False
) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+h/2}) of x (B, nh, T, hs) by the angles in cos/sin (T, hs), or
    (B, 1, T, hs) for positions that differ between rows; the result in x's dtype, or in float32
    (the angles') with ``keep_float32``."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    out = x * cos + rotated * sin
    return out if keep_float32 else out.to(x.dtype)


def _rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(x₁c − x₂s, x₂c + x₁s) for x = (x₁, x₂) split in halves along its last dimension, in four
    element-wise passes, in the wider of x's and the angles' dtypes."""
    h = x.size(-1) // 2
    x1, x2 = x[..., :h], x[..., h:]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, c.dtype), device=x.device)
    o1, o2 = out[..., :h], out[..., h:]
    torch.mul(x1, c, out=o1).addcmul_(x2, s, value=-1)
    torch.mul(x2, c, out=o2).addcmul_(x1, s)
    return out


class _RotateHeads(torch.autograd.Function):
    """:func:`rotate_heads`' arithmetic: :func:`_rotate` forward, and backward the rotation by the
    opposite angle (its transpose: dx₁ = g₁c + g₂s, dx₂ = g₂c − g₁s), four element-wise passes each
    way where autograd's record of :func:`apply_rope` on q and k takes about 20 a layer, with a cast
    and a concatenation each way (``speedrun-nanogpt-cpu``'s step on 2 CPU cores is about 3%
    faster: BENCHMARKS.md, session 19)."""

    @staticmethod
    def forward(ctx, x, c, s, dtype):
        ctx.save_for_backward(c, s)
        ctx.x_dtype = x.dtype
        return _rotate(x, c, s).to(dtype)

    @staticmethod
    def backward(ctx, g):
        c, s = ctx.saved_tensors
        return _rotate(g, c, -s).to(ctx.x_dtype), None, None, None


def rotate_heads(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """:func:`apply_rope` for heads laid out as the projection gives them: x (B, T, H, hs) (any
    strides with the last dimension contiguous: a slice of the fused q, k, v projection), cos/sin
    (T, hs) or (B, T, hs) as :func:`rope_cos_sin` lays them out. Returns (B, T, H, hs) in ``dtype``
    (None: x's), computed in float32 (the angles' dtype) and rounded once; its gradient reaches x
    in x's dtype. The same values as :func:`apply_rope` on the heads transposed, up to the
    rounding of a fused multiply-add."""
    h = x.size(-1) // 2
    c, s = cos[..., :h].unsqueeze(-2), sin[..., :h].unsqueeze(-2)  # (T or B·T, 1, hs/2): per head
    dtype = x.dtype if dtype is None else dtype
    if torch.compiler.is_compiling():  # Inductor fuses the plain form (and refuses strided out=)
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(dtype)
    return _RotateHeads.apply(x, c, s, dtype)


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    """x (..., hs) with its two halves along the last dimension swapped: (x₂, x₁)."""
    h = x.size(-1) // 2
    return torch.cat((x[..., h:], x[..., :h]), dim=-1)


class _NormRotateHeads(torch.autograd.Function):
    """:func:`norm_rotate_heads`' arithmetic. With x̂ = x·r, r = 1/√(mean(x²) + ε) over each head,
    and z = g ⊙ x̂, the rotation of z is z ⊙ C + swap(z) ⊙ S for C = (c, c), S = (−s, s) laid out
    per head: forward x̂ ⊙ (g ⊙ C) + swap(x̂) ⊙ (swap(g) ⊙ S), the gains folded into the small
    tables. Backward (the transposes): dz = dy ⊙ C + swap(dy ⊙ S), dg = Σ dz ⊙ x̂ over the
    positions, dx = r·(g ⊙ dz − x̂ · mean(g ⊙ dz ⊙ x̂)) (RMSNorm's gradient; Zhang and Sennrich
    2019, arXiv 1910.07467). About 17 passes over the heads where the two steps take some 30,
    each over whole heads rather than half-heads."""

    @staticmethod
    def forward(ctx, x, gain, cos, sin, eps, dtype):
        heads, hs = x.shape[-2:]
        h = hs // 2
        lead = cos.shape[:-1]  # (T,) or (B, T)
        C = cos.unsqueeze(-2).expand(*lead, heads, hs).contiguous()
        S = torch.cat((-sin[..., :h], sin[..., h:]), dim=-1).unsqueeze(-2).expand(*lead, heads, hs)
        S = S.contiguous()
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # float32, or float64 for tests
        r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(hs).add_(eps)
        r = r.rsqrt_()
        xh = xf.mul_(r) if xf is not x else xf * r  # x̂, in float32
        y = torch.addcmul(xh * (C * gain), _swap_halves(xh), S * _swap_halves(gain))
        ctx.save_for_backward(xh, r, gain, C, S)
        ctx.x_dtype = x.dtype
        return y.to(dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        xh, r, gain, C, S = ctx.saved_tensors
        dy = dy.to(xh.dtype)
        dz = (dy * C).add_(_swap_halves(dy * S))
        dg = (dz * xh).sum(dim=tuple(range(dz.dim() - 2)))  # (heads, hs)
        dxh = dz.mul_(gain)
        dot = (dxh * xh).mean(dim=-1, keepdim=True)
        dx = torch.addcmul(dxh, xh, dot, value=-1).mul_(r)
        return dx.to(ctx.x_dtype), dg, None, None, None, None


def norm_rotate_heads(
    qk: torch.Tensor,
    q_norm: RMSNorm,
    k_norm: RMSNorm,
    n_head: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """:func:`qk_rms_norm` then :func:`rotate_heads` as one autograd function: qk (B, T,
    heads, hs), the first ``n_head`` heads q's (any strides with the last dimension contiguous),
    cos/sin (T, hs) or (B, T, hs) as :func:`rope_cos_sin` lays them out. Returns (B, T, heads, hs)
    in ``dtype`` (None: qk's), computed in float32 and rounded once (the two steps round to qk's
    dtype between them); its gradients reach qk in qk's dtype and the gains in theirs. The same
    values as the two steps up to float32 rounding (tests/test_switches.py); the step of
    ``speedrun-nanogpt-cpu`` is about 5% faster on 2 CPU cores (BENCHMARKS.md, session 28)."""
    heads = qk.size(-2)
    gain = torch.cat((q_norm.weight.expand(n_head, -1), k_norm.weight.expand(heads - n_head, -1)))
    return _NormRotateHeads.apply(qk, gain, cos, sin, q_norm.eps, dtype or qk.dtype)


class KVCacheLike(Protocol):
    """What the model asks of a KV cache (the decoders' caches, :mod:`minigpt_cli.sample.decoding`).

    ``length``: the positions it holds, where :meth:`GPT.forward`'s default positions start.
    ``update(layer, k, v, positions)``: store keys and values (B, n_kv_head, T, head_dim) of
    ``layer`` (keys after RoPE) at ``positions`` (T,), and return the keys and values (B, n_kv_head,
    S, head_dim) the T queries attend to, with the mask (T, S) bool (True: may attend), or None for
    plain causal attention (T > 1) or every key (T = 1)."""

    length: int

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]: ...


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention.

    One fused projection ``c_attn`` gives q (n_head heads) and k, v (n_kv_head
    heads each); ``c_proj`` is W_O. ``attend`` is the attention function, with
    ``F.scaled_dot_product_attention``'s signature; a command may set a faster
    one (:func:`minigpt_cli.runtime.kernels.dropout.attention`).

    ``qk_norm``: ``q_norm``/``k_norm``, RMSNorm over each head's head_dim before RoPE, as
    transformers' ``Qwen3Attention`` (a Qwen3 export renames ``attn.q_norm.weight`` to
    ``self_attn.q_norm.weight``). A layer of ``value_embedding_layers`` has ``ve_gate`` (n_kv_head ×
    c, c = ``value_gate_channels``): per key/value head, v += 3·sigmoid(ve_gate(x[..., :c]))·ve,
    nanochat's ``CausalSelfAttention`` (karpathy/nanochat ``gpt.py``).
    """

    attend = staticmethod(F.scaled_dot_product_attention)

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.n_head = cfg.n_head
        self.n_kv_head = cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.kv_dim = self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(cfg.n_embd, cfg.n_embd + 2 * self.kv_dim, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.rope = cfg.pos_encoding == "rope"
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=cfg.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=cfg.norm_eps)
        gated = layer in cfg.value_embedding_layers
        self.ve_gate = (
            nn.Linear(cfg.value_gate_channels, self.n_kv_head, bias=False) if gated else None
        )

    def qkv(
        self,
        x: torch.Tensor,
        rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        ve: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, nh, T, hs), keys and values (B, nkv, T, hs) of x (B, T, C): projected,
        QK-normed, rotated, ``ve`` (B, T, nkv·hs), this layer's value embedding of the tokens, mixed
        into v."""
        B, T, C = x.size()
        qkv = self.c_attn(x)
        heads = self.n_head + self.n_kv_head
        qk = qkv[..., : C + self.kv_dim].view(B, T, heads, self.head_dim)  # q's heads, then k's
        v = qkv[..., C + self.kv_dim :].view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:
            gate = 3 * torch.sigmoid(
                self.ve_gate(x[..., : self.ve_gate.in_features])
            )  # (B, T, nkv), in (0, 3)
            v = v + (gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_dim)).to(v.dtype)
        # Under a CPU's autocast the attention runs in float32 (runtime/kernels/dropout.py) or
        # autocast casts its inputs itself: the rotated q and k stay float32 rather than being
        # rounded to bfloat16 and cast back.
        wide = (
            torch.float32 if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") else None
        )
        if self.qk_norm and self.rope and not torch.compiler.is_compiling():
            qk = norm_rotate_heads(qk, self.q_norm, self.k_norm, self.n_head, *rope, wide)
        else:
            if self.qk_norm:  # (B, T, heads, hs): Qwen3 norms in this layout, each its own gain
                qk = qk_rms_norm(qk, self.q_norm, self.k_norm, self.n_head)
            if self.rope:  # q and k in one rotation: they lie side by side in the projection
                qk = rotate_heads(qk, *rope, wide)
        q, k = qk.split([self.n_head, self.n_kv_head], dim=2)
        q, k, v = (
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
        )  # (B, nh, T, hs), (B, nkv, T, hs)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        cache: Optional[KVCacheLike] = None,
        layer: int = 0,
        positions: Optional[torch.Tensor] = None,
        ve: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.qkv(x, rope, ve)
        mask = None
        if cache is not None:
            # (B, nkv, S, hs): S = cached + T, or the cache's capacity
            k, v, mask = cache.update(layer, k, v, positions)
        if self.n_kv_head != self.n_head:
            rep = self.n_head // self.n_kv_head
            k = k.repeat_interleave(rep, dim=1)  # (B, nh, S, hs)
            v = v.repeat_interleave(rep, dim=1)
        dropout_p = self.attn_dropout if self.training else 0.0
        # Without a mask: causal for T > 1 (no cache, or an empty one), every key for one query.
        y = self.attend(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None and T > 1
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: c_proj(act(c_fc(x))), or SwiGLU.

    SwiGLU (Shazeer 2020 eq. 6): c_proj(silu(x W_gate) * (x W_up)); ``c_fc``
    holds [W_gate; W_up] stacked, so its output is 2·d_ff wide. relu2: act(h) = relu(h)²
    (So et al. 2021, "Primer", arXiv 2109.08668 §3; nanochat's MLP).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.ffn_hidden
        self.kind = cfg.ffn
        width = 2 * hidden if self.kind == "swiglu" else hidden
        self.c_fc = nn.Linear(cfg.n_embd, width, bias=cfg.bias)
        self.c_proj = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.kind == "gelu":
            h = F.gelu(h)
        elif self.kind == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            h = F.relu(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """One Transformer layer.

    Pre-LN: x += attn(ln_1(x)); x += mlp(ln_2(x))   (GPT-2, Xiong et al. 2020)
    Post-LN: x = ln_1(x + attn(x)); x = ln_2(x + mlp(x))   (Vaswani et al. 2017)
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, rope=None, cache=None, layer=0, positions=None, ve=None):
        if self.pre:
            x = x + self.attn(self.ln_1(x), rope, cache, layer, positions, ve)
            x = x + self.mlp(self.ln_2(x))
        else:
            x = self.ln_1(x + self.attn(x, rope, cache, layer, positions, ve))
            x = self.ln_2(x + self.mlp(x))
        return x


# ----------------------------------------------------------------------------- GPT


class GPT(nn.Module):
    """A decoder-only Transformer language model over ``cfg``, the model section of the config.

    ``value_embeds``: one (V, n_kv_head·head_dim) table per layer of ``cfg.value_embedding_layers``
    (nanochat's ``value_embeds``), its gate initialised U(0, 0.02) as nanochat's. ``logit_softcap``
    C: logits C·tanh(z/C) in float32 (Gemma 2 §2; nanochat). ``zero_init_proj``: every
    ``c_proj.weight`` starts at zero (modded-nanogpt).

    Raises:
        ValueError: ``cfg.vocab_size`` is None."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size must be set (take it from the tokenizer)")
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.pos_encoding == "learned":
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        elif cfg.pos_encoding == "sinusoidal":
            self.register_buffer(
                "pos_table", sinusoidal_table(cfg.block_size, cfg.n_embd), persistent=False
            )
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = make_norm(cfg) if cfg.norm_position == "pre" else None
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.value_embeds = nn.ModuleDict(
            {
                str(i): nn.Embedding(cfg.vocab_size, cfg.kv_heads * cfg.head_dim)
                for i in cfg.value_embedding_layers
            }
        )
        self._rope_cache: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # cos, sin
        self.apply(self._init_weights)
        if cfg.scale_residual_init:
            # GPT-2 §2.3: scale the last layer of each residual branch by 1/sqrt(N),
            # N = 2L residual additions (nanoGPT's `c_proj.weight` rule).
            std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=std)
        for block in self.h:
            if cfg.zero_init_proj:
                nn.init.zeros_(block.attn.c_proj.weight)
                nn.init.zeros_(block.mlp.c_proj.weight)
            if (
                block.attn.ve_gate is not None
            ):  # slightly above neutral: each gate starts near 3·sigmoid(0) = 1.5
                nn.init.uniform_(block.attn.ve_gate.weight, 0.0, 0.02)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, tied weights once.

        ``non_embedding`` drops the vocabulary and position embeddings (wte,
        wpe, an untied lm_head, the value embeddings), Kaplan et al. 2020 §2.1.
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + sum(p.numel() for p in self.value_embeds.parameters())
            if hasattr(self, "wpe"):
                n -= self.wpe.weight.numel()
            if not self.config.tie_weights:
                n -= self.lm_head.weight.numel()
        return n

    def _rope(self, start: int, T: int, device: torch.device):
        """cos/sin (T, head_dim) for positions start..start+T-1, from a table grown on demand."""
        end = start + T
        if (
            self._rope_cache is None
            or self._rope_cache[0].size(0) < end
            or self._rope_cache[0].device != device
        ):
            n = max(end, self.config.block_size)
            positions = torch.arange(n, device=device)
            self._rope_cache = rope_cos_sin(positions, self.config.head_dim, self.config.rope_base)
        cos, sin = self._rope_cache
        return cos[start:end], sin[start:end]

    def forward(
        self,
        idx: torch.Tensor,
        targets: Optional[torch.Tensor] = None,
        *,
        positions: Optional[torch.Tensor] = None,
        cache: Optional[KVCacheLike] = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Logits (B, T, V) float for ``idx`` (B, T) int64, and the mean cross-entropy (scalar) if
        ``targets``.

        ``targets``: next-token ids (B, T), -1 ignored. ``positions``: each token's position, (B, T)
        or (T,) int64, below block_size (unchecked: a check would wait for the device); None: 0..T-1
        after the ``cache.length`` positions a cache holds. ``cache``: keys and values of earlier
        positions, written and read through ``cache.update`` (:class:`KVCacheLike`; the caches are
        :mod:`minigpt_cli.sample.decoding`'s). ``last_only``: logits (B, 1, V) of the last position.

        Raises:
            ValueError: default positions past block_size, where a position table ends."""
        B, T = idx.size()
        cfg = self.config
        n_pos = cfg.block_size  # RoPE's table: block_size rows, more for default positions past it
        if positions is None:
            start = cache.length if cache is not None else 0
            if cfg.pos_encoding in ("learned", "sinusoidal") and start + T > cfg.block_size:
                raise ValueError(
                    f"sequence of {start + T} tokens exceeds block_size {cfg.block_size}"
                )
            n_pos = max(n_pos, start + T)
            positions = torch.arange(start, start + T, device=idx.device)
        x = self.wte(idx)  # (B, T, C)
        if cfg.emb_scale:
            x = x * math.sqrt(cfg.n_embd)
        rope = None
        if cfg.pos_encoding == "learned":
            x = x + self.wpe(positions)  # (T, C) or (B, T, C)
        elif cfg.pos_encoding == "sinusoidal":
            x = x + self.pos_table[positions].to(x.dtype)
        elif cfg.pos_encoding == "rope":
            cos, sin = self._rope(0, n_pos, idx.device)
            rope = (cos[positions], sin[positions])  # (T, hs) or (B, T, hs): rotate_heads'
        x = self.drop(x)
        for i, block in enumerate(self.h):
            ve = (
                self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            )  # (B, T, nkv·hs)
            x = block(x, rope, cache, i, positions, ve)
        if self.ln_f is not None:
            x = self.ln_f(x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(x)
        if cfg.logit_softcap is not None:
            logits = cfg.logit_softcap * torch.tanh(logits.float() / cfg.logit_softcap)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1
            )
        return logits, loss
