"""Import a local Hugging Face GPT-2 or Llama folder (``save_pretrained``: config.json and safetensors) into our GPT.

Each family has ``*_config_from_hf(config.json) -> ModelConfig`` and ``load_*_state_dict(tensors, cfg)``.
GPT-2's names are ours; its Conv1D weights are (in, out), so ``c_attn``, ``attn.c_proj``, ``c_fc`` and
``mlp.c_proj`` are transposed, and old checkpoints' causal-mask buffers dropped. Llama: q, k, v stack into
``attn.c_attn`` and gate, up into ``mlp.c_fc``; its rotate-half RoPE is :func:`~minigpt_cli.model.gpt.apply_rope`'s,
so no rows are permuted (Meta's own ``consolidated.*.pth`` files, in the other pairing, are not read).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config.schema import ConfigError, ModelConfig, validate
from ..errors import MinigptError
from ..fileio import os_error_message

if TYPE_CHECKING:  # torch is imported where tensors are made: count-params reads config.json without it
    import torch

    from ..model.gpt import GPT

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_GPT2_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")
_GPT2_WEIGHT = re.compile(r"wte\.weight|ln_f\.(weight|bias)"
                          r"|h\.\d+\.(ln_[12]|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(weight|bias)")


class _Json(BaseModel):
    model_config = ConfigDict(extra="ignore")  # config.json holds many keys we have no use for


class GPT2Json(_Json):
    """The keys of a ``GPT2Config``'s config.json that we read; options we do not implement are refused by type."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    n_positions: Optional[int] = None  # null falls back to n_ctx (0 does not: the schema refuses it as a size)
    n_ctx: Optional[int] = None
    activation_function: Literal[tuple(_GPT2_ACTIVATIONS)] = "gelu_new"
    scale_attn_weights: Literal[True] = True
    scale_attn_by_inverse_layer_idx: Literal[False] = False
    add_cross_attention: Literal[False] = False
    resid_pdrop: float = 0.0
    layer_norm_epsilon: float = 1e-5
    n_inner: Optional[int] = None
    tie_word_embeddings: bool = True


class _Rope(_Json):
    """transformers 5.x ``rope_parameters`` (4.x: ``rope_scaling`` and a top-level ``rope_theta``): plain RoPE only."""

    rope_type: Literal["default"] = "default"
    type: Literal["default"] = "default"  # the 4.x spelling of rope_type
    rope_theta: float = Field(10000.0, gt=0, allow_inf_nan=False)


class LlamaJson(_Json):
    """The keys of a ``LlamaConfig``'s config.json that we read."""

    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: Optional[int] = None  # null: 2048 (0 does not fall back: the schema refuses it)
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


def _parse(schema: type[_Json], cfg: Mapping[str, Any], family: str) -> Any:
    """``cfg`` read through ``schema``; the first problem is one line naming the key."""
    try:
        return schema.model_validate(cfg)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(map(str, err["loc"]))
        what = (f"config.json lacks {key!r}, which a {family} config must have" if err["type"] == "missing"
                else f"config.json {key} {err['input']!r} is not supported ({err['msg']})")
        raise MinigptError(what, "fix config.json or re-save the model") from None


def _model_config(values: dict[str, Any], source: str) -> ModelConfig:
    """Validate ``model`` keys through the one schema (its errors name the key)."""
    try:
        return validate({"model": values}, source).model
    except ConfigError as exc:
        raise MinigptError(f"{exc}; this checkpoint cannot be imported") from None


#: Our model keys that every imported model of a family has.
_FIXED = {"gpt2": dict(bias=True, pos_encoding="learned", norm="layernorm", norm_position="pre", emb_scale=False,
                       n_kv_head=None),
          "llama": dict(pos_encoding="rope", norm="rmsnorm", norm_position="pre", ffn="swiglu", emb_scale=False)}


def gpt2_config_from_hf(cfg: Mapping[str, Any], block_size: Optional[int] = None) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``GPT2Config`` dict; ``block_size`` (default ``n_positions``) may crop
    the learned position table, never grow it.

    Raises:
        MinigptError: a missing key, an option we do not implement, ``block_size`` past ``n_positions``.
    """
    c = _parse(GPT2Json, cfg, "GPT-2")
    n_positions = c.n_positions if c.n_positions is not None else c.n_ctx
    if n_positions is None:
        raise MinigptError("config.json lacks 'n_positions', which a GPT-2 config must have")
    if block_size is not None and block_size > n_positions:
        raise MinigptError(
            f"model.block_size ({block_size}) exceeds the learned position table of this GPT-2 "
            f"(config.json n_positions={n_positions}); use block_size <= {n_positions}"
        )
    return _model_config(dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, vocab_size=c.vocab_size,
                              block_size=block_size if block_size is not None else n_positions,
                              dropout=c.resid_pdrop, norm_eps=c.layer_norm_epsilon, d_ff=c.n_inner,
                              ffn=_GPT2_ACTIVATIONS[c.activation_function], tie_weights=c.tie_word_embeddings,
                              **_FIXED["gpt2"]), "config.json (gpt2)")


def llama_config_from_hf(cfg: Mapping[str, Any], block_size: Optional[int] = None) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``LlamaConfig`` dict; ``block_size`` defaults to ``max_position_embeddings``.

    Raises:
        MinigptError: a missing key, ``hidden_act`` other than silu, RoPE scaling, a ``head_dim`` other than
            hidden_size/num_attention_heads, attention and MLP biases that differ.
    """
    c = _parse(LlamaJson, cfg, "Llama")
    if c.head_dim is not None and c.head_dim * c.num_attention_heads != c.hidden_size:
        raise MinigptError(f"config.json head_dim ({c.head_dim}) differs from hidden_size/num_attention_heads "
                           f"({c.hidden_size}/{c.num_attention_heads}); our attention needs head_dim = n_embd/n_head")
    if c.attention_bias != c.mlp_bias:
        raise MinigptError(f"config.json attention_bias={c.attention_bias} but mlp_bias={c.mlp_bias}; model.bias "
                           "covers both, so they must agree")
    rope = c.rope_parameters
    theta = rope.rope_theta if rope is not None and "rope_theta" in rope.model_fields_set else c.rope_theta
    positions = 2048 if c.max_position_embeddings is None else c.max_position_embeddings
    return _model_config(dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                              block_size=block_size if block_size is not None else positions,
                              vocab_size=c.vocab_size, dropout=c.attention_dropout, bias=c.attention_bias,
                              rope_base=theta, norm_eps=c.rms_norm_eps, d_ff=c.intermediate_size,
                              tie_weights=c.tie_word_embeddings,
                              n_kv_head=c.num_key_value_heads or c.num_attention_heads,
                              **_FIXED["llama"]), "config.json (llama)")


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


def _check(out: dict[str, torch.Tensor], model_cfg: ModelConfig, unused: list[str],
           family: str) -> dict[str, torch.Tensor]:
    """``out`` if it holds exactly the tensors :class:`GPT` expects for ``model_cfg``, in their shapes."""
    expected = _expected_shapes(model_cfg)
    unused = list(unused) + sorted(set(out) - set(expected))
    if unused:
        raise MinigptError(
            f"{family} weights hold tensors this config has no place for: {', '.join(sorted(unused)[:3])}"
            f"{' ...' if len(unused) > 3 else ''}; config.json and the weights disagree"
        )
    missing = sorted(set(expected) - set(out))
    if missing:
        raise MinigptError(
            f"{family} weights lack {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; "
            "the file is incomplete or not of this architecture"
        )
    for name, shape in expected.items():
        if tuple(out[name].shape) != shape:
            raise MinigptError(
                f"{family} tensor for {name} has shape {tuple(out[name].shape)}, but config.json implies {shape}"
            )
    return {k: out[k] for k in expected}


def load_gpt2_state_dict(sd: Mapping[str, torch.Tensor], model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A ``GPT2LMHeadModel`` state dict under our names and layouts (module docstring), shapes checked; the
    position table cropped to ``block_size``, a tied head dropped.

    Raises:
        MinigptError: missing, surplus or misshapen tensors.
    """
    out: dict[str, torch.Tensor] = {}
    unused = []
    for key, t in sd.items():
        name = key.removeprefix("transformer.")
        if name.endswith((".attn.bias", ".attn.masked_bias")) and name.count(".") == 3:
            continue  # causal-mask buffers of old checkpoints, not weights
        if name == "lm_head.weight":
            if not model_cfg.tie_weights:
                out[name] = t
            continue
        if _GPT2_CONV1D.fullmatch(name):
            t = t.t()
        elif name == "wpe.weight":
            t = t[: model_cfg.block_size]  # a table shorter than block_size: a shape _check names
        elif not _GPT2_WEIGHT.fullmatch(name):
            unused.append(key)
            continue
        out[name] = t.contiguous()
    return _check(out, model_cfg, unused, "GPT-2")


_LLAMA_SIMPLE = {
    "embed_tokens.weight": "wte.weight",
    "norm.weight": "ln_f.weight",
    "lm_head.weight": "lm_head.weight",
}
_LLAMA_LAYER = {
    "input_layernorm.weight": "ln_1.weight",
    "post_attention_layernorm.weight": "ln_2.weight",
    "self_attn.o_proj.weight": "attn.c_proj.weight",
    "self_attn.o_proj.bias": "attn.c_proj.bias",
    "mlp.down_proj.weight": "mlp.c_proj.weight",
    "mlp.down_proj.bias": "mlp.c_proj.bias",
}
# Stacked along the output dimension, in this order: c_attn = [q; k; v], c_fc = [gate; up].
_LLAMA_FUSED = {
    "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj"),
}


def load_llama_state_dict(sd: Mapping[str, torch.Tensor], model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A ``LlamaForCausalLM`` state dict under our names and layouts (module docstring), shapes checked.

    Raises:
        MinigptError: missing, surplus or misshapen tensors.
    """
    import torch

    out: dict[str, torch.Tensor] = {}
    parts: dict[str, torch.Tensor] = {}
    unused = []
    for key, t in sd.items():
        name = key.removeprefix("model.")
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name in _LLAMA_SIMPLE:
            if name == "lm_head.weight" and model_cfg.tie_weights:
                continue
            out[_LLAMA_SIMPLE[name]] = t
            continue
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if m is None:
            unused.append(key)
            continue
        layer, rest = m.groups()
        if rest in _LLAMA_LAYER:
            out[f"h.{layer}.{_LLAMA_LAYER[rest]}"] = t
        elif any(rest.rsplit(".", 1)[0] in srcs for srcs in _LLAMA_FUSED.values()):
            parts[f"{layer}.{rest}"] = t
        else:
            unused.append(key)
    for layer in range(model_cfg.n_layer):
        for ours, srcs in _LLAMA_FUSED.items():
            for kind in ("weight", "bias"):
                pieces = [parts.pop(f"{layer}.{s}.{kind}", None) for s in srcs]
                if all(p is not None for p in pieces):  # else _check names the fused tensor as lacking
                    out[f"h.{layer}.{ours}.{kind}"] = torch.cat(pieces, dim=0)
    unused += [f"layers.{k}" for k in parts]  # layers beyond n_layer
    return _check(out, model_cfg, unused, "Llama")


_FAMILIES = {
    "gpt2": (gpt2_config_from_hf, load_gpt2_state_dict),
    "llama": (llama_config_from_hf, load_llama_state_dict),
}


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a ``save_pretrained`` folder: ``model.safetensors``, or the shards its index names.

    Raises:
        MinigptError: neither file (naming a ``.bin``/``.pth`` file found instead), or an unreadable index.
    """
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MinigptError(f"{index} is not a safetensors index ({type(exc).__name__})",
                               "re-save the model") from None
        files = [folder / n for n in names]
    else:
        other = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pth")]
        hint = (f"; found {other[0]}: re-save it with save_pretrained(..., safe_serialization=True)"
                if other else "; save the model with save_pretrained")
        raise MinigptError(f"{folder} has no model.safetensors{hint}")
    return files


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        try:
            sd.update(load_file(str(f), device="cpu"))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise MinigptError(f"{f} is missing, corrupt or truncated ({str(exc).splitlines()[0]})") from None
    return sd


def read_hf_config(path: str | Path, block_size: Optional[int] = None) -> tuple[str, ModelConfig]:
    """The ``model_type`` (gpt2 or llama) of a ``save_pretrained`` folder and our :class:`ModelConfig` for it.

    Raises:
        MinigptError: no folder or config.json, invalid JSON, another model_type, an option we lack.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise MinigptError(f"{str(folder)!r} is not a folder; pass a folder saved with save_pretrained")
    cfg_path = folder / "config.json"
    try:
        hf_cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MinigptError(f"{cfg_path} not found; the folder must hold config.json and model.safetensors") from None
    except OSError as exc:  # unreadable: not to be called invalid
        raise MinigptError(os_error_message(exc, cfg_path, "read")) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise MinigptError(f"{cfg_path} is not valid JSON ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(hf_cfg, dict):
        raise MinigptError(f"{cfg_path} must hold a JSON object")
    kind = hf_cfg.get("model_type")
    if kind not in _FAMILIES:
        raise MinigptError(f"{cfg_path}: model_type {kind!r} is not supported; known: {', '.join(_FAMILIES)}")
    return kind, _FAMILIES[kind][0](hf_cfg, block_size=block_size)


def load_hf_folder(path: str | Path, block_size: Optional[int] = None) -> GPT:
    """Our GPT (float32, CPU, eval mode) from a local GPT-2 or Llama ``save_pretrained`` folder (config.json and
    model.safetensors, or its shards); ``block_size`` as the ``*_config_from_hf`` take it.

    Raises:
        MinigptError: as :func:`read_hf_config`, or weights that do not fit the config.
    """
    import torch

    from ..model.gpt import GPT

    kind, model_cfg = read_hf_config(path, block_size)
    sd = _FAMILIES[kind][1](_read_weights(Path(path)), model_cfg)
    not_float = sorted(k for k, v in sd.items() if not v.is_floating_point())
    if not_float:
        raise MinigptError(f"the weights hold {sd[not_float[0]].dtype} tensors ({not_float[0]}); a model's weights "
                           "are floating point: the file is not this model's")
    sd = {k: v.float() for k, v in sd.items()}
    with torch.device("meta"):
        model = GPT(model_cfg)  # no memory and no random init for weights about to be replaced
    tied = model.lm_head.weight is model.wte.weight
    model.load_state_dict(sd, strict=False, assign=True)
    if tied:  # assign replaced wte.weight; the head must follow it again
        model.lm_head.weight = model.wte.weight
    assert not any(t.is_meta for t in (*model.parameters(), *model.buffers())), "a tensor was not imported"
    return model.eval()
