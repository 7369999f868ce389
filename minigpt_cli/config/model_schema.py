"""The ``model:`` section of the config: the decoder-only Transformer's architecture, with GPT-2's
names, and the rules between its keys (:mod:`.schema` holds the whole config). No torch here."""

from __future__ import annotations

import math
from typing import Iterator, Literal, Optional

from pydantic import Field

from .fields import MAX_HEADS, MAX_LAYERS, MAX_TOKENS, MAX_VOCAB, MAX_WIDTH, UserPath, _Strict


class ModelConfig(_Strict):
    """Architecture of the decoder-only Transformer (GPT-2's names)."""

    n_layer: int = Field(6, ge=1, le=MAX_LAYERS, description="number of Transformer blocks")
    n_head: int = Field(
        6, ge=1, le=MAX_HEADS, description="attention (query) heads per block; must divide n_embd"
    )
    n_embd: int = Field(
        384, ge=1, le=MAX_WIDTH, description="model width d: the embedding and residual-stream size"
    )
    block_size: int = Field(256, ge=1, le=MAX_TOKENS, description="context length in tokens")
    vocab_size: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_VOCAB,
        description="rows of the token embedding; null: the tokenizer's size",
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="dropout probability on embeddings, attention weights and residual branches "
        "(training only)",
    )
    bias: bool = Field(
        True,
        description="biases in the attention and MLP linear layers and in LayerNorm "
        "(GPT-2: true, Llama: false)",
    )
    pos_encoding: Literal["learned", "sinusoidal", "rope", "none"] = Field(
        "learned",
        description="positions: a learned table (GPT-2), sinusoidal (Vaswani et al. 2017 §3.5), "
        "rotary (RoPE, Su et al. 2021) or none",
    )
    rope_base: float = Field(
        10000.0,
        gt=0.0,
        description="RoPE frequency base θ (Su et al. 2021; Llama 2: 10000); "
        "used with pos_encoding: rope",
    )
    norm: Literal["layernorm", "rmsnorm"] = Field(
        "layernorm", description="LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019)"
    )
    norm_eps: float = Field(
        1e-5,
        gt=0.0,
        description="epsilon added to the variance (RMSNorm: mean square) in each norm",
    )
    norm_position: Literal["pre", "post"] = Field(
        "pre",
        description="pre: norm before each sub-layer, plus a final norm (GPT-2); post: after each residual "
        "add, no final norm (Vaswani et al. 2017)",
    )
    ffn: Literal["relu", "gelu", "gelu_tanh", "swiglu", "relu2"] = Field(
        "gelu",
        description="feed-forward activation: ReLU, exact GELU, GPT-2's tanh GELU, SwiGLU (Shazeer 2020) or "
        "relu2: relu(x)² (So et al. 2021, Primer)",
    )
    d_ff: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="feed-forward hidden width; null: 4·n_embd, for "
        "swiglu 8·n_embd/3 rounded up to multiple_of",
    )
    multiple_of: int = Field(
        256,
        ge=1,
        le=MAX_WIDTH,
        description="round SwiGLU's derived d_ff up to a multiple of "
        "this (Llama's FeedForward); unused when d_ff is "
        "set",
    )
    tie_weights: bool = Field(
        True, description="share the token embedding with the output layer (Press & Wolf 2017)"
    )
    scale_residual_init: bool = Field(
        True,
        description="scale the init of residual output projections by 1/sqrt(2·n_layer) (GPT-2 §2.3)",
    )
    emb_scale: bool = Field(
        False, description="multiply token embeddings by sqrt(n_embd) (Vaswani et al. 2017 §3.4)"
    )
    n_kv_head: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_HEADS,
        description="key/value heads, for grouped-query "
        "attention (Ainslie et al. 2023); must "
        "divide n_head; null: n_head",
    )
    init_std: float = Field(
        0.02,
        gt=0.0,
        description="standard deviation of the normal init of linear and "
        "embedding weights (GPT-2: 0.02)",
    )
    qk_norm: bool = Field(
        False,
        description="RMSNorm with a learned gain on each head's queries and keys, before "
        "RoPE (Qwen3's q_norm/k_norm; modded-nanogpt)",
    )
    logit_softcap: Optional[float] = Field(
        None,
        gt=0.0,
        description="C: output logits become C·tanh(logits/C), capped at ±C (Gemma 2 §2; nanochat: "
        "15); null: off",
    )
    zero_init_proj: bool = Field(
        False,
        description="start each block's output projections (attention and MLP "
        "c_proj) at zero (modded-nanogpt; nanochat)",
    )
    value_embeddings: bool = Field(
        False,
        description="per-layer token tables added to V through a per-head gate, in every other layer "
        "ending at the last (nanochat's value_embeds)",
    )
    init_from: Optional[UserPath] = Field(
        None,
        description="fine-tune a local Hugging Face GPT-2, Llama, GPT-NeoX or Qwen3 folder: its architecture, "
        "weights and tokenizer.json; null: random init",
    )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def ffn_hidden(self) -> int:
        """Hidden width of the feed-forward block: 4·d (Vaswani et al. 2017, GPT-2); for SwiGLU 2/3
        of that, rounded up to ``multiple_of`` (Shazeer 2020 §2; Llama's ``FeedForward``: d=4096 ->
        11008)."""
        if self.d_ff is not None:
            return self.d_ff
        if self.ffn == "swiglu":
            hidden = int(2 * (4 * self.n_embd) / 3)
            return self.multiple_of * math.ceil(hidden / self.multiple_of)
        return 4 * self.n_embd

    @property
    def value_embedding_layers(self) -> tuple[int, ...]:
        """The layers with a value embedding: every other one, ending at the last (nanochat's
        ``has_ve``: ``layer % 2 == (n_layer - 1) % 2``); none when ``value_embeddings`` is off."""
        return (
            tuple(range((self.n_layer - 1) % 2, self.n_layer, 2)) if self.value_embeddings else ()
        )

    @property
    def value_gate_channels(self) -> int:
        """Channels of the attention input a value-embedding gate reads: nanochat's 12
        (``ve_gate_channels``), or all of a narrower width."""
        return min(12, self.n_embd)

    @property
    def fitting_width(self) -> int:
        """The ``n_embd`` nearest the given one that whole heads accept, with pairs of dimensions
        per head for RoPE (it rotates pairs) and an even width for sinusoidal positions (pairs of
        sin and cos)."""
        step = math.lcm(
            self.n_head, *{"rope": [2 * self.n_head], "sinusoidal": [2]}.get(self.pos_encoding, [])
        )
        return step * max(1, round(self.n_embd / step))

    @property
    def fitting_heads(self) -> tuple[int, ...]:
        """The head counts nearest ``n_head`` (one below, one above, where there is one) that divide
        ``n_embd``, with an even head size for RoPE (none for an odd sinusoidal width): the fix that
        keeps the width."""
        if self.pos_encoding == "sinusoidal" and self.n_embd % 2:
            return ()  # an odd width: no head count helps
        fits = [
            h
            for h in range(1, min(self.n_embd, MAX_HEADS) + 1)
            if self.n_embd % h == 0 and (self.pos_encoding != "rope" or self.n_embd // h % 2 == 0)
        ]
        below = [h for h in fits if h < self.n_head][-1:]
        above = [h for h in fits if h > self.n_head][:1]
        return tuple(below + above)

    def _head_fix(self) -> str:
        """The fix for a head count that does not fit the width: the nearest head counts first (the
        width is the model's size), then the nearest width."""
        heads = " or ".join(map(str, self.fitting_heads))
        return (
            f"e.g. n_head={heads} (dividing {self.n_embd}), or n_embd={self.fitting_width}"
            if heads
            else f"e.g. n_embd={self.fitting_width}"
        )

    def _broken(self) -> Iterator[str]:
        # d_ff and n_kv_head given as null stand for values (4·d or SwiGLU's rounding, n_head) that
        # always pass.
        if self.n_embd % self.n_head:
            yield (
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head}); "
                f"{self._head_fix()}"
            )
        elif self.pos_encoding == "rope" and self.head_dim % 2:
            yield (
                "model.pos_encoding=rope needs an even head size, but model.n_embd/model.n_head = "
                f"{self.n_embd}/{self.n_head} = {self.head_dim}; {self._head_fix()}"
            )
        elif self.pos_encoding == "sinusoidal" and self.n_embd % 2:
            yield (
                "model.pos_encoding=sinusoidal needs an even model.n_embd, got "
                f"{self.n_embd}; e.g. n_embd={self.fitting_width}"
            )
        if self.n_kv_head is not None and self.n_kv_head > self.n_head:
            yield (
                f"model.n_kv_head ({self.n_kv_head}) must not exceed model.n_head ({self.n_head}); "
                "grouped-query attention shares each key/value head among n_head/n_kv_head query heads"
            )
        elif self.n_kv_head is not None and self.n_head % self.n_kv_head:
            yield (
                f"model.n_head ({self.n_head}) must be a multiple of model.n_kv_head ({self.n_kv_head})"
            )
