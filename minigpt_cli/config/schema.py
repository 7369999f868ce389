"""The one config schema: pydantic models, ``--set`` overrides, validation, the key reference.

A config is validated once, at the edge (the CLI), and passed around as a typed
:class:`Config`. Unknown keys and wrong types are errors that name the key, and
cross-field rules (``n_embd % n_head == 0``, even head size for RoPE, ...) are
checked here, before any tensor exists. Every field carries a one-line
``description``; :func:`describe_keys` prints them. YAML reading and writing
live in :mod:`minigpt_cli.config.yaml_io`. This module must not import torch: the
CLI loads configs for ``count-params`` without it.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Sequence

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import ConfigError, MinigptError
from .messages import MODEL_RULES, format_error
from .yaml_io import dump_yaml, parse_yaml


class _Strict(BaseModel):
    # allow_inf_nan=False: `.inf` or `.nan` (or "inf" through --set) is never a usable setting.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


#: A path from the config: ``~`` means the home folder, as in a shell (a literal ``~`` folder would
#: surprise, and the hints minigpt prints would point elsewhere once pasted into a shell).
UserPath = Annotated[str, AfterValidator(os.path.expanduser)]


class ModelConfig(_Strict):
    """Architecture of the decoder-only Transformer (GPT-2's names)."""

    n_layer: int = Field(6, ge=1, description="number of Transformer blocks")
    n_head: int = Field(6, ge=1, description="attention (query) heads per block; must divide n_embd")
    n_embd: int = Field(384, ge=1, description="model width d: the embedding and residual-stream size")
    block_size: int = Field(256, ge=1, description="context length in tokens")
    vocab_size: Optional[int] = Field(None, ge=1, description="rows of the token embedding; null: the tokenizer's size")
    dropout: float = Field(0.0, ge=0.0, lt=1.0,
                           description="dropout probability on embeddings, attention weights and residual branches "
                                       "(training only)")
    bias: bool = Field(True, description="biases in the attention and MLP linear layers and in LayerNorm "
                                         "(GPT-2: true, Llama: false)")
    pos_encoding: Literal["learned", "sinusoidal", "rope", "none"] = Field(
        "learned", description="positions: a learned table (GPT-2), sinusoidal (Vaswani et al. 2017 §3.5), "
                               "rotary (RoPE, Su et al. 2021) or none")
    rope_base: float = Field(10000.0, gt=0.0, description="RoPE frequency base θ (Su et al. 2021; Llama 2: 10000); "
                                                          "used with pos_encoding: rope")
    norm: Literal["layernorm", "rmsnorm"] = Field(
        "layernorm", description="LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019)")
    norm_eps: float = Field(1e-5, gt=0.0,
                            description="epsilon added to the variance (RMSNorm: mean square) in each norm")
    norm_position: Literal["pre", "post"] = Field(
        "pre", description="pre: norm before each sub-layer, plus a final norm (GPT-2); post: after each residual "
                           "add, no final norm (Vaswani et al. 2017)")
    ffn: Literal["relu", "gelu", "gelu_tanh", "swiglu"] = Field(
        "gelu", description="feed-forward activation: ReLU, exact GELU, GPT-2's tanh GELU, or SwiGLU (Shazeer 2020)")
    d_ff: Optional[int] = Field(
        None, ge=1, description="feed-forward hidden width; null: 4·n_embd, for swiglu 8·n_embd/3 rounded up to "
                                "multiple_of")
    multiple_of: int = Field(256, ge=1, description="round SwiGLU's derived d_ff up to a multiple of this "
                                                    "(Llama's FeedForward); unused when d_ff is set")
    tie_weights: bool = Field(True, description="share the token embedding with the output layer (Press & Wolf 2017)")
    scale_residual_init: bool = Field(
        True, description="scale the init of residual output projections by 1/sqrt(2·n_layer) (GPT-2 §2.3)")
    emb_scale: bool = Field(False, description="multiply token embeddings by sqrt(n_embd) (Vaswani et al. 2017 §3.4)")
    n_kv_head: Optional[int] = Field(
        None, ge=1, description="key/value heads, for grouped-query attention (Ainslie et al. 2023); must divide "
                                "n_head; null: n_head")
    init_std: float = Field(0.02, gt=0.0, description="standard deviation of the normal init of linear and "
                                                      "embedding weights (GPT-2: 0.02)")
    init_from: Optional[UserPath] = Field(
        None, description="fine-tune a local Hugging Face GPT-2 or Llama folder: its architecture, weights and "
                          "tokenizer.json; null: random init")

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

    def width_rules(self) -> list[tuple[int, str]]:
        """What ``n_embd`` must be a multiple of, with the rule's name (:data:`~.config_errors.MODEL_RULES`):
        n_head (whole heads); 2·n_head for RoPE, which rotates pairs of a head's dimensions; 2 for sinusoidal
        positions, pairs of sin and cos. The width a refusal suggests passes them all (:meth:`fitting_width`)."""
        rules = [(self.n_head, "divisible")]
        if self.pos_encoding == "rope":
            rules.append((2 * self.n_head, "rope"))
        if self.pos_encoding == "sinusoidal":
            rules.append((2, "sinusoidal"))
        return rules

    def fitting_width(self) -> int:
        """The ``n_embd`` nearest the given one that every rule of :meth:`width_rules` accepts."""
        step = math.lcm(*(multiple for multiple, _ in self.width_rules()))
        return step * max(1, round(self.n_embd / step))

    @model_validator(mode="after")
    def _check_sizes(self) -> "ModelConfig":
        # d_ff and n_kv_head given as null stand for values (4·d or SwiGLU's rounding, n_head) that always pass.
        for multiple, rule in self.width_rules():
            if self.n_embd % multiple != 0:
                raise ValueError(MODEL_RULES[rule].format(n_embd=self.n_embd, n_head=self.n_head,
                                                          head=self.head_dim, fit=self.fitting_width()))
        if self.n_kv_head is not None and self.n_kv_head > self.n_head:
            raise ValueError(MODEL_RULES["kv_above"].format(n_kv_head=self.n_kv_head, n_head=self.n_head))
        if self.n_kv_head is not None and self.n_head % self.n_kv_head != 0:
            raise ValueError(MODEL_RULES["kv_divisor"].format(n_kv_head=self.n_kv_head, n_head=self.n_head))
        return self


class TokenizerConfig(_Strict):
    """Which tokenizer turns text into ids, and where its file lives."""

    kind: Literal["char", "bpe", "wordpiece", "unigram", "hf"] = Field(
        "char", description="char: one id per character; a trained byte-level bpe, wordpiece or unigram; or hf: "
                            "a given Hugging Face tokenizer.json")
    vocab_size: Optional[int] = Field(
        None, ge=1, description="entries in all, special tokens included, for trained kinds; ignored for char")
    path: Optional[UserPath] = Field(
        None, description="tokenizer file; null: <data_dir>/<dataset>/tokenizer-<kind>[-<vocab_size>]"
                          "[-special-<hash>].json, <hash> naming the special tokens")
    special_tokens: list[str] = Field(default_factory=list,
                                      description="strings that always become one id each, e.g. <|endoftext|>")

    @model_validator(mode="after")
    def _check_special_tokens(self) -> "TokenizerConfig":
        from .special_tokens import check_special_tokens  # no torch there; refused before anything runs

        try:
            check_special_tokens(self.special_tokens)
        except MinigptError as exc:
            raise ValueError(f"tokenizer.special_tokens: {exc}") from None
        return self


def _check_dataset(name: str) -> str:
    from ..paths import check_dataset_name

    return check_dataset_name(name)


class DataConfig(_Strict):
    """Corpus and prepared token files."""

    dataset: Annotated[str, AfterValidator(_check_dataset)] = Field(
        "tinyshakespeare", description="a named corpus, downloaded and checksummed: tinyshakespeare (char-rnn's, "
                                       "about 1 MB of plays); unused when data.path is set")
    path: Optional[UserPath] = Field(
        None, description="your own corpus: a UTF-8 .txt file, a folder of .txt/.jsonl files (recursive) or a "
                          "glob; null: data.dataset")
    text_field: str = Field("text", min_length=1, description="the field holding each document's text in .jsonl "
                                                              "files (one JSON object per line)")
    data_dir: UserPath = Field("data", description="folder of corpora, tokenizers and token files (<data_dir>/"
                                                   "<dataset>/, or <data_dir>/<name>-<fingerprint>/ for data.path)")
    url: Optional[str] = Field(
        None, description="mirror of the named corpus; null: $MINIGPT_TINYSHAKESPEARE_URL, else the char-rnn "
                          "repository"
    )
    val_fraction: float = Field(0.1, gt=0.0, lt=1.0,
                                description="share held out for validation: the last documents when there are "
                                            "10 or more, else the end of the text")
    fingerprint: Optional[str] = Field(
        None, description="sha256 of the corpus files (names, sizes, contents), written by train into a run's "
                          "config.yaml; set: refuse any other corpus")

    @model_validator(mode="after")
    def _check_source(self) -> "DataConfig":
        if self.path is not None and self.dataset != "tinyshakespeare":
            raise ValueError(f"data.path and data.dataset ({self.dataset}) both name a corpus; keep one of them")
        if self.path is not None and self.url:
            raise ValueError("data.url names a mirror of a named dataset, but data.path is set: there is nothing "
                             "to download; drop data.url")
        return self


class TrainConfig(_Strict):
    """Optimisation, schedule, evaluation and logging."""

    batch_size: int = Field(64, ge=1, description="sequences per micro-batch, per process")
    grad_accum_steps: int = Field(1, ge=1, description="micro-batches whose gradients make one optimizer step")
    max_iters: int = Field(5000, ge=0, description="optimizer steps in all (a --resume trains on up to it)")
    max_seconds: Optional[float] = Field(
        None, gt=0.0, description="also end the run (with its final eval) once this many seconds have passed, evals "
                                  "included; null: no time limit")
    learning_rate: float = Field(1e-3, gt=0.0, description="peak learning rate, reached at the end of the warmup")
    min_lr: float = Field(1e-4, ge=0.0, description="learning rate at the end of the cosine or linear decay")
    warmup_iters: int = Field(100, ge=0, description="optimizer steps of linear warmup up to learning_rate")
    lr_schedule: Literal["cosine", "linear", "constant", "inverse_sqrt"] = Field(
        "cosine", description="after the warmup: cosine or linear decay to min_lr, constant, or inverse_sqrt "
                              "(Vaswani et al. 2017 §5.3)")
    lr_decay_iters: Optional[int] = Field(None, ge=1, description="step at which the decay reaches min_lr; "
                                                                  "null: max_iters")
    weight_decay: float = Field(0.1, ge=0.0, description="AdamW weight decay on matrices and embeddings; biases and "
                                                         "norm gains get none")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW's first-moment (momentum) decay rate")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="AdamW's second-moment decay rate")
    grad_clip: float = Field(1.0, ge=0.0, description="clip the global gradient norm to this; 0 disables clipping")
    eval_interval: int = Field(250, ge=1, description="steps between evals of train and val loss; each eval "
                                                      "saves checkpoints")
    eval_iters: int = Field(200, ge=1, description="global batches per split at each eval: eval_iters x batch_size x "
                                                   "grad_accum_steps x processes windows")
    eval_at_start: bool = Field(True, description="also evaluate before the first step (the untrained loss, about "
                                                  "ln(vocab_size)); false saves one eval")
    log_interval: int = Field(10, ge=1, description="steps between train-loss records in metrics.jsonl (and the bar's loss)")
    sample_tokens: int = Field(200, ge=0, description="tokens sampled into samples.txt at each eval, from "
                                                      "sample.prompt with the sample section's settings; 0: none")
    early_stop_patience: Optional[int] = Field(
        None, ge=1, description="stop after this many evals in a row without a new best val loss; null: never")
    keep_every: Optional[int] = Field(
        None, ge=1, description="also keep a checkpoint every this many steps (checkpoints/step-NNNNNNN); null: none")
    out_dir: UserPath = Field("runs", description="folder that holds the run folders")
    tensorboard: bool = Field(False, description="also write TensorBoard event files (needs the tensorboard package)")
    parallelism: Literal["ddp", "fsdp"] = Field("ddp", description="under torchrun: ddp, a whole model per process; "
                                                "fsdp, weights, gradients and AdamW moments sharded over the processes")

    @model_validator(mode="after")
    def _check_lr(self) -> "TrainConfig":
        if self.min_lr > self.learning_rate and self.lr_schedule in ("cosine", "linear"):  # the others ignore it
            raise ValueError(
                f"train.min_lr ({self.min_lr}) must not exceed train.learning_rate "
                f"({self.learning_rate})"
            )
        if self.lr_decay_iters is not None and self.lr_decay_iters < self.warmup_iters:
            raise ValueError(
                f"train.lr_decay_iters ({self.lr_decay_iters}) ends the decay before the warmup ends "
                f"(train.warmup_iters {self.warmup_iters}); set it to at least {self.warmup_iters}, or null"
            )
        # An explicit lr_decay_iters before the warmup's end drops the rate to min_lr as the warmup ends. null
        # (max_iters) below warmup_iters cannot: the run ends inside the warmup. Short trial runs
        # (--set train.max_iters=3) and their saved configs therefore load.
        return self


class SampleConfig(_Strict):
    """Defaults for ``minigpt generate`` (Hugging Face's names)."""

    prompt: str = Field("\n", description="text minigpt generate continues when --prompt is not given")
    max_new_tokens: int = Field(500, ge=0, description="tokens generated per sample")
    temperature: float = Field(0.8, ge=0.0, allow_inf_nan=False,
                               description="divides the logits before sampling; 0: greedy")
    top_k: Optional[int] = Field(200, ge=1, description="sample from the k most likely tokens only; null: all")
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, description="nucleus sampling: the smallest set of likeliest "
                                                                     "tokens holding this probability; null: off")
    num_samples: int = Field(1, ge=1, description="samples generated, decoded together as one batch")
    window_stride: Optional[int] = Field(
        None, ge=1, description="tokens the context drops at once past block_size; null: block_size // 4"
    )


#: Refused at load for ``device: cpu`` and when a run starts for ``device: auto`` that finds a CPU.
FLOAT16_ON_CPU = "dtype: float16 needs a GPU; use dtype: auto, float32 or bfloat16 on the CPU"

#: The device names a config (and ``generate --device``) may give.
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"


def _check_device(name: str) -> str:
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise ValueError(f"device: {name!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return name


#: A device name, checked at load (the device's presence is checked when a command starts).
Device = Annotated[str, AfterValidator(_check_device)]


class Config(_Strict):
    """A whole run: model, tokenizer, data, training, sampling, device."""

    name: str = Field("run", min_length=1, description="names the run folder (<name>-<date>-<time>) and --resume "
                                                       "auto's match; letters, digits, '.', '_', '-'")
    seed: int = Field(1337, ge=0, lt=2**32, description="random seed of init, batches and samples; 0 .. 2**32-1 "
                                                        "(numpy's range)")
    device: Device = Field("auto", description="auto: CUDA, else Apple MPS, else CPU; cuda:N: the N-th CUDA GPU")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="training precision: auto is bfloat16 autocast on CUDA where supported (else float16), "
                            "float32 elsewhere; float16 needs a GPU")
    compile: bool = Field(False, description="torch.compile the model: a slower start, often faster steps")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the Transformer's architecture")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="text to ids")
    data: DataConfig = Field(default_factory=DataConfig, description="corpus and token files")
    train: TrainConfig = Field(default_factory=TrainConfig, description="optimisation, schedule, evals, logging")
    sample: SampleConfig = Field(default_factory=SampleConfig, description="defaults for minigpt generate")

    @model_validator(mode="after")
    def _check_run(self) -> "Config":
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name):
            raise ValueError(
                f"name: {self.name!r} may only hold letters, digits, '.', '_' and '-'"
            )
        if self.tokenizer.kind == "hf" and not (self.tokenizer.path or self.model.init_from):
            raise ValueError("tokenizer.kind hf reads a Hugging Face tokenizer.json: set tokenizer.path to it, or "
                             "model.init_from to the model's folder")
        if self.device == "cpu" and self.dtype == "float16":  # train refuses it too, when device: auto finds a CPU
            raise ValueError(FLOAT16_ON_CPU)
        stride = self.sample.window_stride  # null: block_size // 4, which always fits
        if stride is not None and stride > self.model.block_size:
            raise ValueError(MODEL_RULES["window_stride"].format(stride=stride, block_size=self.model.block_size))
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """The config as YAML; strings with line breaks are written double-quoted ("\\n"), on one line."""
        return dump_yaml(self.to_dict())


def _fields(model: type[BaseModel] = Config, prefix: str = ""):
    """(key, field) for every key, ``section.key`` in a section; a section comes just before its keys (the
    key reference of ``config-keys`` and the README is built from these)."""
    for name, field in model.model_fields.items():
        yield prefix + name, field
        if _is_section(field):
            yield from _fields(field.annotation, prefix + name + ".")


def _is_section(field: Any) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


# ----------------------------------------------------------------------------- validation


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
        raise ConfigError(format_error(err, source, [key for key, _ in _fields()])) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a parsed config mapping.

    Values are parsed as YAML (``3e-4`` -> float, ``true`` -> bool, ``null``
    -> None), except that a key holding text keeps the text as typed when
    YAML would read something else (``sample.prompt=ROMEO:`` is not a
    mapping); the schema then checks the key and the type.

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
        if value is not None and not isinstance(value, str) and _TEXT_KEYS.get(key, False):
            value = raw  # a text key takes the text as given: --set sample.prompt=ROMEO: or name=2024
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


#: Whether a key holds free text (its type is a string, maybe null): ``--set`` keeps such values as typed.
_TEXT_KEYS = {key: field.annotation in (str, Optional[str]) for key, field in _fields() if not _is_section(field)}


def load_config(path: str | Path, overrides: list[str] | None = None, note=lambda message: None) -> Config:
    """Load a YAML config file or a shipped config by name (``shakespeare-cpu``), apply ``--set`` overrides, validate.

    ``note`` hears which shipped file a missing ``configs/NAME.yaml`` stands for (:func:`~minigpt_cli.paths.resolve_config`).

    Raises:
        ConfigError: missing or unreadable file, invalid YAML, or a schema error.
    """
    from ..paths import resolve_config

    p = resolve_config(path, note)  # the one resolver: the CLI's names are the API's
    if p.is_dir():
        raise ConfigError(f"config {str(p)!r} is a folder; pass a YAML file, e.g. configs/shakespeare-cpu.yaml")
    if not p.is_file():
        from ..paths import list_configs

        configs = list_configs()
        hint = f"; shipped configs (pass the name alone): {', '.join(configs)}" if configs else ""
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
