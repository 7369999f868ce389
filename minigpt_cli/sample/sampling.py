"""Sampling from a trained GPT, with a KV cache.

Past ``block_size`` the context window slides, and it slides by
``window_stride`` tokens at a time: when one more token would not fit, the
oldest ``window_stride`` tokens leave together, so the model sees between
``block_size - window_stride + 1`` and ``block_size`` tokens. ``window_stride``
1 is nanoGPT's rule (the last ``block_size`` tokens at every step); the
default, ``block_size // 4``, keeps at least three quarters of the window.

The cached and uncached paths follow the same rule and give the same tokens,
and so does decoding through a static cache with a compiled step
(:mod:`minigpt_cli.sample.decoding`). A batch decodes several samples at once; with a
generator per row, each row draws what it would draw alone.
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
(:func:`minigpt_cli.hf.load.gpt2_config_from_hf`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

import torch

from ..errors import MinigptError
from ..model.gpt import GPT

if TYPE_CHECKING:
    from ..config.schema import SampleConfig
    from ..tokenizer.kinds import Tokenizer
    from .decoding import StaticDecoder


#: The refusals of :func:`encode_prompt`, and the fix for each place a prompt comes from.
_PROMPT = {
    "empty": "{source} is empty; {give}; a newline works: {newline}",
    "not_utf8": ("{source} is not UTF-8 text (byte 0x{byte:02x} at character {at}); convert it to UTF-8 "
                 "(e.g. with iconv)"),
    "unknown": "{source} has characters the tokenizer's vocabulary lacks: {chars}; remove or replace them",
    "no_tokens": "{source} encodes to no tokens; {longer}",
}
_PROMPT_FIXES = {
    "the prompt": {"give": "pass --prompt TEXT", "newline": "--prompt $'\\n'", "longer": "pass a longer --prompt"},
    "sample.prompt": {"give": "set sample.prompt (or pass minigpt generate --prompt TEXT)",
                      "newline": 'sample.prompt: "\\n"',
                      "longer": "set a longer sample.prompt (or pass minigpt generate --prompt TEXT)"},
}


def encode_prompt(tok: Optional[Tokenizer], prompt: str, source: str = "the prompt") -> list[int]:
    """The ids of a prompt to sample from: ``generate``'s prompt, and the ``sample.prompt`` that ``train``
    samples samples.txt from (and checks before step 0, so that ``generate`` cannot fail on it later).

    Args:
        tok: the run's tokenizer; None (a dry run before the tokenizer is trained): the text alone is checked.
        prompt: the text.
        source: where it came from, for the messages: ``"the prompt"`` (``--prompt``, ``--prompt-file``,
            standard input) or ``"sample.prompt"`` (the config).

    Returns:
        The ids, at least one ([] without ``tok``).

    Raises:
        MinigptError: one line naming ``source``: an empty prompt, one that is not UTF-8 (bytes passed
            through as surrogate escapes), characters a char tokenizer lacks, or no tokens at all.
    """
    fixes = _PROMPT_FIXES.get(source, _PROMPT_FIXES["the prompt"])
    if prompt == "":
        raise MinigptError(_PROMPT["empty"].format(source=source, **fixes))
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MinigptError(_PROMPT["not_utf8"].format(source=source, byte=ord(prompt[exc.start]) & 0xFF,
                                                      at=exc.start)) from None
    if tok is None:
        return []
    if tok.unk_token is None:  # char refuses what its alphabet lacks (bpe lacks nothing)
        missing = tok.unknown_chars(prompt)
        if missing:
            raise MinigptError(_PROMPT["unknown"].format(source=source, chars=", ".join(map(repr, missing))))
    ids = tok.encode(prompt)
    if not ids:
        raise MinigptError(_PROMPT["no_tokens"].format(source=source, **fixes))
    return ids


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
                generator: Optional[torch.Generator | Sequence[torch.Generator]]) -> torch.Tensor:
    """Next ids (B,) int64, sampled from softmax(logits / T) of last-position logits (B, V).

    ``generator`` is one RNG for the whole batch, or one per row (a sequence
    of B): then row i draws from its own generator exactly as a batch of one
    would, so a row's sample does not depend on the other rows.

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
    if isinstance(generator, (list, tuple)):
        return torch.cat([torch.multinomial(probs[i:i + 1], 1, generator=g) for i, g in enumerate(generator)]).squeeze(-1)
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
    generator: Optional[torch.Generator | Sequence[torch.Generator]] = None,
    vocab_limit: Optional[int] = None,
    window_stride: Optional[int] = None,
    decoder: Optional[StaticDecoder] = None,
) -> Iterator[torch.Tensor]:
    """Yield each new token, (B,) int64, as it is sampled.

    Every row of ``idx`` is a sample of its own, all decoded as one batch
    (the weights are read once per step for all of them); they share the
    prompt's length, so the window slides for all at the same step.

    Args:
        model: a GPT in eval mode.
        idx: prompt ids (B, T), T ≥ 1; only the last ``block_size`` are seen.
        max_new_tokens: tokens to produce.
        temperature: divides the logits, a finite number >= 0; 0 means greedy
            (see :func:`sample_next`).
        top_k: keep only the k most likely tokens (None: all).
        top_p: nucleus sampling mass, 0 < p ≤ 1 (None: off).
        use_cache: reuse keys/values of past positions (a KV cache).
        generator: the RNG for sampling (seeded by the caller), or one per
            row (:func:`sample_next`).
        vocab_limit: never sample ids at or above this (a model vocabulary
            padded beyond its tokenizer's entries).
        window_stride: tokens the context window drops at once when it is
            full (see the module docstring); None: ``block_size // 4``.
        decoder: with ``use_cache``, decode through this static cache and its
            (compiled or eager) one-token step instead of the growing
            :class:`~minigpt_cli.model.gpt.KVCache` (:mod:`minigpt_cli.sample.decoding`);
            its batch must be idx's. The same rule, the same tokens.

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
    if decoder is not None and use_cache and decoder.batch != idx.size(0):
        raise ValueError(f"the decoder decodes {decoder.batch} rows, the prompt has {idx.size(0)}")
    for _ in range(max_new_tokens):
        if not use_cache:
            last = model(seq[:, start:], last_only=True)[0][:, -1, :]
        elif decoder is not None:  # the static cache: the window at positions 0.., refilled after each slide
            last = decoder.prefill(seq[:, start:]) if refill else decoder.step(seq[:, -1], seq.size(1) - 1 - start)
            refill = False
        elif refill:
            # Fill the cache with the whole window: at the start and after each slide.
            if cache is None:
                cache = model.new_cache(seq.size(0), block)
            cache.reset()
            last = model(seq[:, start:], cache=cache, last_only=True)[0][:, -1, :]
            refill = False
        else:
            last = model(seq[:, -1:], cache=cache, last_only=True)[0][:, -1, :]
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


def sample_prompt_text(model: GPT, tok: "Tokenizer", sc: "SampleConfig", n_tokens: int, seed: int,
                       should_stop: Optional[Callable[[], bool]] = None) -> str:
    """A sample as ``minigpt generate`` makes it from the run's ``sample`` section, for samples.txt.

    ``n_tokens`` new tokens after ``sc.prompt``, drawn with ``sc``'s
    temperature, top_k, top_p and window_stride by a generator seeded with
    ``seed`` (``sc.max_new_tokens`` and ``sc.num_samples`` are generate's
    own: the caller gives the count). ``should_stop`` is asked after every
    token; when it answers True the sample ends there (a Ctrl-C must not wait
    for a long sample). The model is put in eval mode and back in train mode.

    Returns:
        The prompt followed by the new text; ``(no sample: REASON)`` when
        there is none (a prompt the tokenizer cannot encode, a model whose
        output is NaN: the run's loss says so too).
    """
    device = next(model.parameters()).device
    model.eval()
    ids: list[int] = []
    try:
        prompt = encode_prompt(tok, sc.prompt, "sample.prompt")
        idx = torch.tensor([prompt], dtype=torch.long, device=device)
        g = torch.Generator(device=device).manual_seed(seed)
        for t in generate_tokens(model, idx, n_tokens, sc.temperature, sc.top_k, sc.top_p, generator=g,
                                 vocab_limit=tok.vocab_size, window_stride=sc.window_stride):
            ids.append(int(t[0]))
            if should_stop is not None and should_stop():
                break
    except MinigptError as exc:
        return f"(no sample: {exc})"
    finally:
        model.train()
    return sc.prompt + tok.decode(ids)
