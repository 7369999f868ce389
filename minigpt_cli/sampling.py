"""Sampling from a trained GPT, with a KV cache.

Past ``block_size`` the context window slides, and it slides by
``window_stride`` tokens at a time: when one more token would not fit, the
oldest ``window_stride`` tokens leave together, so the model sees between
``block_size - window_stride + 1`` and ``block_size`` tokens. ``window_stride``
1 is nanoGPT's rule (the last ``block_size`` tokens at every step); the
default, ``block_size // 4``, keeps at least three quarters of the window.

The cached and uncached paths follow the same rule and give the same tokens.
Inside the window the cached path feeds only the newest token and reuses the
keys and values of the others. When the window slides the cache is refilled
from the tokens that stay: whatever the position encoding, every key and
value above the first layer was computed from hidden states that saw the
tokens that left, so keeping them would not be exact. With stride 1 that is a
full forward at every step past ``block_size`` and the cache stops paying;
with stride s the refill comes once every s tokens (llama.cpp's "context
shift" drops half the window at once for the same reason, but keeps the
stale keys).

``block_size`` and a learned position table: the table has exactly
``block_size`` rows and generation never feeds the model more than
``block_size`` tokens (a longer prompt is cropped to its last ``block_size``
tokens, with a note), so no prompt length or ``max_new_tokens`` is
impossible. Where a learned table and ``block_size`` can disagree, weights
made elsewhere, the importer refuses a ``block_size`` beyond the table
(:func:`minigpt_cli.hf.gpt2_config_from_hf`).
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from .errors import MinigptError
from .model import GPT


def filter_logits(logits: torch.Tensor, top_k: Optional[int] = None, top_p: Optional[float] = None) -> torch.Tensor:
    """Mask logits (B, V) outside the top-k and the nucleus with -inf.

    top_k keeps the k largest (ties at the k-th value kept, as nanoGPT).
    top_p keeps the smallest set of most likely tokens whose probability mass
    reaches p, the most likely token always (Holtzman et al. 2020 §3.1).
    """
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits.float(), dim=-1)
        # Mass before each token; a token is dropped when that mass already reaches p.
        before = probs.cumsum(dim=-1) - probs
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, temperature: float, top_k: Optional[int], top_p: Optional[float],
                generator: Optional[torch.Generator]) -> torch.Tensor:
    """Next ids (B,) from last-position logits (B, V). Temperature 0 is greedy (argmax), and so is
    a temperature so small that the scaled logits overflow float32."""
    if torch.isnan(logits).any():
        raise MinigptError(
            "the model's output is NaN (its weights are finite, but the forward pass overflows), so there is "
            "nothing to sample; retrain it with a smaller model.init_std or train.learning_rate"
        )
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if torch.isposinf(scaled).any():  # (no NaN here: refused above)
        # A temperature so small (e.g. 1e-45) that logits/T overflows: its limit, greedy.
        return logits.argmax(dim=-1)
    logits = filter_logits(scaled, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def resolve_window_stride(block_size: int, window_stride: Optional[int]) -> int:
    """The stride the window slides by: ``window_stride``, or ``block_size // 4`` (at least 1) when None.

    Raises:
        MinigptError: a stride outside 1 .. ``block_size``.
    """
    if window_stride is None:
        return max(1, block_size // 4)
    if not 1 <= window_stride <= block_size:
        raise MinigptError(
            f"window_stride {window_stride}: must be between 1 and block_size ({block_size}); "
            f"1 slides one token at a time, {max(1, block_size // 4)} is the default"
        )
    return window_stride


@torch.no_grad()
def generate_tokens(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    use_cache: bool = True,
    generator: Optional[torch.Generator] = None,
    vocab_limit: Optional[int] = None,
    window_stride: Optional[int] = None,
) -> Iterator[torch.Tensor]:
    """Yield each new token, (B,) int64, as it is sampled.

    Args:
        model: a GPT in eval mode.
        idx: prompt ids (B, T), T ≥ 1; only the last ``block_size`` are seen.
        max_new_tokens: tokens to produce.
        temperature: divides the logits; 0 means greedy.
        top_k: keep only the k most likely tokens (None: all).
        top_p: nucleus sampling mass, 0 < p ≤ 1 (None: off).
        use_cache: reuse keys/values of past positions (a KV cache).
        generator: the RNG for sampling (seeded by the caller).
        vocab_limit: never sample ids at or above this (a model vocabulary
            padded beyond its tokenizer's entries).
        window_stride: tokens the context window drops at once when it is
            full (see the module docstring); None: ``block_size // 4``.

    Raises:
        MinigptError: ``window_stride`` outside 1 .. ``block_size``.
    """
    block = model.config.block_size
    stride = resolve_window_stride(block, window_stride)
    seq = idx
    start = max(0, seq.size(1) - block)  # the window is seq[:, start:]
    cache = None
    refill = True
    for _ in range(max_new_tokens):
        if not use_cache:
            logits, _ = model(seq[:, start:], last_only=True)
        elif refill:
            # Fill the cache with the whole window: at the start and after each slide.
            if cache is None:
                cache = model.new_cache(seq.size(0), block)
            cache.reset()
            logits, _ = model(seq[:, start:], cache=cache, last_only=True)
            refill = False
        else:
            logits, _ = model(seq[:, -1:], cache=cache, last_only=True)
        last = logits[:, -1, :]
        if vocab_limit is not None and vocab_limit < last.size(-1):
            last = last.clone()
            last[:, vocab_limit:] = float("-inf")
        nxt = sample_next(last, temperature, top_k, top_p, generator)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        if seq.size(1) - start > block:
            start += stride
            refill = True
        yield nxt
