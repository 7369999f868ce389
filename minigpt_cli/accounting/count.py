"""The ``count-params`` command as a function: a config in, the accounting of :mod:`.params` out."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from ..config.schema import Config, ModelConfig
from ..errors import MinigptError
from . import params

#: Characters in Tiny Shakespeare: the char vocabulary ``train`` would find there.
TINY_SHAKESPEARE_CHARS = 65

#: The ``count-params`` flags that override a config key, and that key: a ``--set`` of it then has
#: no effect.
FLAG_KEYS = {
    "--vocab-size": "model.vocab_size",
    "--batch-size": "train.batch_size",
    "--dtype": "dtype",
}


def overrides_in_effect(set_items: Sequence[str], flags: dict[str, Any]) -> list[str]:
    """The overrides the report's header names: the last ``--set`` of each key unless one of
    ``flags`` (given: not None) overrides that key (:data:`FLAG_KEYS`), then ``--vocab-size N``, the
    one flag that changes the model (``--batch-size`` and ``--dtype`` are named by the memory
    section)."""
    beaten = {
        FLAG_KEYS[flag] for flag, value in flags.items() if value is not None and flag in FLAG_KEYS
    }
    last: dict[str, str] = {}
    for item in set_items:
        key = item.split("=", 1)[0].strip()
        last.pop(key, None)  # a later --set of the same key wins, in its own place in the order
        last[key] = item.strip()
    out = [item for key, item in last.items() if key not in beaten]
    if flags.get("--vocab-size") is not None:
        out.append(f"--vocab-size {flags['--vocab-size']}")
    return out


def memory_settings(
    cfg: Config | ModelConfig, dtype: Optional[str], batch_size: Optional[int]
) -> tuple[str, int]:
    """The dtype and batch the memory section counts with: those given, else what ``train`` would
    use: the config's ``dtype`` unless ``auto`` (whose device is not known here: float32), and its
    ``train.batch_size`` when it has a train section (a preset has none: 1)."""
    whole = isinstance(cfg, Config)
    if dtype is None:
        dtype = cfg.dtype if whole and cfg.dtype != "auto" else "float32"
    if batch_size is None:
        batch_size = cfg.train.batch_size if whole and "train" in cfg.model_fields_set else 1
    return dtype, batch_size


def counted_vocab(cfg: Config, echo: Callable[[str], None] = lambda message: None) -> Optional[int]:
    """The vocabulary ``cfg``'s model is counted with before its tokenizer exists (``count-params``,
    and ``train``'s memory check and ``--dry-run`` before the corpus is downloaded):
    ``model.vocab_size``, else ``tokenizer.vocab_size``, else for a char tokenizer Tiny
    Shakespeare's 65 characters and the special tokens (said through ``echo``); None when none is
    known."""
    vocab = cfg.model.vocab_size or cfg.tokenizer.vocab_size
    if vocab is None and cfg.tokenizer.kind == "char":
        specials = len(cfg.tokenizer.special_tokens)
        vocab = (
            TINY_SHAKESPEARE_CHARS + specials
        )  # Tiny Shakespeare's alphabet, as train would find it
        echo(
            f"note: model.vocab_size is null; counting with {vocab} entries (Tiny Shakespeare's 65 "
            f"characters{f' and {specials} special token' + 's' * (specials > 1) if specials else ''}); "
            "pass --vocab-size N for another corpus"
        )
    return vocab


def count_params(
    cfg: Config | ModelConfig,
    *,
    seq_len: Optional[int] = None,
    tokens: Optional[float] = None,
    vocab_size: Optional[int] = None,
    dtype: Optional[str] = None,
    batch_size: Optional[int] = None,
    echo: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Exact parameters, FLOPs per token and training memory of a model
    (:func:`minigpt_cli.accounting.params.report`).

    The vocabulary is ``vocab_size``, else the model's, else the tokenizer's; a char tokenizer with
    neither counts Tiny Shakespeare's 65 characters and its special tokens, with a note through
    ``echo``. ``seq_len`` (default ``block_size``) sets the FLOPs and activations, ``tokens`` the
    total training FLOPs, ``dtype`` and ``batch_size`` the memory (default:
    :func:`memory_settings`). Raises MinigptError: an unknown dtype; ``tokens`` not a whole number
    >= 1."""
    dtype, batch_size = memory_settings(cfg, dtype, batch_size)
    if dtype not in params.DTYPE_BYTES:
        raise MinigptError(f"--dtype {dtype!r}: use float32, bfloat16 or float16")
    if tokens is not None and not (math.isfinite(tokens) and tokens == int(tokens) and tokens >= 1):
        raise MinigptError(
            f"--tokens {tokens:g}: give a whole number of training tokens, e.g. --tokens 3e11"
        )
    mc = cfg if isinstance(cfg, ModelConfig) else cfg.model
    vocab = vocab_size or (counted_vocab(cfg, echo) if isinstance(cfg, Config) else mc.vocab_size)
    if seq_len is not None and seq_len > mc.block_size:
        echo(
            f"note: --seq-len {seq_len:,} is beyond block_size {mc.block_size:,}, the longest context the "
            f"model takes; the FLOPs and memory at {seq_len:,} are arithmetic only"
        )
    return params.report(
        mc,
        seq_len=seq_len,
        tokens=int(tokens) if tokens else None,
        vocab_size=vocab,
        dtype=dtype,
        batch_size=batch_size,
        optimizer=cfg.train.optimizer if isinstance(cfg, Config) else "adamw",
    )
