"""Sampling from a trained GPT, with a KV cache and a sliding context window.

Past ``block_size`` the window slides by ``window_stride`` tokens at a time: when one more token
would not fit, the oldest ``window_stride`` leave together, so the model sees ``block_size -
window_stride + 1`` to ``block_size`` tokens (1 is nanoGPT's rule; the default, ``block_size // 4``,
keeps three quarters). Inside the window the cached path feeds only the newest token; after a slide
the cache is refilled from the tokens that stay, since every key and value above the first layer saw
the tokens that left (llama.cpp's "context shift" keeps those stale keys). The uncached, cached and
static-cache paths (:mod:`.decoding`) follow the same rule and give the same tokens; a batch gives
each row, with its own generator, what it would draw alone. A prompt longer than ``block_size`` is
cropped to its last ``block_size`` tokens, so a learned position table is never outgrown.

One loop (:func:`decode`) drives every decoder, and it never waits for the device: the sampled ids
stay there and feed the next step, and the checks (the logits finite, the ids inside the
vocabulary) travel with the ids, so that the host reads each step once (:func:`read_tokens`): per
token for one sample, which may be streamed, in chunks for a batch (issue 36: three waits per token
before).

The sample settings are validated once, by the schema
(:class:`~minigpt_cli.config.schema.SampleConfig`, within the run's config): the functions here
trust them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence

import torch

from ..errors import MinigptError
from ..model.gpt import GPT
from .decoding import Decoder, new_decoder

if TYPE_CHECKING:
    from ..config.schema import SampleConfig
    from ..tokenizer.kinds import Tokenizer


#: What to give instead, by where the prompt came from (``source`` of :func:`encode_prompt`).
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
    """The ids of a prompt, at least one: ``generate``'s, or the ``sample.prompt`` that ``train``
    checks before step 0 (so that ``generate`` cannot fail on it later). ``tok`` None (a dry run
    before the tokenizer is trained): the text alone is checked, and [] returned. ``source`` names
    it in the messages: ``"the prompt"`` or ``"sample.prompt"``.

    Raises:
        MinigptError: an empty prompt, one that is not UTF-8 (bytes passed through as surrogate
            escapes), characters a char tokenizer lacks, or no tokens at all.
    """
    fixes = _PROMPT_FIXES.get(source, _PROMPT_FIXES["the prompt"])
    # Bytes that were not UTF-8 arrive as lone surrogates (surrogateescape), which UTF-8 cannot
    # encode.
    bad = _SURROGATE.search(prompt)
    if bad is not None:
        raise MinigptError(
            f"{source} is not UTF-8 text (byte 0x{ord(bad.group()) & 0xFF:02x} at character "
            f"{bad.start()}); convert it to UTF-8 with iconv"
        )
    missing = (
        tok.unknown_chars(prompt) if tok is not None and tok.unk_token is None else []
    )  # char's alphabet
    if missing:
        raise MinigptError(
            f"{source} has characters the tokenizer's vocabulary lacks: "
            f"{', '.join(map(repr, missing))}; remove or replace them"
        )
    ids = tok.encode(prompt) if tok is not None and prompt else []
    if prompt == "":
        raise MinigptError(
            f"{source} is empty; {fixes['give']}; a newline works: {fixes['newline']}"
        )
    if tok is not None and not ids:  # without a tokenizer (a dry run) only the text is checked
        raise MinigptError(f"{source} encodes to no tokens; {fixes['longer']}")
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

#: The verdicts of :func:`overflow_verdict` on a step's logits.
FINITE, NAN, INFINITE = 0, 1, 2


def overflow_verdict(peak: torch.Tensor) -> torch.Tensor:
    """() int64 on the logits' device, from each row's largest logit ``peak`` (B, 1): :data:`NAN` if
    one is NaN (NaN anywhere in a row makes its max NaN), :data:`INFINITE` if one is +inf or a row
    is all -inf, else :data:`FINITE`."""
    finite = torch.where(torch.isfinite(peak).all(), FINITE, INFINITE)
    return torch.where(torch.isnan(peak).any(), NAN, finite)


def refuse_overflow(verdict: int) -> None:
    """Raise for a verdict of :func:`overflow_verdict` other than :data:`FINITE`.

    Raises:
        MinigptError: the model's output is NaN or infinite: there is nothing to sample."""
    if verdict != FINITE:
        what = "NaN" if verdict == NAN else "infinite"
        raise MinigptError(
            f"the model's output is {what} (its weights are finite, but the forward pass "
            "overflows), so there is nothing to sample; retrain it with a smaller model.init_std "
            "or train.learning_rate"
        )


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: Optional[int],
    top_p: Optional[float],
    generator: Optional[torch.Generator | Sequence[torch.Generator]],
    overflow: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Next ids (B,) int64, sampled from softmax(logits / T) of last-position logits (B, V), T
    finite and >= 0.

    softmax(l / T) is the Boltzmann distribution at temperature T (Ackley, Hinton & Sejnowski 1985).
    T = 0 is greedy (the first of tied maxima); a T that float32 rounds to 0 (<=
    :data:`FLOAT32_ZERO`) takes the limit T -> 0, uniform over the tied maxima. Top-k and top-p
    filter the scaled logits (:func:`filter_logits`). ``generator``: one for the batch, or one per
    row, so that row i draws what a batch of one would. ``overflow``: a () int64 tensor on the
    logits' device that receives :func:`overflow_verdict`, for the caller to read with the ids,
    where nothing else here waits for the device (greedy, or a generator per row); without it, or
    with ``torch.multinomial`` (which reads its input on the host anyway), the verdict is read here.

    Raises:
        MinigptError: logits holding NaN or +inf, or a row of only -inf (the forward pass
            overflowed), where the verdict is read here.
    """
    logits = logits.float()
    peak = logits.amax(dim=-1, keepdim=True)
    per_row = isinstance(generator, (list, tuple))
    verdict = overflow_verdict(peak)
    if overflow is not None and (temperature == 0 or per_row):
        overflow.copy_(verdict)
    else:
        refuse_overflow(int(verdict))  # waits for the device
    if temperature == 0:
        return logits.argmax(dim=-1)
    # The log-sum-exp shift: softmax ignores it, and (l - max l) / T <= 0 never overflows to +inf
    # for any finite T.
    gap = logits - peak  # (B, V): 0 at the maxima, <= 0 or -inf elsewhere
    if temperature > FLOAT32_ZERO:
        # In float64: a T beyond float32's range (1e39) would be inf there, and -inf / inf is NaN.
        scaled = (gap.double() / temperature).float()
    else:  # the limit T -> 0: the maxima alone, equally likely
        scaled = gap.masked_fill(gap < 0, float("-inf"))
    probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
    if per_row:
        # torch.multinomial's own draw of one sample, argmax(p / q) with q ~ Exp(1) (ATen's
        # Distributions.cpp, the Gumbel-max trick), with each row's q from its own generator and one
        # division and argmax for the batch: the same ids as a multinomial call per row, without its
        # checks, which wait for the device.
        q = torch.empty_like(probs)
        for row, g in zip(q, generator):
            row.exponential_(1, generator=g)
        return (probs / q).argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def resolve_window_stride(block_size: int, window_stride: Optional[int]) -> int:
    """The stride the window slides by: ``window_stride`` (the schema keeps it within 1 ..
    ``block_size``), or ``block_size // 4`` (at least 1) when None."""
    return max(1, block_size // 4) if window_stride is None else window_stride


@dataclass(frozen=True)
class Sampler:
    """:func:`sample_next`'s settings and a vocabulary limit: never sample ids at or above
    ``vocab_limit`` (a model vocabulary padded past its tokenizer's)."""

    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    generator: Optional[torch.Generator | Sequence[torch.Generator]] = None
    vocab_limit: Optional[int] = None

    def limit(self, vocab_size: int) -> int:
        """The ids drawn from a model of ``vocab_size`` lie below this."""
        return min(self.vocab_limit or vocab_size, vocab_size)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The record (B + 1,) int64 of one step, on the logits' device, without waiting for it: the
        ids drawn from logits (B, V), then :func:`overflow_verdict`'s verdict on them."""
        if self.vocab_limit is not None and self.vocab_limit < logits.size(-1):
            logits = logits.clone()
            logits[:, self.vocab_limit :] = float("-inf")
        verdict = torch.zeros((), dtype=torch.long, device=logits.device)
        ids = sample_next(logits, self.temperature, self.top_k, self.top_p, self.generator, verdict)
        return torch.cat([ids, verdict[None]])


@torch.no_grad()
def decode(
    decoder: Decoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    sampler: Sampler,
    window_stride: Optional[int] = None,
) -> Iterator[torch.Tensor]:
    """Yield each step's record (B + 1,) int64 (:meth:`Sampler.__call__`) after the prompt ids idx
    (B, T), on the device, never waiting for it: the loop of every decoder.

    The window is the last block_size tokens at most; when one more token would not fit, the oldest
    ``window_stride`` (:func:`resolve_window_stride`) leave at once and the decoder is prefilled
    with the rest (the module docstring)."""
    model = decoder.model
    block = model.config.block_size
    stride = resolve_window_stride(block, window_stride)
    assert 1 <= stride <= block, stride  # the schema keeps sample.window_stride within block_size
    limit = sampler.limit(model.config.vocab_size)
    rows, end = idx.shape
    seq = idx.new_empty(rows, end + max_new_tokens)  # the prompt and every token drawn
    seq[:, :end] = idx
    start = max(0, end - block)  # the window is seq[:, start:end]
    for i in range(max_new_tokens):
        if i == 0:
            logits = decoder.prefill(seq[:, start:end])
        elif end - start > block:  # the window is full: it slides, and the decoder starts over
            start += stride
            logits = decoder.prefill(seq[:, start:end])
        else:
            logits = decoder.step(seq[:, end - 1], end - 1 - start)
        record = sampler(logits)
        # A faulty sampler's id is refused when the host reads the record; until then it must not
        # index the embedding (out of range: an error on the CPU, a device-side assert on CUDA).
        seq[:, end] = record[:-1].clamp(0, limit - 1)
        end += 1
        yield record


def read_tokens(records: Iterable[torch.Tensor], limit: int, every: int) -> Iterator[torch.Tensor]:
    """The tokens (B,) int64 of each record of :func:`decode`, on the CPU, read ``every`` records at
    a time (one wait for the device each), each checked before it is yielded.

    Raises:
        MinigptError: a step whose logits overflowed (:func:`refuse_overflow`), or a sampled id
            outside the vocabulary [0, ``limit``) (some devices' ``torch.multinomial`` have returned
            int64-min), in the order the steps were drawn."""
    chunk: list[torch.Tensor] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == every:
            yield from _checked(chunk, limit)
            chunk = []
    yield from _checked(chunk, limit)  # the last steps, fewer than `every`


def _checked(chunk: list[torch.Tensor], limit: int) -> Iterator[torch.Tensor]:
    """The tokens of the records in ``chunk``, read in one go, each step checked
    (:func:`read_tokens`)."""
    if not chunk:
        return
    host = torch.stack(chunk).cpu()  # (steps, B + 1): the one wait for the device
    for step, values in zip(host, host.tolist()):
        refuse_overflow(values[-1])
        bad = [v for v in values[:-1] if not 0 <= v < limit]
        if bad:
            raise MinigptError(
                f"the sampler on {chunk[0].device} returned token id {bad[0]}, outside the "
                f"vocabulary (0 to {limit - 1}); a fault of torch.multinomial on that device: run "
                "with --device cpu"
            )
        yield step[:-1]


#: Steps of a batch decoded between two reads of its tokens (a single sample is read per token: it
#: may be streamed). Its samples end at a read at the earliest, so up to this many steps may go
#: unused.
READ_EVERY = 16


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
    decoder: Optional[Decoder] = None,
) -> Iterator[torch.Tensor]:
    """Yield each new token, (B,) int64 on the CPU, for each row of the prompt ids ``idx`` (B, T):
    :func:`decode` through ``decoder``, read by :func:`read_tokens` per token for one row and every
    :data:`READ_EVERY` tokens for a batch.

    ``model`` is in eval mode; the sampling settings are :class:`Sampler`'s, trusted (validated by
    the schema). ``generator``: one, or one per row. ``decoder``: one of ``idx``'s batch
    (:mod:`.decoding`); None: the eager one, with or without the KV cache as ``use_cache`` says. All
    give the same tokens.

    Raises:
        MinigptError: the model's output NaN or infinite; a sampled id outside the vocabulary.
    """
    rows = idx.size(0)
    if decoder is None:
        decoder = new_decoder(model, rows, use_cache)
    assert decoder.batch in (None, rows), decoder.batch  # a cache has a fixed batch
    if isinstance(generator, torch.Generator) and rows == 1:
        # The same draw as torch.multinomial's on one row, without its waits (sample_next).
        generator = [generator]
    sampler = Sampler(temperature, top_k, top_p, generator, vocab_limit)
    records = decode(decoder, idx, max_new_tokens, sampler, window_stride)
    limit = sampler.limit(model.config.vocab_size)
    yield from read_tokens(records, limit, 1 if rows == 1 else READ_EVERY)


def sample_prompt_text(
    model: GPT,
    tok: "Tokenizer",
    sc: "SampleConfig",
    n_tokens: int,
    seed: int,
    should_stop: Optional[Callable[[], bool]] = None,
) -> str:
    """samples.txt's sample: ``n_tokens`` after ``sc.prompt``, drawn as ``minigpt generate`` draws
    them with ``sc``'s settings from a generator seeded ``seed``; the sample ends when
    ``should_stop()`` says so (a Ctrl-C must not wait for it). The model is put in eval mode and
    back in train mode.

    Returns:
        The prompt and the new text; ``(no sample: REASON)`` when there is none (a prompt the
        tokenizer cannot encode, a model whose output is NaN: the run's loss says so too).
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
