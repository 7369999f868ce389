"""Sampling from a trained GPT, with a KV cache and a sliding context window.

Past ``block_size`` the window slides by ``window_stride`` tokens at a time: when one more token would not fit,
the oldest ``window_stride`` leave together, so the model sees ``block_size - window_stride + 1`` to
``block_size`` tokens (1 is nanoGPT's rule; the default, ``block_size // 4``, keeps three quarters). Inside the
window the cached path feeds only the newest token; after a slide the cache is refilled from the tokens that stay,
since every key and value above the first layer saw the tokens that left (llama.cpp's "context shift" keeps those
stale keys). The uncached, cached and static-cache paths (:mod:`.decoding`) follow the same rule and give the same
tokens; a batch gives each row, with its own generator, what it would draw alone. A prompt longer than
``block_size`` is cropped to its last ``block_size`` tokens, so a learned position table is never outgrown.

The sample settings are validated once, by the schema (:class:`~minigpt_cli.config.schema.SampleConfig`, within
the run's config): the functions here trust them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

import torch

from ..errors import MinigptError
from ..model.gpt import GPT

if TYPE_CHECKING:
    from ..config.schema import SampleConfig
    from ..tokenizer.kinds import Tokenizer
    from .decoding import StaticDecoder


#: The refusals of :func:`encode_prompt` (and the fix for each place a prompt comes from), then of the sampler.
_MESSAGES = {
    "empty": "{source} is empty; {give}; a newline works: {newline}",
    "not_utf8": "{source} is not UTF-8 text (byte 0x{byte:02x} at character {at}); convert it to UTF-8 with iconv",
    "unknown": "{source} has characters the tokenizer's vocabulary lacks: {chars}; remove or replace them",
    "no_tokens": "{source} encodes to no tokens; {longer}",
    "overflow": (
        "the model's output is {what} (its weights are finite, but the forward pass overflows), so there is "
        "nothing to sample; retrain it with a smaller model.init_std or train.learning_rate"
    ),
    "sampler": (
        "the sampler on {device} returned token id {value}, outside the vocabulary (0 to {last}); a fault of "
        "torch.multinomial on that device: run with --device cpu"
    ),
}
_PROMPT_FIXES = {
    "the prompt": {
        "give": "pass --prompt TEXT",
        "newline": "--prompt $'\\n'",
        "longer": "pass a longer --prompt",
    },
    "sample.prompt": {
        "give": "set sample.prompt (or pass minigpt generate --prompt TEXT)",
        "newline": 'sample.prompt: "\\n"',
        "longer": "set a longer sample.prompt (or pass minigpt generate --prompt TEXT)",
    },
}


_SURROGATE = re.compile("[\ud800-\udfff]")


def encode_prompt(tok: Optional[Tokenizer], prompt: str, source: str = "the prompt") -> list[int]:
    """The ids of a prompt, at least one: ``generate``'s, or the ``sample.prompt`` that ``train`` checks before
    step 0 (so that ``generate`` cannot fail on it later). ``tok`` None (a dry run before the tokenizer is
    trained): the text alone is checked, and [] returned. ``source`` names it in the messages: ``"the prompt"``
    or ``"sample.prompt"``.

    Raises:
        MinigptError: an empty prompt, one that is not UTF-8 (bytes passed through as surrogate escapes),
            characters a char tokenizer lacks, or no tokens at all.
    """
    fixes = _PROMPT_FIXES.get(source, _PROMPT_FIXES["the prompt"])
    # Bytes that were not UTF-8 arrive as lone surrogates (surrogateescape): the only text UTF-8 cannot encode.
    bad = _SURROGATE.search(prompt)
    if bad is not None:
        raise MinigptError(
            _MESSAGES["not_utf8"].format(
                source=source, byte=ord(bad.group()) & 0xFF, at=bad.start()
            )
        )
    missing = (
        tok.unknown_chars(prompt) if tok is not None and tok.unk_token is None else []
    )  # char's alphabet
    if missing:
        raise MinigptError(
            _MESSAGES["unknown"].format(source=source, chars=", ".join(map(repr, missing)))
        )
    ids = tok.encode(prompt) if tok is not None and prompt else []
    if prompt == "" or (
        tok is not None and not ids
    ):  # without a tokenizer (a dry run) only the text is checked
        raise MinigptError(
            _MESSAGES["empty" if prompt == "" else "no_tokens"].format(source=source, **fixes)
        )
    return ids


def filter_logits(
    logits: torch.Tensor, top_k: Optional[int] = None, top_p: Optional[float] = None
) -> torch.Tensor:
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
FLOAT32_ZERO = 2.0**-150


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: Optional[int],
    top_p: Optional[float],
    generator: Optional[torch.Generator | Sequence[torch.Generator]],
) -> torch.Tensor:
    """Next ids (B,) int64, sampled from softmax(logits / T) of last-position logits (B, V), T finite and >= 0.

    softmax(l / T) is the Boltzmann distribution at temperature T (Ackley, Hinton & Sejnowski 1985). T = 0 is
    greedy (the first of tied maxima); a T that float32 rounds to 0 (<= :data:`FLOAT32_ZERO`) takes the limit
    T -> 0, uniform over the tied maxima. Top-k and top-p filter the scaled logits (:func:`filter_logits`).
    ``generator``: one for the batch, or one per row, so that row i draws what a batch of one would.

    Raises:
        MinigptError: logits holding NaN or +inf, or a row of only -inf (the forward pass overflowed).
    """
    logits = logits.float()
    peak = logits.amax(dim=-1, keepdim=True)  # NaN anywhere in a row makes its max NaN
    if not bool(torch.isfinite(peak).all()):
        what = "NaN" if bool(torch.isnan(peak).any()) else "infinite"
        raise MinigptError(_MESSAGES["overflow"].format(what=what))
    if temperature == 0:
        return logits.argmax(dim=-1)
    # The log-sum-exp shift: softmax ignores it, and (l - max l) / T <= 0 never overflows to +inf for any finite T.
    gap = logits - peak  # (B, V): 0 at the maxima, <= 0 or -inf elsewhere
    if temperature > FLOAT32_ZERO:
        # In float64: a T beyond float32's range (1e39) would be inf there, and -inf / inf is NaN.
        scaled = (gap.double() / temperature).float()
    else:  # the limit T -> 0: the maxima alone, equally likely
        scaled = gap.masked_fill(gap < 0, float("-inf"))
    probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
    if isinstance(generator, (list, tuple)):
        # torch.multinomial's own draw of one sample, argmax(p / q) with q ~ Exp(1) (ATen's Distributions.cpp,
        # the Gumbel-max trick), with each row's q from its own generator and one division and argmax for the
        # batch: the same ids as a multinomial call per row, without the per-call checks.
        q = torch.empty_like(probs)
        for row, g in zip(q, generator):
            row.exponential_(1, generator=g)
        return (probs / q).argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_sampled(ids: torch.Tensor, limit: int) -> None:
    """Refuse a sampled id (B,) outside [0, ``limit``): a sampler fault, not a token (some devices'
    ``torch.multinomial`` have returned int64-min)."""
    bad = (ids < 0) | (ids >= limit)
    if bool(bad.any()):
        raise MinigptError(
            _MESSAGES["sampler"].format(device=ids.device, value=int(ids[bad][0]), last=limit - 1)
        )


def resolve_window_stride(block_size: int, window_stride: Optional[int]) -> int:
    """The stride the window slides by: ``window_stride`` (the schema keeps it within 1 .. ``block_size``), or
    ``block_size // 4`` (at least 1) when None."""
    return max(1, block_size // 4) if window_stride is None else window_stride


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
    """Yield each new token, (B,) int64, as it is sampled, for each row of the prompt ids ``idx`` (B, T).

    ``model`` is in eval mode; the settings are :func:`sample_next`'s and the module docstring's, trusted
    (validated by the schema). ``generator``: one, or one per row. ``vocab_limit``: never sample ids at or above
    it (a model vocabulary padded past its tokenizer's). ``decoder``, with ``use_cache``: decode through its static
    cache and one-token step (:mod:`.decoding`) instead of the growing KV cache: the same rule, the same tokens.

    Raises:
        MinigptError: the model's output NaN or infinite; a sampled id outside the vocabulary (:func:`check_sampled`).
    """
    block = model.config.block_size
    stride = resolve_window_stride(block, window_stride)
    assert 1 <= stride <= block, stride  # the schema keeps sample.window_stride within block_size
    seq = idx
    start = max(0, seq.size(1) - block)  # the window is seq[:, start:]
    cache = None
    refill = True
    assert decoder is None or decoder.batch == idx.size(0), (
        decoder.batch
    )  # a static cache has a fixed batch
    for _ in range(max_new_tokens):
        if not use_cache:
            last = model(seq[:, start:], last_only=True)[0][:, -1, :]
        elif (
            decoder is not None
        ):  # the static cache: the window at positions 0.., refilled after each slide
            last = (
                decoder.prefill(seq[:, start:])
                if refill
                else decoder.step(seq[:, -1], seq.size(1) - 1 - start)
            )
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


def sample_prompt_text(
    model: GPT,
    tok: "Tokenizer",
    sc: "SampleConfig",
    n_tokens: int,
    seed: int,
    should_stop: Optional[Callable[[], bool]] = None,
) -> str:
    """samples.txt's sample: ``n_tokens`` after ``sc.prompt``, drawn as ``minigpt generate`` draws them with
    ``sc``'s settings from a generator seeded ``seed``; the sample ends when ``should_stop()`` says so (a Ctrl-C
    must not wait for it). The model is put in eval mode and back in train mode.

    Returns:
        The prompt and the new text; ``(no sample: REASON)`` when there is none (a prompt the tokenizer cannot
        encode, a model whose output is NaN: the run's loss says so too).
    """
    device = next(model.parameters()).device
    model.eval()
    ids: list[int] = []
    try:
        prompt = encode_prompt(tok, sc.prompt, "sample.prompt")
        idx = torch.tensor([prompt], dtype=torch.long, device=device)
        g = torch.Generator(device=device).manual_seed(seed)
        for t in generate_tokens(
            model,
            idx,
            n_tokens,
            sc.temperature,
            sc.top_k,
            sc.top_p,
            generator=g,
            vocab_limit=tok.vocab_size,
            window_stride=sc.window_stride,
        ):
            ids.append(int(t[0]))
            if should_stop is not None and should_stop():
                break
    except MinigptError as exc:
        return f"(no sample: {exc})"
    finally:
        model.train()
    return sc.prompt + tok.decode(ids)
