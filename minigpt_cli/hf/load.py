"""Import a local Hugging Face GPT-2, Llama, GPT-NeoX or Qwen3 folder (``save_pretrained``:
config.json and safetensors).

Each family has ``*_config_from_hf(config.json) -> ModelConfig`` and ``load_*_state_dict(tensors,
cfg)``. GPT-2's names are ours; its Conv1D weights are (in, out), so ``c_attn``, ``attn.c_proj``,
``c_fc`` and ``mlp.c_proj`` are transposed, and old checkpoints' causal-mask buffers dropped. Llama:
q, k, v stack into ``attn.c_attn`` and gate, up into ``mlp.c_fc``; its rotate-half RoPE is
:func:`~minigpt_cli.model.gpt.apply_rope`'s, so no rows are permuted (Meta's own
``consolidated.*.pth`` files, in the other pairing, are not read). GPT-NeoX
(``use_parallel_residual: false``, rotary over the whole head, ``rotary_pct: 1``) rotates halves as
we do too; its fused ``query_key_value`` holds q, k, v per head (:func:`neox_qkv`). The name tables
(:func:`llama_names`, :func:`neox_names`) are the ones :mod:`.export` reads the other way.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config.schema import ModelConfig, validate
from ..errors import MinigptError
from ..fileio import JSON_BOUNDS, parse_json, read_text_file
from ..run import folder as runs

if (
    TYPE_CHECKING
):  # torch is imported where tensors are made: count-params reads config.json without it
    import torch

    from ..model.gpt import GPT

#: transformers' ``ACT2FN`` names of our two-layer MLP activations (GPT-2's ``activation_function``, GPT-NeoX's
#: ``hidden_act``).
_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "relu2": "relu2",
}
_GPT2_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")


class _Json(BaseModel):
    model_config = ConfigDict(extra="ignore")  # config.json holds many keys we have no use for
    family: ClassVar[str] = "transformers config"


class _Kind(_Json):
    model_type: Literal["gpt2", "llama", "gpt_neox", "qwen3"]


class _Index(_Json):
    family: ClassVar[str] = "safetensors index"
    weight_map: dict[str, str]


class GPT2Json(_Json):
    """The keys of a ``GPT2Config``'s config.json that we read; options we do not implement are
    refused by type."""

    family: ClassVar[str] = "GPT-2 config"
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    n_positions: Optional[int] = (
        None  # null falls back to n_ctx (0 does not: the schema refuses it as a size)
    )
    n_ctx: Optional[int] = None
    activation_function: Literal[tuple(_ACTIVATIONS)] = "gelu_new"
    scale_attn_weights: Literal[True] = True
    scale_attn_by_inverse_layer_idx: Literal[False] = False
    add_cross_attention: Literal[False] = False
    resid_pdrop: float = 0.0
    layer_norm_epsilon: float = 1e-5
    n_inner: Optional[int] = None
    tie_word_embeddings: bool = True


class _Rope(_Json):
    """transformers 5.x ``rope_parameters`` (4.x: ``rope_scaling`` and a top-level ``rope_theta``):
    plain RoPE only."""

    rope_type: Literal["default"] = "default"
    type: Literal["default"] = "default"  # the 4.x spelling of rope_type
    rope_theta: float = Field(10000.0, gt=0, allow_inf_nan=False)
    partial_rotary_factor: float = 1.0  # GPT-NeoX's (its 4.x rotary_pct)


class LlamaJson(_Json):
    """The keys of a ``LlamaConfig``'s config.json that we read."""

    family: ClassVar[str] = "Llama config"
    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: Optional[int] = (
        None  # null: 2048 (0 does not fall back: the schema refuses it)
    )
    num_key_value_heads: Optional[int] = None
    hidden_act: Literal["silu"] = "silu"  # Llama's SwiGLU
    head_dim: Optional[int] = None
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = Field(10000.0, gt=0, allow_inf_nan=False)
    rope_parameters: Optional[_Rope] = None
    rope_scaling: Optional[_Rope] = None


class Qwen3Json(LlamaJson):
    """The keys of a ``Qwen3Config``'s config.json that we read: Llama's, with RMSNorm on the
    queries and keys."""

    family: ClassVar[str] = "Qwen3 config"
    use_sliding_window: bool = False


class NeoXJson(_Json):
    """The keys of a ``GPTNeoXConfig``'s config.json that we read: a sequential residual only (by
    type)."""

    family: ClassVar[str] = "GPT-NeoX config"
    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: Optional[int] = None  # null: 2048, GPTNeoXConfig's default
    hidden_act: Literal[tuple(_ACTIVATIONS)] = "gelu"
    use_parallel_residual: Literal[False] = Field(
        True, validate_default=True
    )  # transformers' default: parallel
    rotary_pct: float = 0.25  # 4.x; 5.x writes rope_parameters.partial_rotary_factor
    rotary_emb_base: float = Field(10000.0, gt=0, allow_inf_nan=False)
    rope_parameters: Optional[_Rope] = None
    attention_bias: bool = True
    hidden_dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False


def _parse(schema: type[_Json], data: str | Mapping[str, Any], source: str = "config.json") -> Any:
    """``data`` (JSON text, or parsed) read through ``schema``; its first problem is one line naming
    the key."""
    try:
        return (
            schema.model_validate_json(data)
            if isinstance(data, str)
            else schema.model_validate(data)
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(map(str, err["loc"]))
        # The two types said in words of their own; any other is a value we do not support, or no
        # object at all.
        if err["type"] == "missing":
            what = f"{source} lacks {key!r}, which a {schema.family} must have"
        elif err["type"] == "json_invalid":
            what = f"{source} is not valid JSON ({err['msg']})"
        elif err["loc"]:
            what = f"{source} {key} {err.get('input')!r} is not supported ({err['msg']})"
        else:
            what = f"{source} must hold a JSON object"
        raise MinigptError(what, "fix it or re-save the model") from None


#: Our model keys that every imported model of a family has.
_FIXED = {
    "gpt2": dict(
        bias=True,
        pos_encoding="learned",
        norm="layernorm",
        norm_position="pre",
        emb_scale=False,
        n_kv_head=None,
    ),
    "llama": dict(
        pos_encoding="rope", norm="rmsnorm", norm_position="pre", ffn="swiglu", emb_scale=False
    ),
    "qwen3": dict(
        pos_encoding="rope",
        norm="rmsnorm",
        norm_position="pre",
        ffn="swiglu",
        emb_scale=False,
        qk_norm=True,
    ),
    "gpt_neox": dict(
        pos_encoding="rope", norm="layernorm", norm_position="pre", emb_scale=False, n_kv_head=None
    ),
}


def gpt2_config_from_hf(cfg: Mapping[str, Any], block_size: Optional[int] = None) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``GPT2Config`` dict; ``block_size`` (default ``n_positions``)
    may crop the learned position table, never grow it (a :class:`MinigptError`, as a key or option
    we lack is)."""
    c = _parse(GPT2Json, cfg)
    n_positions = c.n_positions if c.n_positions is not None else c.n_ctx
    if n_positions is None:
        raise MinigptError("config.json lacks 'n_positions', which a GPT-2 config must have")
    if block_size is not None and block_size > n_positions:
        raise MinigptError(
            f"model.block_size ({block_size}) exceeds the learned position table of this GPT-2 "
            f"(config.json n_positions={n_positions}); use block_size <= {n_positions}"
        )
    return validate(
        {
            "model": dict(
                n_layer=c.n_layer,
                n_head=c.n_head,
                n_embd=c.n_embd,
                vocab_size=c.vocab_size,
                block_size=block_size if block_size is not None else n_positions,
                dropout=c.resid_pdrop,
                norm_eps=c.layer_norm_epsilon,
                d_ff=c.n_inner,
                ffn=_ACTIVATIONS[c.activation_function],
                tie_weights=c.tie_word_embeddings,
                **_FIXED["gpt2"],
            )
        },
        "config.json (gpt2)",
    ).model


def llama_config_from_hf(
    cfg: Mapping[str, Any], block_size: Optional[int] = None, family: str = "llama"
) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``LlamaConfig`` dict (or, ``family="qwen3"``, a
    ``Qwen3Config``'s: QK-norm); ``block_size`` defaults to ``max_position_embeddings``. A
    :class:`MinigptError` names a key or option we lack (:class:`LlamaJson`; a head_dim other than
    hidden_size/num_attention_heads, biases that model.bias cannot hold, Qwen3's sliding window)."""
    qwen3 = family == "qwen3"
    c = _parse(Qwen3Json if qwen3 else LlamaJson, cfg)
    if c.head_dim is not None and c.head_dim * c.num_attention_heads != c.hidden_size:
        raise MinigptError(
            f"config.json head_dim ({c.head_dim}) differs from hidden_size/num_attention_heads "
            f"({c.hidden_size}/{c.num_attention_heads}); our attention needs head_dim = n_embd/n_head"
        )
    if qwen3 and c.attention_bias:
        raise MinigptError(
            "config.json attention_bias=true: Qwen3's MLP has no biases and model.bias covers "
            "both, so only attention_bias: false imports"
        )
    if qwen3 and c.use_sliding_window:
        raise MinigptError(
            "config.json use_sliding_window=true: minigpt attends to the whole context; "
            "only use_sliding_window: false imports"
        )
    if not qwen3 and c.attention_bias != c.mlp_bias:
        raise MinigptError(
            f"config.json attention_bias={c.attention_bias} but mlp_bias={c.mlp_bias}; "
            "model.bias covers both, so they must agree"
        )
    rope = c.rope_parameters
    theta = (
        rope.rope_theta
        if rope is not None and "rope_theta" in rope.model_fields_set
        else c.rope_theta
    )
    positions = 2048 if c.max_position_embeddings is None else c.max_position_embeddings
    return validate(
        {
            "model": dict(
                n_layer=c.num_hidden_layers,
                n_head=c.num_attention_heads,
                n_embd=c.hidden_size,
                block_size=block_size if block_size is not None else positions,
                vocab_size=c.vocab_size,
                dropout=c.attention_dropout,
                bias=c.attention_bias,
                rope_base=theta,
                norm_eps=c.rms_norm_eps,
                d_ff=c.intermediate_size,
                tie_weights=c.tie_word_embeddings,
                n_kv_head=c.num_key_value_heads or c.num_attention_heads,
                **_FIXED[family],
            )
        },
        f"config.json ({family})",
    ).model


def neox_config_from_hf(cfg: Mapping[str, Any], block_size: Optional[int] = None) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``GPTNeoXConfig`` dict; ``block_size`` defaults to
    ``max_position_embeddings``. A :class:`MinigptError` names a key or option we lack
    (:class:`NeoXJson`; a rotary part under 1)."""
    c = _parse(NeoXJson, cfg)
    rope = c.rope_parameters
    given = rope.model_fields_set if rope is not None else set()
    pct = rope.partial_rotary_factor if "partial_rotary_factor" in given else c.rotary_pct
    if pct != 1:
        raise MinigptError(
            f"config.json rotates {pct} of each head (rotary_pct / partial_rotary_factor); "
            "our RoPE rotates all of it (1.0)"
        )
    positions = 2048 if c.max_position_embeddings is None else c.max_position_embeddings
    return validate(
        {
            "model": dict(
                n_layer=c.num_hidden_layers,
                n_head=c.num_attention_heads,
                n_embd=c.hidden_size,
                block_size=block_size if block_size is not None else positions,
                vocab_size=c.vocab_size,
                dropout=c.hidden_dropout,
                bias=c.attention_bias,
                rope_base=rope.rope_theta if "rope_theta" in given else c.rotary_emb_base,
                norm_eps=c.layer_norm_eps,
                d_ff=c.intermediate_size,
                ffn=_ACTIVATIONS[c.hidden_act],
                tie_weights=c.tie_word_embeddings,
                **_FIXED["gpt_neox"],
            )
        },
        "config.json (gpt_neox)",
    ).model


def _expected_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our parameter names and shapes for ``model_cfg`` (built on the meta device, no memory)."""
    import torch

    from ..model.gpt import GPT

    with torch.device("meta"):
        model = GPT(model_cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if model_cfg.tie_weights:
        shapes.pop("lm_head.weight", None)
    return shapes


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _check(
    out: dict[str, torch.Tensor], model_cfg: ModelConfig, unused: list[str], family: str
) -> dict[str, torch.Tensor]:
    """``out`` if it holds exactly the floating-point tensors :class:`GPT` expects for
    ``model_cfg``, in their shapes."""
    expected = _expected_shapes(model_cfg)
    surplus = sorted([*unused, *(set(out) - set(expected))])
    lacks = sorted(set(expected) - set(out))
    shape = next(
        (k for k, want in expected.items() if k in out and tuple(out[k].shape) != want), None
    )
    dtype = next((k for k in expected if k in out and not out[k].is_floating_point()), None)
    bad = out[shape or dtype] if shape or dtype else None
    if surplus:
        raise MinigptError(
            f"{family} weights hold tensors this config has no place for: {_names(surplus)}; "
            "config.json and the weights disagree"
        )
    if lacks:
        raise MinigptError(
            f"{family} weights lack {_names(lacks)}; the file is incomplete or not of this "
            "architecture"
        )
    if shape:
        raise MinigptError(
            f"{family} tensor for {shape} has shape {tuple(bad.shape)}, but config.json implies "
            f"{expected[shape]}"
        )
    if dtype:
        raise MinigptError(
            f"the weights hold {bad.dtype} tensors ({dtype}); a model's weights are floating "
            "point: the file is not this model's"
        )
    return {k: out[k] for k in expected}


def load_gpt2_state_dict(
    sd: Mapping[str, torch.Tensor], model_cfg: ModelConfig
) -> dict[str, torch.Tensor]:
    """A ``GPT2LMHeadModel`` state dict under our names and layouts (module docstring), checked by
    :func:`_check`; the position table cropped to ``block_size``, a tied head dropped."""
    theirs = {k.removeprefix("transformer."): t for k, t in sd.items()}  # otherwise our names
    for name in [
        n for n in theirs if n.endswith((".attn.bias", ".attn.masked_bias")) and n.count(".") == 3
    ]:
        del theirs[name]  # causal-mask buffers of old checkpoints, not weights
    if model_cfg.tie_weights:
        theirs.pop("lm_head.weight", None)  # the head is the embedding
    out = {}
    for name in [n for n in _expected_shapes(model_cfg) if n in theirs]:  # what lacks, _check names
        t = theirs.pop(name)
        # Conv1D weights are (in, out); a position table shorter than block_size is a shape _check
        # names.
        t = (
            t.t()
            if _GPT2_CONV1D.fullmatch(name)
            else t[: model_cfg.block_size]
            if name == "wpe.weight"
            else t
        )
        out[name] = t.contiguous()
    return _check(out, model_cfg, list(theirs), "GPT-2")


_LLAMA_LAYER = {
    "input_layernorm.weight": "ln_1.weight",
    "post_attention_layernorm.weight": "ln_2.weight",
    "self_attn.o_proj.weight": "attn.c_proj.weight",
    "self_attn.o_proj.bias": "attn.c_proj.bias",
    "mlp.down_proj.weight": "mlp.c_proj.weight",
    "mlp.down_proj.bias": "mlp.c_proj.bias",
    "self_attn.q_norm.weight": "attn.q_norm.weight",  # Qwen3's QK-norm (model.qk_norm)
    "self_attn.k_norm.weight": "attn.k_norm.weight",
}
# Stacked along the output dimension, in this order: c_attn = [q; k; v], c_fc = [gate; up].
_LLAMA_FUSED = {
    "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj"),
}


def llama_names(mc: ModelConfig) -> dict[str, tuple[str, ...]]:
    """The one Llama name table, both ways: our tensor name -> transformers' (``model.`` left off),
    several names where ours stacks them."""
    names = {
        "wte.weight": ("embed_tokens.weight",),
        "ln_f.weight": ("norm.weight",),
        "lm_head.weight": ("lm_head.weight",),
    }
    for i in range(mc.n_layer):
        names.update(
            {f"h.{i}.{ours}": (f"layers.{i}.{theirs}",) for theirs, ours in _LLAMA_LAYER.items()}
        )
        names.update(
            {
                f"h.{i}.{ours}.{kind}": tuple(f"layers.{i}.{part}.{kind}" for part in parts)
                for ours, parts in _LLAMA_FUSED.items()
                for kind in ("weight", "bias")
            }
        )
    return names


def load_llama_state_dict(
    sd: Mapping[str, torch.Tensor], model_cfg: ModelConfig
) -> dict[str, torch.Tensor]:
    """A ``LlamaForCausalLM`` state dict under our names and layouts (module docstring), checked by
    :func:`_check`."""
    import torch

    theirs = {
        k.removeprefix("model."): t for k, t in sd.items() if not k.endswith("rotary_emb.inv_freq")
    }
    if model_cfg.tie_weights:
        theirs.pop("lm_head.weight", None)  # the head is the embedding
    wanted = _expected_shapes(model_cfg)
    out = {
        ours: torch.cat([theirs.pop(n) for n in names])
        for ours, names in llama_names(model_cfg).items()
        if ours in wanted and all(n in theirs for n in names)
    }  # else _check names what lacks
    return _check(out, model_cfg, list(theirs), "Llama")


#: Ours -> GPT-NeoX's module names within a layer (``gpt_neox.layers.{i}.``), each with a weight and
#: a bias.
_NEOX_LAYER = {
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attn.c_attn": "attention.query_key_value",
    "attn.c_proj": "attention.dense",
    "mlp.c_fc": "mlp.dense_h_to_4h",
    "mlp.c_proj": "mlp.dense_4h_to_h",
}


def neox_names(mc: ModelConfig) -> dict[str, str]:
    """The one GPT-NeoX name table, both ways: our tensor name -> transformers' in a saved folder
    (``embed_out``, which transformers 5 renames ``lm_head`` on loading and back on saving), biases
    included."""
    names = {
        "wte.weight": "gpt_neox.embed_in.weight",
        "lm_head.weight": "embed_out.weight",
        **{f"ln_f.{kind}": f"gpt_neox.final_layer_norm.{kind}" for kind in ("weight", "bias")},
    }
    for i in range(mc.n_layer):
        names.update(
            {
                f"h.{i}.{ours}.{kind}": f"gpt_neox.layers.{i}.{theirs}.{kind}"
                for ours, theirs in _NEOX_LAYER.items()
                for kind in ("weight", "bias")
            }
        )
    return names


def neox_qkv(t: torch.Tensor, n_head: int, to_neox: bool) -> torch.Tensor:
    """``c_attn``'s rows (3·n_embd, ...) as ``[q; k; v]``, heads in each, to GPT-NeoX's
    ``query_key_value``, ``[q_h; k_h; v_h]`` for each head h (its ``view(..., n_head, 3 *
    head_size)``), or back (``to_neox`` False)."""
    stacked = (3, n_head, -1) if to_neox else (n_head, 3, -1)
    return t.reshape(*stacked, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()


def load_neox_state_dict(
    sd: Mapping[str, torch.Tensor], model_cfg: ModelConfig
) -> dict[str, torch.Tensor]:
    """A ``GPTNeoXForCausalLM`` state dict under our names and layouts (module docstring), checked
    by :func:`_check`; with ``model.bias`` false (``attention_bias: false``) its MLP and LayerNorm
    biases must be zeros, and are dropped."""
    theirs = {
        ("embed_out.weight" if k == "lm_head.weight" else k): t
        for k, t in sd.items()
        if not k.endswith(("rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias"))
    }
    names = neox_names(model_cfg)
    if model_cfg.tie_weights:
        theirs.pop(names["lm_head.weight"], None)  # the head is the embedding
    if (
        not model_cfg.bias
    ):  # GPT-NeoX's MLP and LayerNorms always have biases: zeros stand for our none
        zeros = [
            n
            for ours, n in names.items()
            if ours.endswith(".bias") and ".attn." not in ours and n in theirs
        ]
        nonzero = next((name for name in zeros if theirs[name].any()), None)
        if nonzero:
            raise MinigptError(
                f"config.json attention_bias=false, but {nonzero} is not zero; model.bias covers "
                "every bias, so the file's MLP and LayerNorm biases must then be zeros"
            )
        for name in zeros:
            del theirs[name]
    out = {}
    for ours in [
        n for n in _expected_shapes(model_cfg) if names[n] in theirs
    ]:  # what lacks, _check names
        t = theirs.pop(names[ours])
        out[ours] = neox_qkv(t, model_cfg.n_head, to_neox=False) if ".attn.c_attn." in ours else t
    return _check(out, model_cfg, list(theirs), "GPT-NeoX")


_FAMILIES = {
    "gpt2": (gpt2_config_from_hf, load_gpt2_state_dict),
    "llama": (llama_config_from_hf, load_llama_state_dict),
    "gpt_neox": (neox_config_from_hf, load_neox_state_dict),
    "qwen3": (functools.partial(llama_config_from_hf, family="qwen3"), load_llama_state_dict),
}


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a ``save_pretrained`` folder: ``model.safetensors``, or the shards
    its index names (a :class:`MinigptError` when there are none, naming a ``.bin``/``.pth`` file
    found instead)."""
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    if index.is_file():
        return [
            folder / n
            for n in sorted(
                set(
                    _parse(
                        _Index, read_text_file(index, "the index", JSON_BOUNDS), str(index)
                    ).weight_map.values()
                )
            )
        ]
    other = [p.name for pattern in ("*.bin", "*.pth") for p in folder.glob(pattern)]
    raise MinigptError(
        f"{folder} has no model.safetensors",
        f"found {other[0]}: re-save it with save_pretrained(..., safe_serialization=True)"
        if other
        else "save the model with save_pretrained",
    )


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        try:
            sd.update(load_file(str(f), device="cpu"))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise MinigptError(
                f"{f} is missing, corrupt or truncated ({str(exc).splitlines()[0]})"
            ) from None
    return sd


def read_hf_config(path: str | Path, block_size: Optional[int] = None) -> tuple[str, ModelConfig]:
    """The ``model_type`` (gpt2, llama, gpt_neox or qwen3) of a ``save_pretrained`` folder and our
    :class:`ModelConfig` for it;
    a :class:`MinigptError` for no folder or config.json, a config.json its schema refuses."""
    folder = Path(path)
    cfg_path = folder / "config.json"
    ours = (
        folder.parent.parent if folder.parent.name == runs.CHECKPOINTS else folder
    )  # a run's checkpoint too
    if not folder.is_dir():
        raise MinigptError(
            f"{str(ours)!r} is not a folder; pass a folder saved with save_pretrained"
        )
    if not cfg_path.is_file() and runs.has_checkpoint(ours):
        raise MinigptError(
            f"{ours} is a minigpt run, not a Hugging Face folder; continue it with --resume "
            f"{ours}, or export it first (minigpt export {ours} --output DIR) and pass DIR"
        )
    if not cfg_path.is_file():
        raise MinigptError(
            f"{ours}/config.json not found; the folder must hold config.json and model.safetensors"
        )
    text = read_text_file(cfg_path, "the model's config", JSON_BOUNDS)
    kind = _parse(_Kind, text, str(cfg_path)).model_type
    fields = parse_json(text, cfg_path, "the model's config", JSON_BOUNDS)
    return kind, _FAMILIES[kind][0](fields, block_size=block_size)


def load_hf_folder(path: str | Path, block_size: Optional[int] = None) -> GPT:
    """Our GPT (float32, CPU, eval mode) from a local GPT-2, Llama, GPT-NeoX or Qwen3
    ``save_pretrained`` folder; ``block_size`` as the ``*_config_from_hf`` take it. Refused as
    :func:`read_hf_config` and :func:`_check` refuse."""
    import torch

    from ..model.gpt import GPT

    kind, model_cfg = read_hf_config(path, block_size)
    sd = {k: v.float() for k, v in _FAMILIES[kind][1](_read_weights(Path(path)), model_cfg).items()}
    with torch.device("meta"):
        model = GPT(model_cfg)  # no memory and no random init for weights about to be replaced
    tied = model.lm_head.weight is model.wte.weight
    model.load_state_dict(sd, strict=False, assign=True)
    if tied:  # assign replaced wte.weight; the head must follow it again
        model.lm_head.weight = model.wte.weight
    assert not any(t.is_meta for t in (*model.parameters(), *model.buffers())), (
        "a tensor was not imported"
    )
    return model.eval()
