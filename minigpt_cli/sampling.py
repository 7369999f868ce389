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

import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TextIO

import torch

from . import runs
from .checkpoint import load_model
from .config import SampleConfig, validate
from .errors import MinigptError
from .kernels import onednn
from .model import GPT
from .runtime import CpuThreads, resolve_device
from .tokenizer import load_run_tokenizer


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
    path = Path(prompt_file)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MinigptError(f"--prompt-file {str(path)!r} not found") from None
    except UnicodeDecodeError:
        raise MinigptError(f"--prompt-file {str(path)!r} is not UTF-8 text; convert it (e.g. with iconv)") from None
    except OSError as exc:
        raise MinigptError(f"--prompt-file {str(path)!r} cannot be read ({exc.strerror or exc})") from None


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


def describe_checkpoint(ckpt: Path) -> str:
    """``checkpoint best, step 30`` for a checkpoint folder; the step is left out when meta.json lacks it."""
    try:
        step = runs.read_meta(ckpt).get("step")
    except (MinigptError, OSError, ValueError):
        step = None
    return f"checkpoint {Path(ckpt).name}" + (f", step {step}" if isinstance(step, int) else "")


def check_finite(model: torch.nn.Module, ckpt: Path) -> None:
    """Refuse weights holding NaN or infinity (a run that diverged): sampling from them cannot work.

    Raises:
        MinigptError: naming the first bad tensor and the checkpoint, with the fix.
    """
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            other = f"--checkpoint {runs.BEST if Path(ckpt).name != runs.BEST else runs.LAST}"
            raise MinigptError(
                f"checkpoint {str(ckpt)!r} has NaN or infinite weights ({name}): the run diverged before it "
                f"was saved; try {other}, or retrain with a lower train.learning_rate"
            )


def generate(
    run: Optional[str | Path] = None,
    sample: Optional[SampleConfig | Mapping[str, Any]] = None,
    *,
    checkpoint: str = "best",
    device: str = "auto",
    seed: int = 1337,
    stream: bool = False,
    use_cache: bool = True,
    stop: Sequence[str] = (),
    out: Optional[TextIO] = None,
    echo: Callable[[str], None] = lambda message: None,
) -> list[str]:
    """Sample from a trained run: load it, encode the prompt, sample, and print if asked.

    ``sample`` sets the prompt and the sampling: a whole
    :class:`~minigpt_cli.config.SampleConfig`, or a mapping of some of its
    keys that override the run's own ``sample`` section (validated by the
    schema), or None for the run's own section. Each sample is written to
    ``out`` (if given) as the prompt (as given, never re-decoded) followed by
    the new text and one newline, token by token when ``stream``. With
    ``max_new_tokens`` 0 that is the prompt back unchanged. A sample ends
    early when any of ``stop`` appears in its new text; the stop text and what
    follows are not printed (while streaming, text that could be the start of
    a stop string waits until it is known not to be one). ``window_stride``
    sets how the context slides past ``block_size`` (see the module docstring).

    Args:
        run: the run folder; None: the newest under ``runs/`` (named through ``echo``).
        sample: the sampling settings, as above.
        checkpoint: ``best`` (falls back to ``last`` when there is none yet) or ``last``.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        seed: the sampling RNG's seed, 0 .. 2**63-1.
        stream: write tokens to ``out`` as they come.
        use_cache: reuse past keys and values (the tokens are the same either way).
        stop: texts that end a sample.
        out: where the samples are written (None: nowhere).
        echo: where notes go (the CLI prints them to stderr).

    Returns:
        The samples' texts, each the prompt and its new text.

    Raises:
        MinigptError: no run, a damaged checkpoint, a prompt the tokenizer
            cannot encode, bad sampling settings, an empty stop string.
    """
    which = checkpoint
    if which not in (runs.BEST, runs.LAST):
        raise MinigptError(f"--checkpoint {which!r}: use best or last")
    if not 0 <= seed < 2**63:
        raise MinigptError(f"--seed {seed}: use a number from 0 to 2**63-1")
    run_dir = Path(run) if run is not None else runs.latest_run()
    if not run_dir.is_dir():
        raise MinigptError(f"run folder {str(run_dir)!r} not found; pass --run runs/NAME of a trained run")
    ckpt = runs.checkpoint_dir(run_dir, which)
    if which == runs.BEST and not runs.has_weights(ckpt):
        ckpt = runs.checkpoint_dir(run_dir, runs.LAST)
    dev = resolve_device(device)
    threads = CpuThreads(dev, echo=echo)  # measures what else runs while the model loads
    model, cfg = load_model(ckpt, dev)
    onednn.swap_linears(model)
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
    sc = resolve_sample(cfg.sample, sample)
    prompt, max_new_tokens, temperature, top_p = sc.prompt, sc.max_new_tokens, sc.temperature, sc.top_p
    num_samples, top_k = sc.num_samples, sc.top_k
    window_stride = resolve_window_stride(cfg.model.block_size, sc.window_stride)
    stops = list(stop)
    if any(s == "" for s in stops):
        raise MinigptError("--stop '': the stop text must not be empty")
    if top_k is not None and top_k > tok.vocab_size:
        if sample is not None and (not isinstance(sample, Mapping) or "top_k" in sample):  # asked for
            echo(f"note: --top-k {top_k} is larger than the vocabulary ({tok.vocab_size}); using {tok.vocab_size}")
        top_k = tok.vocab_size
    if prompt == "":
        raise MinigptError("the prompt is empty; pass --prompt TEXT (a newline works: --prompt $'\\n')")
    ids = tok.encode(prompt)
    if not ids:
        raise MinigptError("the prompt encodes to no tokens; pass a longer --prompt")
    if run is None:  # said once all checks passed, so that an error stays one line
        echo(f"using {run_dir} ({describe_checkpoint(ckpt)})")
    elif ckpt.name != which:
        echo(f"using {describe_checkpoint(ckpt)}: the run has no {which} checkpoint yet")
    block = cfg.model.block_size
    if len(ids) > block and max_new_tokens > 0:
        echo(f"note: the prompt has {len(ids)} tokens; the model sees only the last {block} (block_size)")
    if threads.enabled and max_new_tokens > 0:
        time.sleep(max(0.0, 0.15 - (time.monotonic() - threads.started)))  # a window long enough to measure
        threads.poll(force=True)
    g = torch.Generator(device=dev).manual_seed(seed)
    texts = []
    out = out if out is not None else _Nowhere()
    for i in range(num_samples):
        if num_samples > 1:
            out.write(f"{'-' * 20} sample {i + 1} {'-' * 20}\n")
        out.write(prompt)
        out.flush()
        idx = torch.tensor([ids], dtype=torch.long, device=dev)
        new: list[int] = []
        shown = ""
        stopped = False
        for t in generate_tokens(model, idx, max_new_tokens, temperature, top_k, top_p, use_cache, g,
                                  vocab_limit=tok.vocab_size, window_stride=window_stride):
            new.append(int(t[0]))
            threads.poll()
            if not (stream or stops):
                continue
            text = tok.decode(new)
            cut = find_stop(text, stops)
            if cut >= 0:
                stopped = True
                break
            if stream:
                # Print only what is new; multi-token characters wait until complete,
                # and so does an ending that may grow into a stop string.
                ready = text[: len(text) - stop_holdback(text, stops)]
                if len(ready) > len(shown) and not ready.endswith("\ufffd"):
                    out.write(ready[len(shown):])
                    out.flush()
                    shown = ready
        text = tok.decode(new)
        if stopped:
            text = text[: find_stop(text, stops)]
        out.write(text[len(shown):] + "\n")
        out.flush()
        texts.append(prompt + text)
    return texts


class _Nowhere:
    """A text stream that drops what it is given (``generate`` without ``out``)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def resolve_sample(base: SampleConfig, sample: Optional[SampleConfig | Mapping[str, Any]]) -> SampleConfig:
    """The sampling settings :func:`generate` uses: ``sample`` itself, or ``base`` with ``sample``'s keys.

    Raises:
        ConfigError: a key that is not a ``sample`` key, or a value the schema refuses; names the key.
    """
    if sample is None:
        return base
    if isinstance(sample, SampleConfig):
        return sample
    return validate({"sample": {**base.model_dump(), **dict(sample)}}, "sample").sample
