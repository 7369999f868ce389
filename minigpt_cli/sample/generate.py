"""The ``generate`` command as a function: load a run, check it, encode the prompt, sample, stream the text.

The sampling itself (temperature, top-k, top-p, the KV cache and the sliding
window) is :mod:`minigpt_cli.sample.sampling`'s; this module adds the run folder,
the tokenizer and the printing: stop strings, and streaming that never shows
half a character or the start of a stop string. Streaming decodes
incrementally (:class:`TextStream`) and searches for stop strings only near
the newest text, so the text work per token stays constant however long the
sample grows (``minigpt bench --stream-tokens N`` measures it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TextIO

import torch

from ..config.notes import notes
from ..config.schema import Config, SampleConfig, validate
from ..errors import MinigptError
from ..fileio import read_text_file
from ..run import folder as runs
from ..run.checkpoint import load_model
from ..runtime.device import CpuThreads, resolve_device
from ..runtime.kernels import swap as swap_kernels
from ..tokenizer.kinds import Tokenizer, load_run_tokenizer, lossy_report
from .decoding import compiled_decoder
from .sampling import check_temperature, encode_prompt, generate_tokens, resolve_window_stride

#: The flag of each ``sample`` key, as the notes name what the user gave (:func:`generate`).
FLAGS = {"prompt": "--prompt", "max_new_tokens": "--max-new-tokens", "temperature": "--temperature",
         "top_k": "--top-k", "top_p": "--top-p", "num_samples": "--num-samples", "window_stride": "--window-stride"}

#: Samples decoded together at most; more are decoded in batches of this many, one after another (the KV
#: cache grows with the batch: 300 MB for 64 samples of configs/shakespeare.yaml's model).
MAX_BATCH = 64

#: The weight and arithmetic types :func:`generate` offers.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

#: What :func:`generate` says: errors, then notes.
_MESSAGES = {
    "stop_empty": "--stop '': the stop text must not be empty",
    "stop_never": ("note: --stop {stop!r} can never match: the tokenizer's vocabulary lacks {chars}, so the model "
                   "never writes it"),
    "top_k_clamped": "note: --top-k {top_k} is larger than the vocabulary ({vocab}); using {vocab}",
    "dtype": "--dtype {dtype!r}: use float32 or bfloat16",
    "compile_no_cache": "note: --compile has no effect with --no-kv-cache: it compiles the cached one-token step",
}


def find_stop(text: str, stops: Sequence[str]) -> int:
    """Index in ``text`` where the earliest of ``stops`` begins, or -1 if none occurs."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that begins some stop string without completing it.

    While streaming, those characters are held back: the next tokens may
    complete a stop string, which must not be printed.
    """
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held


class TextStream:
    """The text of a growing list of token ids, a piece at a time, each token decoded a bounded number of times.

    Incremental detokenization as in Hugging Face's ``TextStreamer`` and
    vLLM's ``detokenize_incrementally``: a prefix offset and a read offset
    into the ids; each new id decodes only ``ids[prefix:]``, and what lies
    past ``decode(ids[prefix:read])`` is handed out once it does not end in
    U+FFFD (a byte-level BPE token that ends inside a multi-byte character).
    Then prefix moves to read and read to the end. A token is decoded about
    three times, so n tokens cost O(n) instead of the O(n²) of decoding all
    of them at every step. The pieces join into ``decode(ids)`` for every
    kind here: char, Unigram and WordPiece decode each token on its own
    (``▁`` to a space, WordPiece's ``##`` dropped), and byte-level BPE's
    bytes are cut only at character boundaries.
    """

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.ids: list[int] = []
        self._prefix = self._read = 0
        self._prefix_text = ""  # decode(ids[prefix:read]), already handed out

    def push(self, token: int) -> str:
        """Add one id; returns the text it completes ("" while a character is incomplete)."""
        self.ids.append(token)
        text = self.tok.decode(self.ids[self._prefix:])
        if len(text) <= len(self._prefix_text) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        piece = text[len(self._prefix_text):]
        self._prefix_text = self.tok.decode(self.ids[self._prefix:self._read])
        return piece


class SampleWriter:
    """One sample's text as its ids arrive: decoded, cut at the first stop string, written to ``out``.

    With ``stream`` the text is written as it comes (:class:`TextStream`),
    except what may be the start of a stop string (held back until known).
    Stop strings are searched for in each new piece plus the last
    ``len(longest stop) - 1`` characters before it, so the work per token
    does not grow with the text; the earliest occurrence ends the sample
    (:meth:`push` says so, and no more ids should come), and it and what
    follows are not written. Without ``stream`` or ``stops`` the ids are
    decoded once, by :meth:`finish`, which also writes what is left and a newline.
    """

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
        self.recent = window[max(0, len(window) - self.keep):] if self.keep else ""
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
        """Write the rest of the text and a newline; returns the sample's new text (without the newline)."""
        text = self.tok.decode(self.dec.ids)
        cut = self.cut
        if cut < 0 and not self.plain:  # the end of the last token, if it never became a piece
            at = find_stop(self.recent + text[self.done:], self.stops)
            cut = self.done - len(self.recent) + at if at >= 0 else -1
        if cut >= 0:
            text = text[:cut]
        self.out.write(text[self.written:] + "\n")
        self.out.flush()
        return text


def write_sample(tok: Tokenizer, tokens: Iterable[int], stops: Sequence[str], out: TextIO, stream: bool) -> str:
    """Decode ``tokens`` (ids, as they are sampled), cut at the first stop string, write the text and a newline.

    See :class:`SampleWriter`; the rest of ``tokens`` is not drawn once a stop string appears.

    Returns:
        The sample's new text (without the newline).
    """
    writer = SampleWriter(tok, stops, out, stream)
    for token in tokens:
        if writer.push(token):
            break
    return writer.finish()


def read_prompt(prompt: Optional[str], prompt_file: Optional[Path], stdin: Optional[TextIO]) -> Optional[str]:
    """The prompt text from ``--prompt`` (``-``: standard input) or ``--prompt-file`` (``-``: standard input).

    Returns None when neither is given (the run's ``sample.prompt`` applies).
    The text is used as read: a file's final newline is part of the prompt.

    Raises:
        MinigptError: both options given, an unreadable or non-UTF-8 file.
    """
    if prompt is not None and prompt_file is not None:
        raise MinigptError("pass either --prompt or --prompt-file, not both")
    if prompt == "-" or (prompt_file is not None and str(prompt_file) == "-"):
        if stdin is None:
            raise MinigptError("--prompt -: no standard input to read the prompt from")
        return stdin.read()
    if prompt_file is None:
        return prompt
    return read_text_file(prompt_file, "--prompt-file")


def _trained_tokenizer(ckpt: Path) -> Optional[str]:
    """The fingerprint of the tokenizer ``ckpt`` was trained with; None for checkpoints that predate it.

    Raises:
        MinigptError: meta.json missing or damaged (every checkpoint has one),
            so the tokenizer cannot be checked.
    """
    try:
        meta = runs.read_meta(ckpt)
        fingerprint = meta.get("tokenizer_fingerprint")
        if "tokenizer_fingerprint" in meta and not isinstance(fingerprint, str):
            raise ValueError("tokenizer_fingerprint is not a string")
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:80]
        other = runs.LAST if Path(ckpt).name == runs.BEST else runs.BEST
        raise MinigptError(
            f"{str(runs.resolve(ckpt) / runs.META)!r} is missing or damaged ({reason}), so the tokenizer cannot be checked "
            f"against the checkpoint; use --checkpoint {other}, or copy meta.json from the other checkpoint of "
            f"this run"
        ) from None
    return fingerprint


def checkpoint_step(ckpt: Path) -> Optional[int]:
    """The optimizer step a checkpoint folder was saved at (its meta.json), or None when it does not say."""
    try:
        step = runs.read_meta(ckpt).get("step")
    except (MinigptError, OSError, ValueError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def describe_checkpoint(ckpt: Path) -> str:
    """``checkpoint best, step 30`` for a checkpoint folder; the step is left out when meta.json lacks it."""
    step = checkpoint_step(ckpt)
    return f"checkpoint {Path(ckpt).name}" + (f", step {step}" if step is not None else "")


def check_finite(model: torch.nn.Module, ckpt: Path) -> None:
    """Refuse weights holding NaN or infinity (a run that diverged): sampling from them cannot work.

    Raises:
        MinigptError: naming the first bad tensor and the checkpoint, with the fix.
    """
    for name, tensor in model.state_dict().items():
        # aminmax reads the weights once, allocating nothing (10x faster than isfinite().all() on the
        # 10.7M model); a NaN anywhere makes both NaN, an infinity makes one of them infinite.
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(
                torch.stack(torch.aminmax(tensor.view(-1)))).all()):
            other = f"--checkpoint {runs.BEST if Path(ckpt).name != runs.BEST else runs.LAST}"
            raise MinigptError(
                f"checkpoint {str(ckpt)!r} has NaN or infinite weights ({name}): the run diverged before it "
                f"was saved; try {other}, or retrain with a lower train.learning_rate"
            )


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
    out: Optional[TextIO] = None,
    echo: Callable[[str], None] = lambda message: None,
) -> list[str]:
    """Sample from a trained run: load it, encode the prompt, sample, and print if asked.

    ``sample`` sets the prompt and the sampling: a whole
    :class:`~minigpt_cli.config.schema.SampleConfig`, or a mapping of some of its
    keys that override the run's own ``sample`` section (validated by the
    schema), or None for the run's own section. Each sample is written to
    ``out`` (if given) as the prompt (as given, never re-decoded) followed by
    the new text and one newline, token by token when ``stream``. With
    ``max_new_tokens`` 0 that is the prompt back unchanged. A sample ends
    early when any of ``stop`` appears in its new text; the stop text and what
    follows are not printed (while streaming, text that could be the start of
    a stop string waits until it is known not to be one; stop strings are
    literal here, the CLI turns ``\\n`` and the like into characters first).
    ``window_stride`` sets how the context slides past ``block_size`` (see
    the module docstring). ``num_samples`` samples are decoded as one batch
    (up to :data:`MAX_BATCH` at once) and written when all have ended, each
    with its own stop point; sample i
    (from 0) draws from a generator seeded with ``seed + i``, so it is the
    text a single sample with that seed gives (to float rounding: a batch's
    matrix products may round differently from one row's, which can change a
    token only at a near-tie). Notes go to ``echo``: the run chosen when ``run``
    is None, a checkpoint saved at step 0 (untrained: random weights), text
    of the prompt the model will not see as typed (:func:`~minigpt_cli.tokenizer.kinds.lossy_report`),
    the ``sample`` rules of :mod:`minigpt_cli.config.notes` about the keys given
    (``--top-k`` with ``--temperature 0``, a ``--window-stride`` the window
    never reaches), and a stop string holding a character the vocabulary
    lacks (it can never match).

    Args:
        run: the run folder; None: the newest under ``runs/`` (named through ``echo``).
        sample: the sampling settings, as above.
        checkpoint: ``best`` (falls back to ``last`` when there is none yet) or ``last``.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        seed: the sampling RNG's seed, 0 .. 2**63-1.
        stream: write tokens to ``out`` as they come (one sample only).
        use_cache: reuse past keys and values (the tokens are the same either way).
        compile: decode through a static KV cache with the one-token step
            compiled (:mod:`minigpt_cli.sample.decoding`; CUDA graphs on CUDA); None:
            on for CUDA, off elsewhere (on a CPU it does not pay). Needs
            ``use_cache``. If compiling fails, a warning and the eager path.
        dtype: ``float32`` or ``bfloat16``: the weights, the arithmetic and the
            cache (bfloat16 reads half the bytes per token; its tokens drift
            from float32's, see BENCHMARKS.md).
        stop: texts that end a sample.
        out: where the samples are written (None: nowhere).
        echo: where notes go (the CLI prints them to stderr).

    Returns:
        The samples' texts, each the prompt and its new text.

    Raises:
        MinigptError: no run, a damaged checkpoint, a prompt the tokenizer
            cannot encode (:func:`~minigpt_cli.sample.sampling.encode_prompt`), bad
            sampling settings (a temperature that is not finite and >= 0, ...), an unknown dtype,
            an empty stop string, a sampled id outside the vocabulary (a
            device's faulty sampler).
    """
    which = checkpoint
    if not 0 <= seed < 2**63:
        raise MinigptError(f"--seed {seed}: use a number from 0 to 2**63-1")
    run_dir, ckpt = runs.open_checkpoint(run, which)
    if dtype not in DTYPES:
        raise MinigptError(_MESSAGES["dtype"].format(dtype=dtype))
    dev = resolve_device(device)
    # Measures what else runs from here on: the sampling loop's polls decide the thread count once 0.25 s
    # have passed (no wait before the first token: an idle machine pays nothing).
    threads = CpuThreads(dev)  # silent: the thread count changes the speed, not the text (issue 27 §5)
    model, cfg, tok = load_run(run_dir, ckpt, dev)
    model.to(DTYPES[dtype])  # after the finite check: float32 to bfloat16 keeps the exponent range
    sc = resolve_sample(cfg, sample)
    prompt, max_new_tokens, num_samples, top_k = sc.prompt, sc.max_new_tokens, sc.num_samples, sc.top_k
    window_stride = resolve_window_stride(cfg.model.block_size, sc.window_stride)
    check_temperature(sc.temperature)  # the schema refuses it too; a model_construct'ed config is not checked
    stops = list(stop)
    if any(s == "" for s in stops):
        raise MinigptError(_MESSAGES["stop_empty"])
    flags = given_keys(sample)
    if top_k is not None and top_k > tok.vocab_size:
        if "top_k" in flags:  # asked for
            echo(_MESSAGES["top_k_clamped"].format(top_k=top_k, vocab=tok.vocab_size))
        top_k = tok.vocab_size
    # The run's own sample.prompt was checked by train before step 0, with the same message (encode_prompt).
    ids = encode_prompt(tok, prompt, "the prompt" if "prompt" in flags else "sample.prompt")
    if run is None:  # said once all checks passed, so that an error stays one line
        echo(f"using {run_dir} ({describe_checkpoint(ckpt)})")
    elif ckpt.name != which:
        echo(f"using {describe_checkpoint(ckpt)}: the run has no {which} checkpoint yet")
    if checkpoint_step(ckpt) == 0:
        echo(f"note: {run_dir}'s {ckpt.name} checkpoint is untrained (saved at step 0, its weights are the "
             f"random init), so the text is random; train the run further, or pass --run of a trained one")
    lossy = lossy_report(tok, prompt)
    if lossy is not None:
        echo(lossy)
    for line in notes(cfg.model_copy(update={"sample": sc}), route="generate",
                      given_keys={f"sample.{k}" for k in flags}, names={f"sample.{k}": FLAGS[k] for k in flags},
                      prompt_tokens=len(ids)):
        echo(line)
    for s in stops:  # text the model cannot write: the vocabulary lacks a character of it
        missing = tok.unknown_chars(s)
        if missing:
            echo(_MESSAGES["stop_never"].format(stop=s, chars=", ".join(map(repr, missing))))
    block = cfg.model.block_size
    if len(ids) > block and max_new_tokens > 0:
        echo(f"note: the prompt has {len(ids)} tokens; the model sees only the last {block} (block_size)")
    compiled = (compile if compile is not None else dev.type == "cuda") and max_new_tokens > 0
    if compile and not use_cache:
        echo(_MESSAGES["compile_no_cache"])
    out = out if out is not None else Nowhere()
    texts = []
    for first in range(0, num_samples, MAX_BATCH):
        rows = min(MAX_BATCH, num_samples - first)
        decoder = compiled_decoder(model, rows, echo) if compiled and use_cache else None
        idx = torch.tensor([ids] * rows, dtype=torch.long, device=dev)
        # Sample i (from 0) draws from its own generator, seeded seed + i: the single sample of that seed.
        gens = [torch.Generator(device=dev).manual_seed(seed + i) for i in range(first, first + rows)]
        writers = [SampleWriter(tok, stops, out, stream and num_samples == 1) for _ in range(rows)]
        live = set(range(rows))
        if num_samples == 1:
            out.write(prompt)
            out.flush()
        for t in generate_tokens(model, idx, max_new_tokens, sc.temperature, top_k, sc.top_p, use_cache, gens,
                                 vocab_limit=tok.vocab_size, window_stride=window_stride, decoder=decoder):
            threads.poll()
            for i, token in enumerate(t.tolist()):
                if i in live and writers[i].push(token):
                    live.discard(i)
            if not live:
                break
        for i, writer in enumerate(writers, start=first):
            if num_samples > 1:
                out.write(f"{'-' * 20} sample {i + 1} {'-' * 20}\n{prompt}")
            texts.append(prompt + writer.finish())
    return texts


class Nowhere:
    """A text stream that drops what it is given (``generate`` without ``out``; ``bench``)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def given_keys(sample: Optional[SampleConfig | Mapping[str, Any]]) -> set[str]:
    """The ``sample`` keys the caller of :func:`generate` gave (its flags): a mapping's keys, the fields a
    :class:`~minigpt_cli.config.schema.SampleConfig` was built with; none for None."""
    if sample is None:
        return set()
    if isinstance(sample, SampleConfig):
        return set(sample.model_fields_set)
    return set(sample) & set(FLAGS)


def resolve_sample(cfg: Config, sample: Optional[SampleConfig | Mapping[str, Any]]) -> SampleConfig:
    """The sampling settings :func:`generate` uses: ``sample`` itself, or the run's (``cfg.sample``) with
    ``sample``'s keys, checked within the run's whole config (``window_stride`` against its block_size).

    Raises:
        ConfigError: a key that is not a ``sample`` key, or a value the schema refuses; names the key.
    """
    if sample is None:
        return cfg.sample
    if isinstance(sample, SampleConfig):
        return sample
    whole = cfg.to_dict()
    whole["sample"] = {**whole["sample"], **dict(sample)}
    return validate(whole, "sample").sample


def load_run(run_dir: Path, ckpt: Path, device: torch.device):
    """The model of checkpoint ``ckpt`` (on ``device``, its linear layers swapped for faster kernels),
    its config and the run's tokenizer, checked against each other.

    Raises:
        MinigptError: non-finite weights, or a tokenizer.json that is not the one the checkpoint was trained with.
    """
    model, cfg = load_model(ckpt, device)
    swap_kernels(model)
    tok = load_run_tokenizer(run_dir, cfg)
    check_finite(model, ckpt)
    if cfg.model.vocab_size < tok.vocab_size:
        raise MinigptError(
            f"{run_dir / runs.TOKENIZER} has {tok.vocab_size} entries but the checkpoint's model has "
            f"{cfg.model.vocab_size}; the run folder is inconsistent"
        )
    if tok.kind != cfg.tokenizer.kind:
        raise MinigptError(
            f"{run_dir / runs.TOKENIZER} is a {tok.kind} tokenizer but the run was trained with "
            f"tokenizer.kind {cfg.tokenizer.kind}; restore the run's own tokenizer.json"
        )
    trained_with = _trained_tokenizer(ckpt)
    if trained_with is not None and trained_with != tok.fingerprint():
        raise MinigptError(
            f"{run_dir / runs.TOKENIZER} is not the tokenizer this checkpoint was trained with (its fingerprint "
            f"differs); restore the run's own tokenizer.json"
        )
    return model, cfg, tok
