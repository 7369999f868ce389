"""The one config schema: pydantic models, YAML loading, ``--set`` overrides.

A config is validated once, at the edge (the CLI), and passed around as a typed
:class:`Config`. Unknown keys and wrong types are errors that name the key, and
cross-field rules (``n_embd % n_head == 0``, even head size for RoPE, ...) are
checked here, before any tensor exists. This module must not import torch: the
CLI loads configs for ``count-params`` without it.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import reprlib
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Sequence

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError, MinigptError


class _Strict(BaseModel):
    # allow_inf_nan=False: `.inf` or `.nan` (or "inf" through --set) is never a usable setting.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


class ModelConfig(_Strict):
    """Architecture of the decoder-only Transformer (GPT-2's names)."""

    n_layer: int = Field(6, ge=1, description="number of Transformer blocks")
    n_head: int = Field(6, ge=1, description="attention heads per block")
    n_embd: int = Field(384, ge=1, description="model width d")
    block_size: int = Field(256, ge=1, description="context length in tokens")
    vocab_size: Optional[int] = Field(
        None, ge=1, description="null: taken from the tokenizer"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = True
    pos_encoding: Literal["learned", "sinusoidal", "rope", "none"] = "learned"
    rope_base: float = Field(10000.0, gt=0.0)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = Field(1e-5, gt=0.0)
    norm_position: Literal["pre", "post"] = "pre"
    ffn: Literal["relu", "gelu", "gelu_tanh", "swiglu"] = "gelu"
    d_ff: Optional[int] = Field(
        None, ge=1, description="null: 4*d, or 8d/3 rounded up to multiple_of for SwiGLU"
    )
    multiple_of: int = Field(256, ge=1)
    tie_weights: bool = True
    scale_residual_init: bool = True
    emb_scale: bool = False
    n_kv_head: Optional[int] = Field(None, ge=1, description="null: n_head")
    init_std: float = Field(0.02, gt=0.0)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def ffn_hidden(self) -> int:
        """Hidden width of the feed-forward block.

        4*d (Vaswani et al. 2017, GPT-2); for SwiGLU 2/3 of that, rounded up to
        ``multiple_of`` so the parameter count stays that of a 4*d MLP (Shazeer
        2020 §2; Llama's ``FeedForward``: d=4096, multiple_of=256 -> 11008).
        """
        if self.d_ff is not None:
            return self.d_ff
        if self.ffn == "swiglu":
            hidden = int(2 * (4 * self.n_embd) / 3)
            return self.multiple_of * math.ceil(hidden / self.multiple_of)
        return 4 * self.n_embd

    @model_validator(mode="after")
    def _check_sizes(self) -> "ModelConfig":
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head "
                f"({self.n_head}); e.g. n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}"
            )
        if self.n_kv_head is not None and self.n_kv_head > self.n_head:
            raise ValueError(
                f"model.n_kv_head ({self.n_kv_head}) must not exceed model.n_head ({self.n_head}); "
                f"grouped-query attention shares each key/value head among n_head/n_kv_head query heads"
            )
        if self.n_kv_head is not None and self.n_head % self.n_kv_head != 0:
            raise ValueError(
                f"model.n_head ({self.n_head}) must be a multiple of model.n_kv_head "
                f"({self.n_kv_head})"
            )
        if self.pos_encoding == "rope" and self.head_dim % 2 != 0:
            raise ValueError(
                f"model.pos_encoding=rope needs an even head size, but "
                f"model.n_embd/model.n_head = {self.n_embd}/{self.n_head} = {self.head_dim}"
            )
        if self.pos_encoding == "sinusoidal" and self.n_embd % 2 != 0:
            raise ValueError(
                f"model.pos_encoding=sinusoidal needs an even model.n_embd, got {self.n_embd}"
            )
        return self


#: A path from the config: ``~`` means the home folder, as in a shell (a literal ``~`` folder would
#: surprise, and the hints minigpt prints would point elsewhere once pasted into a shell).
UserPath = Annotated[str, AfterValidator(os.path.expanduser)]


class TokenizerConfig(_Strict):
    """Which tokenizer turns text into ids, and where its file lives."""

    kind: Literal["char", "bpe", "wordpiece", "unigram"] = "char"
    vocab_size: Optional[int] = Field(
        None, ge=1, description="target size for trained kinds; ignored for char"
    )
    path: Optional[UserPath] = Field(
        None, description="tokenizer file; null: data/<dataset>/tokenizer-<kind>[-<vocab_size>][-special-<hash>].json"
    )
    special_tokens: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_special_tokens(self) -> "TokenizerConfig":
        from .tokenizer import check_special_tokens  # no torch there; refused before anything runs

        try:
            check_special_tokens(self.special_tokens)
        except MinigptError as exc:
            raise ValueError(f"tokenizer.special_tokens: {exc}") from None
        return self


class DataConfig(_Strict):
    """Corpus and prepared token files."""

    dataset: Literal["tinyshakespeare"] = "tinyshakespeare"
    data_dir: UserPath = "data"
    url: Optional[str] = Field(
        None, description="mirror of the corpus; else $MINIGPT_TINYSHAKESPEARE_URL or the default"
    )
    val_fraction: float = Field(0.1, gt=0.0, lt=1.0)


class TrainConfig(_Strict):
    """Optimisation, schedule, evaluation and logging."""

    batch_size: int = Field(64, ge=1)
    grad_accum_steps: int = Field(1, ge=1)
    max_iters: int = Field(5000, ge=0, description="optimizer steps")
    learning_rate: float = Field(1e-3, gt=0.0)
    min_lr: float = Field(1e-4, ge=0.0)
    warmup_iters: int = Field(100, ge=0)
    lr_schedule: Literal["cosine", "linear", "constant", "inverse_sqrt"] = "cosine"
    lr_decay_iters: Optional[int] = Field(None, ge=1, description="null: max_iters")
    weight_decay: float = Field(0.1, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.99, ge=0.0, lt=1.0)
    grad_clip: float = Field(1.0, ge=0.0, description="0 disables clipping")
    eval_interval: int = Field(250, ge=1)
    eval_iters: int = Field(200, ge=1)
    log_interval: int = Field(10, ge=1)
    sample_tokens: int = Field(200, ge=0, description="tokens sampled into samples.txt at each eval")
    early_stop_patience: Optional[int] = Field(None, ge=1)
    keep_every: Optional[int] = Field(None, ge=1)
    out_dir: UserPath = "runs"
    tensorboard: bool = False

    @model_validator(mode="after")
    def _check_lr(self) -> "TrainConfig":
        if self.min_lr > self.learning_rate:
            raise ValueError(
                f"train.min_lr ({self.min_lr}) must not exceed train.learning_rate "
                f"({self.learning_rate})"
            )
        if self.lr_decay_iters is not None and self.lr_decay_iters < self.warmup_iters:
            raise ValueError(
                f"train.lr_decay_iters ({self.lr_decay_iters}) ends the decay before the warmup ends "
                f"(train.warmup_iters {self.warmup_iters}); set it to at least {self.warmup_iters}, or null"
            )
        return self


class SampleConfig(_Strict):
    """Defaults for ``minigpt generate`` (Hugging Face's names)."""

    prompt: str = "\n"
    max_new_tokens: int = Field(500, ge=0)
    temperature: float = Field(0.8, ge=0.0)
    top_k: Optional[int] = Field(200, ge=1)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    num_samples: int = Field(1, ge=1)
    window_stride: Optional[int] = Field(
        None, ge=1, description="tokens the context drops at once past block_size; null: block_size // 4"
    )


class Config(_Strict):
    """A whole run: model, tokenizer, data, training, sampling, device."""

    name: str = Field("run", min_length=1)
    seed: int = Field(1337, ge=0, lt=2**32, description="0 .. 2**32-1 (numpy's range)")
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: bool = False
    model: ModelConfig = Field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    sample: SampleConfig = Field(default_factory=SampleConfig)

    @model_validator(mode="after")
    def _check_run(self) -> "Config":
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            raise ValueError(
                f"device: {self.device!r} is not one of auto, cpu, cuda, cuda:N, mps"
            )
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name):
            raise ValueError(
                f"name: {self.name!r} may only hold letters, digits, '.', '_' and '-'"
            )
        stride = self.sample.window_stride
        if stride is not None and stride > self.model.block_size:
            raise ValueError(
                f"sample.window_stride: {stride} is larger than model.block_size ({self.model.block_size}); "
                f"use 1 .. {self.model.block_size}"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """The config as YAML; strings with line breaks are written double-quoted ("\\n"), on one line."""
        return yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False)


# ----------------------------------------------------------------------------- YAML


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes a string holding a line break as one double-quoted line."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = '"' if any(c in text for c in "\n\r") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that a config may not use (a duplicate key, an alias); ``problem`` holds the whole message."""

    def __init__(self, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``3e-4`` as a float (YAML 1.1 wants ``3.0e-4``) and refuses duplicate keys.

    A key given twice in one mapping is an error naming both lines (PyYAML
    would silently keep the last). Anchors and aliases (``&name``, ``*name``)
    are refused: a config does not need them, and nested aliases ("billion
    laughs") turn a few lines into an object too large to validate or print.
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(f"alias *{event.anchor}: a config may not use anchors and aliases; "
                           "write the value out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeConstructor reports it
                continue
            if first is not None:
                raise _Refused(f"duplicate key {key!r}, first given on line {first.line + 1}; keep one of them",
                               key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text; a syntax error becomes a one-line :class:`ConfigError`."""
    try:
        return yaml.load(text, Loader=_Loader)
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML (nested too deeply); a config is a few flat sections") from None
    except _Refused as exc:
        mark = exc.problem_mark
        raise ConfigError(f"{source}: line {mark.line + 1}, column {mark.column + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}:{where}: invalid YAML ({problem}); fix the syntax") from None


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, prefix + name + "."))
    return keys


#: Shows a value in an error message, cut to a readable length.
_short_repr = reprlib.Repr()
_short_repr.maxstring = _short_repr.maxother = 80
_short_repr.maxlist = _short_repr.maxdict = 6
_short_repr.maxlevel = 3


def _format_error(err: dict[str, Any], source: str) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        close = difflib.get_close_matches(loc, _known_keys(Config), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "; remove it (the Configs section of README.md lists the keys)"
        return f"{source}: {loc}: unknown key{hint}"
    msg = err["msg"]
    if err["type"] == "model_type":  # "valid dictionary or instance of TrainConfig": a section given a value
        return (f"{source}: {loc or 'config'}: is a section, not a value (got {_short_repr.repr(err.get('input'))}); "
                f"give it keys: a mapping under {loc or 'train'}: in the file, or --set {loc or 'train'}.KEY=VALUE")
    if msg.startswith("Value error, "):
        # Cross-field rules already name their keys.
        return f"{source}: {msg[len('Value error, '):]}"
    got = err.get("input")
    got_s = "" if isinstance(got, dict) else f" (got {_short_repr.repr(got)})"
    return f"{source}: {loc or 'config'}: {msg[0].lower() + msg[1:]}{got_s}"


def validate(data: Any, source: str = "config", overridden: Sequence[str] = ()) -> Config:
    """Validate a parsed mapping into a :class:`Config`.

    ``overridden``: keys (``section.key``) whose values came from ``--set``;
    an error about one of them names ``--set`` instead of ``source``.

    Raises:
        ConfigError: naming the first bad key (unknown, wrong type, out of
            range) or the broken cross-field rule.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        if any(loc == key or loc.startswith(key + ".") for key in overridden):
            source = "--set"  # the bad value is one the command line gave
        else:
            # A rule over a whole section (or the config) that a --set value may be part of.
            within = [key for key in overridden if not loc or key.startswith(loc + ".")]
            if within:
                source = f"{source} with --set {', '.join(dict.fromkeys(within))}"
        raise ConfigError(_format_error(err, source)) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a parsed config mapping.

    Values are parsed as YAML (``3e-4`` -> float, ``true`` -> bool, ``null``
    -> None); the schema then checks the key and the type.

    Raises:
        ConfigError: for an override without ``=`` or a path through a non-mapping.
    """
    data = dict(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. --set train.learning_rate=3e-4")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"--set {item!r}: the key is empty; expected section.key=value")
        value = parse_yaml(raw, f"--set {key}") if raw.strip() else ""
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
            else:
                child = dict(child)
            node[part] = child
            node = child
        node[parts[-1]] = value
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config file, apply ``--set`` overrides, validate.

    Raises:
        ConfigError: missing or unreadable file, invalid YAML, or a schema error.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config {str(p)!r} is a folder; pass a YAML file, e.g. configs/shakespeare-cpu.yaml")
    if not p.is_file():
        hint = ""
        configs = sorted(x.name for x in Path("configs").glob("*.yaml")) if Path("configs").is_dir() else []
        if configs:
            hint = f"; shipped configs: {', '.join('configs/' + c for c in configs)}"
        raise ConfigError(f"config file {str(p)!r} not found{hint}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {str(p)!r}: {exc}") from None
    data = parse_yaml(text, str(p))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(data).__name__}")
    if overrides:
        data = apply_overrides(data, overrides)
    return validate(data, str(p), [item.split("=", 1)[0].strip() for item in overrides or []])
