"""``minigpt bench``'s generation speed: new tokens/s uncached, cached, compiled, and :data:`BATCH`
at once.

Each figure is ``generate``'s own loop (:func:`~minigpt_cli.sample.sampling.generate_tokens`)
through one of the decoders of :mod:`minigpt_cli.sample.decoding`, its tokens read as ``generate``
reads them: per token for one sample, in chunks for the batch."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from ..model.gpt import GPT
from ..sample.sampling import generate_tokens

#: Samples decoded together for the batched figure.
BATCH = 8

#: Why there is no compiled figure on a CPU unless asked.
CPU_COMPILE_OFF = (
    "not measured: on a CPU generate does not compile by default (compiling the step takes tens "
    "of seconds and did not pay in BENCHMARKS.md); --set compile=true measures it"
)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA, MPS), so that a timer reads finished work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measure_generation(
    model: GPT,
    prompt: torch.Tensor,
    max_new_tokens: int,
    window_stride: int,
    compile: bool,
    batch: int = BATCH,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Tokens/s of ``model`` continuing ``prompt`` (1, T) by path, and their ratios; compiled only
    with ``compile``."""
    device = prompt.device

    def timed(use_cache: bool, rows: int = 1, decoder=None) -> tuple[float, torch.Tensor]:
        """(new tokens/s over all rows, the tokens (rows, n)) of one seeded pass, after a seeded
        warm-up."""

        def tokens(n: int) -> torch.Tensor:
            gens = [torch.Generator(device=device).manual_seed(i) for i in range(rows)]
            return torch.stack(
                list(
                    generate_tokens(
                        model,
                        prompt.expand(rows, -1),
                        n,
                        1.0,
                        None,
                        None,
                        use_cache,
                        gens,  # one per row: no wait for the device between reads
                        window_stride=window_stride,
                        decoder=decoder,
                    )
                ),
                dim=1,
            )

        tokens(min(8, max_new_tokens))  # warm-up
        sync(device)
        t = time.perf_counter()
        out = tokens(max_new_tokens)
        sync(device)
        return rows * max_new_tokens / (time.perf_counter() - t), out

    def say(what: str) -> None:
        echo(
            f"generation: {max_new_tokens} new tokens after a {prompt.size(1)}-token prompt, {what}"
        )

    say("with the KV cache")
    cached, cached_tokens = timed(True)
    say("without the KV cache")
    uncached, _ = timed(False)
    say(f"{batch} samples in one batch, with the KV cache")
    batched, _ = timed(True, batch)
    compiled: Optional[float] = None
    equal: Optional[bool] = None
    compile_s: Optional[float] = None
    note: Optional[str] = None if compile else CPU_COMPILE_OFF
    if compile:
        from ..sample.decoding import StaticDecoder

        say("compiled one-token step over a static KV cache")
        try:
            t = time.perf_counter()
            decoder = StaticDecoder(model, 1, compile=True)
            decoder.warm_up()
            sync(device)
            compile_s = time.perf_counter() - t
            compiled, compiled_tokens = timed(True, decoder=decoder)
            equal = torch.equal(compiled_tokens, cached_tokens)
        except Exception as exc:  # torch.compile fails lazily where it cannot compile
            note = f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            echo(f"warning: {note}")
    return {
        "gen_tokens_per_sec_cached": cached,
        "gen_tokens_per_sec_uncached": uncached,
        "gen_speedup": cached / uncached,
        "gen_tokens_per_sec_compiled": compiled,
        "gen_compiled_speedup": compiled / cached if compiled is not None else None,
        "gen_compiled_tokens_equal": equal,
        "gen_compile_seconds": compile_s,
        "gen_compiled_note": note,
        "gen_batch": batch,
        "gen_tokens_per_sec_batched": batched,
        "gen_batched_speedup": batched / cached,
    }
