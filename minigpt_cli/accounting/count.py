"""The ``count-params`` command as a function: a config in, the accounting of :mod:`minigpt_cli.accounting.params` out."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from ..config.schema import Config, ModelConfig
from ..errors import MinigptError
from . import params

#: Characters in Tiny Shakespeare: the char vocabulary ``train`` would find there.
TINY_SHAKESPEARE_CHARS = 65

#: The ``count-params`` flags that override a config key, and that key: a ``--set`` of it then has no effect.
FLAG_KEYS = {"--vocab-size": "model.vocab_size", "--batch-size": "train.batch_size", "--dtype": "dtype"}


def overrides_in_effect(set_items: Sequence[str], flags: dict[str, Any]) -> list[str]:
    """The overrides a report was counted with, as its header names them.

    Each ``--set KEY=VALUE`` that took effect: the last one of each key (in the
    order of those), unless a flag given in ``flags`` (``{"--vocab-size":
    50304}``, None for one not given) overrides that key (:data:`FLAG_KEYS`);
    then ``--vocab-size N`` when given, the one flag that changes the model
    (``--batch-size`` and ``--dtype`` set the memory section's figures, which
    it names).
    """
    beaten = {FLAG_KEYS[flag] for flag, value in flags.items() if value is not None and flag in FLAG_KEYS}
    last: dict[str, str] = {}
    for item in set_items:
        key = item.split("=", 1)[0].strip()
        last.pop(key, None)  # a later --set of the same key wins
        last[key] = item.strip()
    out = [item for key, item in last.items() if key not in beaten]
    if flags.get("--vocab-size") is not None:
        out.append(f"--vocab-size {flags['--vocab-size']}")
    return out


def memory_settings(cfg: Config | ModelConfig, dtype: Optional[str], batch_size: Optional[int]) -> tuple[str, int]:
    """The dtype and batch the memory section counts with: those given, else what ``train`` would use.

    ``dtype``: the given one, else the config's ``dtype`` unless ``auto``
    (whose device is not known here), else float32. ``batch_size``: the
    given one, else the config's ``train.batch_size`` when it has a train
    section (in its YAML or a ``--set train.*``; a preset has none), else 1.
    """
    whole = isinstance(cfg, Config)
    if dtype is None:
        dtype = cfg.dtype if whole and cfg.dtype != "auto" else "float32"
    if batch_size is None:
        batch_size = cfg.train.batch_size if whole and "train" in cfg.model_fields_set else 1
    return dtype, batch_size


def count_params(cfg: Config | ModelConfig, *, seq_len: Optional[int] = None, tokens: Optional[float] = None,
                 vocab_size: Optional[int] = None, dtype: Optional[str] = None, batch_size: Optional[int] = None,
                 echo: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Exact parameters, FLOPs per token and training memory of a model (:func:`minigpt_cli.accounting.params.report`).

    The vocabulary is ``vocab_size``, else the config's ``model.vocab_size``,
    else its ``tokenizer.vocab_size``; a char tokenizer with neither counts
    Tiny Shakespeare's 65 characters plus its special tokens, with a note
    through ``echo``.

    Args:
        cfg: a whole config, or just its model section.
        seq_len: context length for the FLOPs (None: ``block_size``); beyond
            ``block_size`` the figures are arithmetic only (a note says so).
        tokens: training tokens, for the total FLOPs (a whole number).
        vocab_size: overrides the config's vocabulary.
        dtype: ``float32``, ``bfloat16`` or ``float16``, for the memory estimate;
            None: the config's (:func:`memory_settings`).
        batch_size: sequences per micro-batch, for the activation estimate; None:
            the config's ``train.batch_size`` (:func:`memory_settings`).
            ``train.grad_accum_steps`` adds no memory (each micro-batch's
            activations are freed by its backward pass).
        echo: where notes go.

    Returns:
        The report: ``total``, ``non_embedding``, ``embedding``, FLOPs and memory keys.

    Raises:
        MinigptError: an unknown dtype, a fractional or infinite ``tokens``.
    """
    dtype, batch_size = memory_settings(cfg, dtype, batch_size)
    if dtype not in params.DTYPE_BYTES:
        raise MinigptError(f"--dtype {dtype!r}: use float32, bfloat16 or float16")
    if tokens is not None and math.isinf(tokens):
        raise MinigptError("--tokens inf: give a finite number of training tokens, e.g. --tokens 3e11")
    if tokens is not None and tokens != int(tokens):
        raise MinigptError(f"--tokens {tokens:g}: give a whole number of training tokens, e.g. --tokens 3e11")
    mc = cfg if isinstance(cfg, ModelConfig) else cfg.model
    vocab = vocab_size or mc.vocab_size
    if vocab is None and isinstance(cfg, Config):
        vocab = cfg.tokenizer.vocab_size
        if vocab is None and cfg.tokenizer.kind == "char":
            specials = len(cfg.tokenizer.special_tokens)
            vocab = TINY_SHAKESPEARE_CHARS + specials  # Tiny Shakespeare's alphabet, as train would find it
            echo(f"note: model.vocab_size is null; counting with {vocab} entries (Tiny Shakespeare's 65 characters"
                 f"{f' and {specials} special token' + 's' * (specials > 1) if specials else ''}); "
                 "pass --vocab-size N for another corpus")
    if seq_len is not None and seq_len > mc.block_size:
        echo(f"note: --seq-len {seq_len:,} is beyond block_size {mc.block_size:,}, the longest context the "
             f"model takes; the FLOPs and memory at {seq_len:,} are arithmetic only")
    return params.report(mc, seq_len=seq_len, tokens=int(tokens) if tokens else None,
                         vocab_size=vocab, dtype=dtype, batch_size=batch_size)
