"""The ``generate`` command as a function: open a run, encode the prompt, sample, stream the text.

The sampling (temperature, top-k, top-p, the KV cache, the sliding window) is :mod:`.sampling`'s;
this module adds the prompt, the printing, the stop strings and the stop at the end-of-text token
(transformers' ``generate`` stops at ``eos_token_id`` the same way; each sample of a batch on its
own). Streaming decodes incrementally (:class:`TextStream`) and searches for stop strings only near
the newest text, so the text work per token stays constant however long the sample grows (``minigpt
bench --stream-tokens N`` measures it).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TextIO

import torch

from ..config.notes import notes
from ..config.schema import Config, SampleConfig, validate
from ..config.special_tokens import END_OF_TEXT
from ..run import folder as runs
from ..runtime.device import CpuThreads, resolve_device
from ..tokenizer.kinds import Tokenizer, lossy_report
from .decoding import compiled_decoder
from .load import load_run
from .sampling import encode_prompt, generate_tokens, resolve_window_stride

#: The flag of each ``sample`` key, as the notes name what the user gave (:func:`generate`).
FLAGS = {
    "prompt": "--prompt",
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "num_samples": "--num-samples",
    "window_stride": "--window-stride",
}

#: Samples decoded together at most; more are decoded in batches of this many, one after another
#: (the KV cache grows with the batch: 300 MB for 64 samples of configs/shakespeare.yaml's model).
MAX_BATCH = 64

#: The weight and arithmetic types :func:`generate` offers.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def end_of_text(tok: Tokenizer) -> Optional[str]:
    """The tokenizer's end-of-text special token (one of
    :data:`~minigpt_cli.config.special_tokens.END_OF_TEXT`), or None."""
    return next((s for s in tok.special_tokens if s in END_OF_TEXT), None)


def find_stop(text: str, stops: Sequence[str]) -> int:
    """Index in ``text`` where the earliest of ``stops`` begins, or -1 if none occurs."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that begins some stop string without completing it:
    held back while streaming, since the next tokens may complete the stop string, which must not be
    printed."""
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held


class TextStream:
    """The text of a growing list of token ids, a piece at a time, each token decoded a bounded
    number of times.

    Incremental detokenization as Hugging Face's ``TextStreamer`` and vLLM's
    ``detokenize_incrementally`` do it: each new id decodes only ``ids[prefix:]``, and what lies
    past ``decode(ids[prefix:read])`` is handed out once it does not end in U+FFFD (a byte-level BPE
    token that ends inside a character). n tokens cost O(n), not the O(n²) of decoding all of them
    at every step; the pieces join into ``decode(ids)`` for every kind here.
    """

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self._prefix = self._read = 0
        self._prefix_text = ""  # decode(ids[prefix:read]), already handed out

    def push(self, token: int) -> str:
        """Add one id; returns the text it completes ("" while a character is incomplete)."""
        self.ids.append(token)
        text = self.tok.decode(self.ids[self._prefix :])
        if len(text) <= len(self._prefix_text) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        piece = text[len(self._prefix_text) :]
        self._prefix_text = self.tok.decode(self.ids[self._prefix : self._read])
        return piece


class SampleWriter:
    """One sample's text as its ids arrive: decoded, cut at the first stop string, written to
    ``out`` (with ``stream``, as it comes, holding back what may start a stop string; else at
    :meth:`finish`)."""

    def __init__(self, tok: Tokenizer, stops: Sequence[str], out: TextIO, stream: bool):
        self.tok, self.stops, self.out, self.stream = tok, list(stops), out, stream
        self.plain = not (stream or stops)
        self.keep = max(map(len, stops), default=1) - 1
        self.dec = TextStream(tok)
        self.recent = ""  # the last `keep` characters decoded
        self.pending = ""  # decoded, not yet written (streaming)
        self.done = self.written = 0  # characters decoded, and written
        self.cut = -1

    def push(self, token: int) -> bool:
        """Add one id; True when a stop string has appeared (the sample ends there)."""
        if self.plain:
            self.dec.ids.append(token)
            return False
        piece = self.dec.push(token)
        if not piece:
            return False
        window = self.recent + piece
        at = find_stop(window, self.stops)
        if at >= 0:
            self.cut = self.done - len(self.recent) + at
            return True
        self.recent = window[max(0, len(window) - self.keep) :] if self.keep else ""
        self.done += len(piece)
        if self.stream:
            self.pending += piece
            ready = len(self.pending) - min(stop_holdback(window, self.stops), len(self.pending))
            if ready:
                self.out.write(self.pending[:ready])
                self.out.flush()
                self.written += ready
                self.pending = self.pending[ready:]
        return False

    def finish(self) -> str:
        """Write the rest of the text and a newline; returns the sample's new text (without the
        newline)."""
        text = self.tok.decode(self.dec.ids)
        cut = self.cut
        if cut < 0 and not self.plain:  # the end of the last token, if it never became a piece
            at = find_stop(self.recent + text[self.done :], self.stops)
            cut = self.done - len(self.recent) + at if at >= 0 else -1
        if cut >= 0:
            text = text[:cut]
        self.out.write(text[self.written :] + "\n")
        self.out.flush()
        return text


def write_sample(
    tok: Tokenizer, tokens: Iterable[int], stops: Sequence[str], out: TextIO, stream: bool
) -> str:
    """Decode ``tokens`` as they are sampled, cut at the first stop string (no more are drawn),
    write the text and a newline (:class:`SampleWriter`); returns the new text."""
    writer = SampleWriter(tok, stops, out, stream)
    for token in tokens:
        if writer.push(token):
            break
    return writer.finish()


def generate(
    run: Optional[str | Path] = None,
    sample: Optional[SampleConfig | Mapping[str, Any]] = None,
    *,
    checkpoint: str = runs.BEST,
    device: str = "auto",
    seed: int = 1337,
    stream: bool = False,
    use_cache: bool = True,
    compile: Optional[bool] = None,
    dtype: str = "float32",
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    out: Optional[TextIO] = None,
    echo: Callable[[str], None] = lambda message: None,
    ema: bool = True,
) -> list[str]:
    """Sample from a trained run (``None``: the newest under ``runs/``); returns each sample's
    prompt and text.

    ``sample`` is a whole :class:`SampleConfig` or a mapping of some of its keys over the run's own
    ``sample`` section (None: that section). Sample i draws from a generator seeded ``seed + i``;
    ``num_samples`` are decoded as one batch (at most :data:`MAX_BATCH` at once). Each is written to
    ``out`` as the prompt, the new text (cut before the first of ``stop``, none empty) and a
    newline, token by token when ``stream``. A sample ends at the tokenizer's end-of-text token
    (:func:`end_of_text`), not written, unless ``ignore_eos``. ``compile`` None: on for CUDA.
    ``dtype``: a key of :data:`DTYPES`; ``seed``: 0 .. 2**63-1 (the CLI's options check both). Notes
    go to ``echo``. A run trained with ``train.ema_decay`` samples from its EMA weights unless
    ``ema`` is False. The README (Commands, Faster sampling) is the manual.

    Raises:
        MinigptError: no run, a damaged checkpoint, a prompt the tokenizer cannot encode,
            sampling settings the schema refuses (ConfigError), a sampled id outside the
            vocabulary (a device's faulty sampler).
    """
    stops = list(stop)
    dev = resolve_device(device)
    # Measures what else runs from here on: the sampling loop's polls decide the thread count once
    # 0.25 s have passed (no wait before the first token: an idle machine pays nothing).
    threads = CpuThreads(
        dev
    )  # silent: the thread count changes the speed, not the text (issue 27 §5)
    loaded = load_run(run, checkpoint, dev, ema=ema)
    model, cfg, tok = loaded.model, loaded.config, loaded.tokenizer
    model.to(
        DTYPES[dtype]
    )  # after load_run's finite check: float32 to bfloat16 keeps the exponent range
    sc = resolve_sample(cfg, sample)  # validated once here: the sampler trusts it
    prompt, max_new_tokens, num_samples, top_k = (
        sc.prompt,
        sc.max_new_tokens,
        sc.num_samples,
        sc.top_k,
    )
    window_stride = resolve_window_stride(cfg.model.block_size, sc.window_stride)
    flags = given_keys(sample)
    if top_k is not None and top_k > tok.vocab_size:
        if "top_k" in flags:  # asked for: say so; the run's own default is clamped silently
            echo(
                f"note: --top-k {top_k} is larger than the vocabulary ({tok.vocab_size}); "
                f"using {tok.vocab_size}"
            )
        top_k = tok.vocab_size
    # The run's own sample.prompt was checked by train before step 0 (encode_prompt).
    ids = encode_prompt(tok, prompt, "the prompt" if "prompt" in flags else "sample.prompt")
    if run is None:  # said once all checks passed, so that an error stays one line
        echo(f"using {loaded.run_dir} ({loaded.describe()})")
    elif loaded.checkpoint.name != checkpoint:
        echo(f"using {loaded.describe()}: the run has no {checkpoint} checkpoint yet")
    if loaded.weights_note() is not None:
        echo(loaded.weights_note())
    if loaded.step == 0:
        echo(
            f"note: {loaded.run_dir}'s {loaded.checkpoint.name} checkpoint is untrained (saved at "
            "step 0, its weights are the random init), so the text is random; train the run "
            "further, or pass --run of a trained one"
        )
    lossy = lossy_report(tok, prompt)
    if lossy is not None:
        echo(lossy)
    for line in notes(
        cfg.model_copy(update={"sample": sc}),
        route="generate",
        given_keys={f"sample.{k}" for k in flags},
        names={f"sample.{k}": FLAGS[k] for k in flags},
        prompt_tokens=len(ids),
    ):
        echo(line)
    for s in stops:  # text the model cannot write: the vocabulary lacks a character of it
        missing = tok.unknown_chars(s)
        if missing:
            echo(
                f"note: --stop {s!r} can never match: the tokenizer's vocabulary lacks "
                f"{', '.join(map(repr, missing))}, so the model never writes it"
            )
    if len(ids) > cfg.model.block_size and max_new_tokens > 0:
        echo(
            f"note: the prompt has {len(ids)} tokens; the model sees only the last "
            f"{cfg.model.block_size} (block_size)"
        )
    compiled = (compile if compile is not None else dev.type == "cuda") and max_new_tokens > 0
    if compile and not use_cache:
        echo(
            "note: --compile has no effect with --no-kv-cache: it compiles the cached one-token "
            "step"
        )
    out = out if out is not None else Nowhere()
    eos = end_of_text(tok) if not ignore_eos else None
    eos = tok.encode(eos)[0] if eos is not None else None
    texts = []
    for first in range(0, num_samples, MAX_BATCH):
        rows = min(MAX_BATCH, num_samples - first)
        decoder = compiled_decoder(model, rows, echo) if compiled and use_cache else None
        idx = torch.tensor([ids] * rows, dtype=torch.long, device=dev)
        # Sample i (from 0) draws from its own generator, seeded seed + i: its seed's sample.
        gens = [
            torch.Generator(device=dev).manual_seed(seed + i) for i in range(first, first + rows)
        ]
        writers = [SampleWriter(tok, stops, out, stream and num_samples == 1) for _ in range(rows)]
        live = set(range(rows))
        if num_samples == 1:  # a batch is written at its end, each sample under its own header
            out.write(prompt)
            out.flush()
        for t in generate_tokens(
            model,
            idx,
            max_new_tokens,
            sc.temperature,
            top_k,
            sc.top_p,
            use_cache,
            gens,
            vocab_limit=tok.vocab_size,
            window_stride=window_stride,
            decoder=decoder,
        ):
            threads.poll()
            # t is on the CPU: read from the device per token for one sample, in chunks for a
            # batch (generate_tokens), so the end-of-text check here waits for nothing.
            for i, token in enumerate(t.tolist()):
                if i in live and (token == eos or writers[i].push(token)):
                    live.discard(i)
            if not live:
                break
        for i, writer in enumerate(writers, start=first):
            if num_samples > 1:
                out.write(f"{'-' * 20} sample {i + 1} {'-' * 20}\n{prompt}")
            texts.append(prompt + writer.finish())
    return texts


class Nowhere(io.TextIOBase):
    """A text stream that drops what it is given (``generate`` without ``out``; ``bench``)."""

    def write(self, text: str) -> int:
        return len(text)


def given_keys(sample: Optional[SampleConfig | Mapping[str, Any]]) -> set[str]:
    """The ``sample`` keys the caller of :func:`generate` gave (its flags): a mapping's keys, the
    fields a :class:`SampleConfig` was built with; none for None."""
    if sample is None:
        return set()
    if isinstance(sample, SampleConfig):
        return set(sample.model_fields_set)
    return set(sample) & set(FLAGS)


def resolve_sample(cfg: Config, sample: Optional[SampleConfig | Mapping[str, Any]]) -> SampleConfig:
    """The run's ``sample`` section, replaced by a whole :class:`SampleConfig` or updated with a
    mapping's keys, validated within the run's config (``window_stride`` against its block_size);
    raises ConfigError naming the key."""
    if sample is None:
        return cfg.sample  # validated when the run's config was loaded
    whole = cfg.to_dict()
    update = sample.model_dump() if isinstance(sample, SampleConfig) else dict(sample)
    whole["sample"] = {**whole["sample"], **update}
    return validate(whole, "sample").sample
