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

import math
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


#: The largest temperature float32 rounds to 0 (half its smallest subnormal, 2**-149): below it
#: logits / T would be 0 / 0 at the maximum, so sampling takes the limit T -> 0 instead.
FLOAT32_ZERO = 2.0 ** -150


def check_temperature(temperature: float) -> None:
    """Refuse a temperature that is not a finite number >= 0 (infinity would sample uniform noise, NaN nothing).

    Raises:
        MinigptError: naming the value and the range.
    """
    try:
        value = float(temperature)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise MinigptError(f"temperature {temperature!r}: must be a finite number >= 0 (0: greedy); e.g. 0.8")


def _overflow_error(peak: torch.Tensor) -> MinigptError:
    what = "NaN" if bool(torch.isnan(peak).any()) else "infinite"
    return MinigptError(
        f"the model's output is {what} (its weights are finite, but the forward pass overflows), so there is "
        "nothing to sample; retrain it with a smaller model.init_std or train.learning_rate"
    )


def sample_next(logits: torch.Tensor, temperature: float, top_k: Optional[int], top_p: Optional[float],
                generator: Optional[torch.Generator]) -> torch.Tensor:
    """Next ids (B,) int64, sampled from softmax(logits / T) of last-position logits (B, V).

    softmax(l / T) is the Boltzmann distribution at temperature T (Ackley,
    Hinton & Sejnowski 1985); the shift below is the log-sum-exp trick.

    Temperature 0 is greedy (argmax, the first of tied maxima). For T > 0 the
    logits are shifted by their row maximum before dividing: softmax is
    invariant to a shift, and z = (l - max l) / T is 0 at the maxima and
    <= 0 elsewhere, so for any finite T and any logits (either sign, any
    scale, -inf entries masked out) nothing overflows to +inf and softmax
    never sees a row of -inf. As T -> 0 this becomes the limit of
    softmax(l / T): uniform over the tied maxima, 0 elsewhere (greedy up to
    ties); a T that float32 rounds to 0 (<= :data:`FLOAT32_ZERO`) takes that
    limit directly. T is applied in float32; a gap between logits beyond
    float32's range counts as -inf (probability 0). Top-k and top-p filter
    the scaled logits (:func:`filter_logits`). A -inf logit is never sampled.

    Raises:
        MinigptError: a temperature that is not finite and >= 0; logits holding
            NaN or +inf, or a row of only -inf (the forward pass overflowed).
    """
    check_temperature(temperature)
    logits = logits.float()
    peak = logits.amax(dim=-1, keepdim=True)  # NaN anywhere in a row makes its max NaN
    if not bool(torch.isfinite(peak).all()):
        raise _overflow_error(peak)
    if temperature == 0:
        return logits.argmax(dim=-1)
    gap = logits - peak  # (B, V): 0 at the maxima, <= 0 or -inf elsewhere
    if temperature > FLOAT32_ZERO:
        # In float64: a T beyond float32's range (1e39) would be inf there, and -inf / inf is NaN.
        scaled = (gap.double() / temperature).float()
    else:  # the limit T -> 0: the maxima alone, equally likely
        scaled = gap.masked_fill(gap < 0, float("-inf"))
    probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_sampled(ids: torch.Tensor, limit: int) -> None:
    """Refuse a sampled id (B,) outside [0, ``limit``): a sampler fault, not a token (some devices'
    ``torch.multinomial`` have returned int64-min).

    Raises:
        MinigptError: naming the first bad id, the device and the vocabulary.
    """
    bad = (ids < 0) | (ids >= limit)
    if bool(bad.any()):
        value = int(ids[bad][0])
        raise MinigptError(
            f"the sampler on {ids.device} returned token id {value}, outside the vocabulary (0 to {limit - 1}); "
            f"a fault of torch.multinomial on that device: run with --device cpu"
        )


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
        temperature: divides the logits, a finite number >= 0; 0 means greedy
            (see :func:`sample_next`).
        top_k: keep only the k most likely tokens (None: all).
        top_p: nucleus sampling mass, 0 < p ≤ 1 (None: off).
        use_cache: reuse keys/values of past positions (a KV cache).
        generator: the RNG for sampling (seeded by the caller).
        vocab_limit: never sample ids at or above this (a model vocabulary
            padded beyond its tokenizer's entries).
        window_stride: tokens the context window drops at once when it is
            full (see the module docstring); None: ``block_size // 4``.

    Raises:
        MinigptError: ``window_stride`` outside 1 .. ``block_size``; a temperature
            that is not finite and >= 0 (before any forward pass); the model's
            output NaN or infinite; a sampled id outside [0, ``vocab_limit``)
            (:func:`check_sampled`).
    """
    check_temperature(temperature)
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
        limit = last.size(-1)
        if vocab_limit is not None and vocab_limit < limit:
            limit = vocab_limit
            last = last.clone()
            last[:, vocab_limit:] = float("-inf")
        nxt = sample_next(last, temperature, top_k, top_p, generator)
        check_sampled(nxt, limit)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        if seq.size(1) - start > block:
            start += stride
            refill = True
        yield nxt
