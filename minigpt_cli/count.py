"""The ``count-params`` command as a function: a config in, the accounting of :mod:`minigpt_cli.params` out."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from . import params
from .config import Config, ModelConfig
from .errors import MinigptError

#: Characters in Tiny Shakespeare: the char vocabulary ``train`` would find there.
TINY_SHAKESPEARE_CHARS = 65


def count_params(cfg: Config | ModelConfig, *, seq_len: Optional[int] = None, tokens: Optional[float] = None,
                 vocab_size: Optional[int] = None, dtype: str = "float32", batch_size: int = 1,
                 echo: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Exact parameters, FLOPs per token and training memory of a model (:func:`minigpt_cli.params.report`).

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
        dtype: ``float32``, ``bfloat16`` or ``float16``, for the memory estimate.
        batch_size: sequences per step, for the activation estimate.
        echo: where notes go.

    Returns:
        The report: ``total``, ``non_embedding``, ``embedding``, FLOPs and memory keys.

    Raises:
        MinigptError: an unknown dtype, a fractional or infinite ``tokens``.
    """
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
