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
from typing import Any, Mapping, Optional

import torch

from ..config.schema import ConfigError, ModelConfig, validate
from ..errors import MinigptError
from ..model.gpt import GPT

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_GPT2_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")


def _model_config(values: dict[str, Any], source: str) -> ModelConfig:
    """Validate ``model`` keys through the one schema (its errors name the key)."""
    try:
        return validate({"model": values}, source).model
    except ConfigError as exc:
        raise MinigptError(f"{exc}; this checkpoint cannot be imported") from None


def _max_positions(cfg: Mapping[str, Any]) -> Any:
    """Llama's ``max_position_embeddings``; 2048 where null (0 does not fall back: the schema refuses it)."""
    value = cfg.get("max_position_embeddings")
    return 2048 if value is None else value


def _need(cfg: Mapping[str, Any], key: str, family: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise MinigptError(f"config.json lacks {key!r}, which a {family} config must have")
    return cfg[key]


def gpt2_config_from_hf(cfg: Mapping[str, Any], block_size: Optional[int] = None) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``GPT2Config`` dict; ``block_size`` (default ``n_positions``) may crop
    the learned position table, never grow it.

    Raises:
        MinigptError: a missing key, an option we do not implement, ``block_size`` past ``n_positions``.
    """
    # null falls back (0 does not: the schema refuses it as a size)
    n_positions = int(cfg["n_positions"] if cfg.get("n_positions") is not None else _need(cfg, "n_ctx", "GPT-2"))
    act = cfg.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise MinigptError(
            f"config.json activation_function {act!r} is not supported; known: {', '.join(_GPT2_ACTIVATIONS)}"
        )
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if cfg.get(key, want) != want:
            raise MinigptError(f"config.json {key}={cfg[key]!r} is not supported (only {want})")
    if block_size is not None and block_size > n_positions:
        raise MinigptError(
            f"model.block_size ({block_size}) exceeds the learned position table of this GPT-2 "
            f"(config.json n_positions={n_positions}); use block_size <= {n_positions}"
        )
    return _model_config(
        dict(
            n_layer=_need(cfg, "n_layer", "GPT-2"),
            n_head=_need(cfg, "n_head", "GPT-2"),
            n_embd=_need(cfg, "n_embd", "GPT-2"),
            block_size=block_size if block_size is not None else n_positions,
            vocab_size=_need(cfg, "vocab_size", "GPT-2"),
            dropout=float(cfg.get("resid_pdrop", 0.0)),
            bias=True,
            pos_encoding="learned",
            norm="layernorm",
            norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
            norm_position="pre",
            ffn=_GPT2_ACTIVATIONS[act],
            d_ff=cfg.get("n_inner"),
            tie_weights=bool(cfg.get("tie_word_embeddings", True)),
            emb_scale=False,
            n_kv_head=None,
        ),
        "config.json (gpt2)",
    )


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    """rope_theta from a transformers 4.x (``rope_theta``/``rope_scaling``) or 5.x (``rope_parameters``) config."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for name, p in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(p, Mapping):
            raise MinigptError(f"config.json {name} must be an object, not {type(p).__name__}")
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in (None, "default"):
            raise MinigptError(
                f"config.json rope type {kind!r} is not supported (only plain RoPE, rope_type 'default')"
            )
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
        raise MinigptError(f"config.json rope_theta {theta!r} is not a positive number")
    return float(theta)


def llama_config_from_hf(cfg: Mapping[str, Any], block_size: Optional[int] = None) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``LlamaConfig`` dict; ``block_size`` defaults to ``max_position_embeddings``.

    Raises:
        MinigptError: a missing key, ``hidden_act`` other than silu, RoPE scaling, a ``head_dim`` other than
            hidden_size/num_attention_heads, attention and MLP biases that differ.
    """
    hidden = _need(cfg, "hidden_size", "Llama")
    heads = _need(cfg, "num_attention_heads", "Llama")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise MinigptError(f"config.json hidden_act {act!r} is not supported (Llama's SwiGLU uses silu)")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        raise MinigptError(
            f"config.json head_dim ({head_dim}) differs from hidden_size/num_attention_heads "
            f"({hidden}/{heads}); our attention needs head_dim = n_embd/n_head"
        )
    attn_bias, mlp_bias = bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))
    if attn_bias != mlp_bias:
        raise MinigptError(
            f"config.json attention_bias={attn_bias} but mlp_bias={mlp_bias}; model.bias covers both, so they must agree"
        )
    return _model_config(
        dict(
            n_layer=_need(cfg, "num_hidden_layers", "Llama"),
            n_head=heads,
            n_embd=hidden,
            block_size=block_size if block_size is not None else int(_max_positions(cfg)),
            vocab_size=_need(cfg, "vocab_size", "Llama"),
            dropout=float(cfg.get("attention_dropout", 0.0)),
            bias=attn_bias,
            pos_encoding="rope",
            rope_base=_rope_theta(cfg),
            norm="rmsnorm",
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            norm_position="pre",
            ffn="swiglu",
            d_ff=_need(cfg, "intermediate_size", "Llama"),
            tie_weights=bool(cfg.get("tie_word_embeddings", False)),
            emb_scale=False,
            n_kv_head=cfg.get("num_key_value_heads") or heads,
        ),
        "config.json (llama)",
    )


def _expected_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our parameter names and shapes for ``model_cfg`` (built on the meta device, no memory)."""
    with torch.device("meta"):
        model = GPT(model_cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if model_cfg.tie_weights:
        shapes.pop("lm_head.weight", None)
    return shapes


def _check(out: dict[str, torch.Tensor], model_cfg: ModelConfig, unused: list[str], family: str) -> dict[str, torch.Tensor]:
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
            if t.shape[0] < model_cfg.block_size:
                raise MinigptError(
                    f"model.block_size ({model_cfg.block_size}) exceeds the learned position table "
                    f"({t.shape[0]} rows in wpe.weight)"
                )
            t = t[: model_cfg.block_size]
        elif not re.fullmatch(r"wte\.weight|ln_f\.(weight|bias)|h\.\d+\.(ln_[12]|attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.(weight|bias)", name):
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
                if all(p is None for p in pieces):
                    continue
                if any(p is None for p in pieces):
                    lacking = [s for s, p in zip(srcs, pieces) if p is None]
                    raise MinigptError(f"Llama weights lack layers.{layer}.{lacking[0]}.{kind}; the file is incomplete")
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
            raise MinigptError(f"{index} is not a safetensors index ({type(exc).__name__}); re-save the model") from None
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
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MinigptError(f"{cfg_path} is not valid JSON ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(hf_cfg, dict):
        raise MinigptError(f"{cfg_path} must hold a JSON object")
    kind = hf_cfg.get("model_type")
    if kind not in _FAMILIES:
        raise MinigptError(f"{cfg_path}: model_type {kind!r} is not supported; known: {', '.join(_FAMILIES)}")
    try:
        return kind, _FAMILIES[kind][0](hf_cfg, block_size=block_size)
    except (TypeError, ValueError, AttributeError) as exc:  # a number given as text, a list for an object, ...
        raise MinigptError(f"{cfg_path} holds a value of the wrong type ({str(exc).splitlines()[0][:120]}); "
                           "fix config.json or re-save the model") from None


def load_hf_folder(path: str | Path, block_size: Optional[int] = None) -> GPT:
    """Our GPT (float32, CPU, eval mode) from a local GPT-2 or Llama ``save_pretrained`` folder (config.json and
    model.safetensors, or its shards); ``block_size`` as the ``*_config_from_hf`` take it.

    Raises:
        MinigptError: as :func:`read_hf_config`, or weights that do not fit the config.
    """
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
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"internal error: {left[:3]} not loaded from the imported weights")
    return model.eval()
