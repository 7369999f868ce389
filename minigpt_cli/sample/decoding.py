"""Decoding with a static KV cache and a compiled one-token step, as gpt-fast (pytorch-labs) does it.

The cache is preallocated (:class:`~minigpt_cli.model.gpt.StaticKVCache`) and the position is a tensor, so the
one-token step sees the same shapes at every position and is compiled once (``mode="reduce-overhead"``: on CUDA,
replayed as a CUDA graph). The prompt and every refill after the window slides go through the model eagerly
("prefill"), since their length varies. Sampling stays eager, in :func:`~minigpt_cli.sample.sampling.sample_next`,
so seeded samples draw the same random numbers as the other paths. On a CPU compiling does not pay
(BENCHMARKS.md), so ``generate`` leaves it off there unless asked.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from ..model.gpt import GPT, StaticKVCache

#: What :func:`compiled_decoder` says.
_MESSAGES = {
    "compiling": "compiling the one-token decoding step (torch.compile; seconds to a minute, once)",
    "failed": "warning: torch.compile failed ({error}); decoding without it",
}


def _step(model: GPT, cache: StaticKVCache, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Logits (B, V) of the token after idx (B, 1) at position pos (1,), its keys and values written to cache."""
    logits, _ = model(idx, cache=cache, last_only=True, pos=pos)
    return logits[:, -1, :]


@functools.cache
def compiled_step(mode: Optional[str], backend: str = "inductor"):
    """:func:`_step` through ``torch.compile`` in ``mode`` (None: the default), one graph, static shapes;
    ``backend`` ``aot_eager`` captures the same graph on eager kernels in a fraction of the time (the tests)."""
    return torch.compile(_step, mode=mode, fullgraph=True, dynamic=False, backend=backend)


def default_mode(device: torch.device) -> Optional[str]:
    """``reduce-overhead`` (CUDA graphs) on CUDA, Inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


class StaticDecoder:
    """Prefill and one-token steps of ``model`` (eval mode) over a static cache of ``batch`` rows (fixed: the
    compiled step has static shapes); ``compile`` False runs the same step eagerly. ``mode`` None:
    :func:`default_mode` of the model's device."""

    def __init__(
        self,
        model: GPT,
        batch: int,
        compile: bool = False,
        mode: Optional[str] = None,
        backend: str = "inductor",
    ):
        self.model = model
        self.batch = batch
        self.cache = model.new_static_cache(batch)
        self.device = model.wte.weight.device
        # The step's inputs live in fixed tensors, filled in place: the same strides (no recompiles) and addresses.
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.compiled = compile
        self.cuda_graphs = False
        if compile:
            mode = mode if mode is not None else default_mode(self.device)
            self.cuda_graphs = (
                mode in ("reduce-overhead", "max-autotune")
                and self.device.type == "cuda"
                and backend == "inductor"
            )
            if self.cuda_graphs:
                from torch._dynamo import (
                    mark_static_address,
                )  # about 2 s: only where something is compiled

                for t in self.cache.buffers():  # written in place inside the graph: fixed addresses
                    mark_static_address(t)
            self._step = compiled_step(mode, backend)
        else:
            self._step = _step

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Fill the cache with a window idx (B, T), T <= block_size, from position 0; logits (B, V) of its last."""
        pos = torch.arange(idx.size(1), device=idx.device)
        logits, _ = self.model(idx, cache=self.cache, last_only=True, pos=pos)
        return logits[:, -1, :]

    @torch.no_grad()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Feed token (B,) at ``position`` (< block_size) of the window; logits (B, V) of the next token."""
        self.pos.fill_(position)
        self.token.copy_(token[:, None])
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are no longer needed
        logits = self._step(self.model, self.cache, self.token, self.pos)
        return (
            logits.clone() if self.cuda_graphs else logits
        )  # a graph's outputs are overwritten next replay

    def warm_up(self, steps: int = 3) -> None:
        """Run the step a few times at position 0 (compiling it; on CUDA, recording its graph); what they write
        to the cache is overwritten by the next :meth:`prefill`. Raises whatever ``torch.compile`` raises."""
        token = torch.zeros(self.batch, dtype=torch.long, device=self.device)
        for _ in range(steps):
            self.step(token, 0)


def compiled_decoder(
    model: GPT, batch: int, echo: Callable[[str], None]
) -> Optional[StaticDecoder]:
    """A :class:`StaticDecoder` of ``batch`` rows with its step compiled and warmed up, saying so through
    ``echo``; None, with a warning, where compiling fails (``torch.compile`` fails at the first call: no C++
    compiler, an unsupported platform), so that the caller decodes eagerly."""
    echo(_MESSAGES["compiling"])
    try:
        decoder = StaticDecoder(model, batch, compile=True)
        decoder.warm_up()
    except Exception as exc:
        echo(
            _MESSAGES["failed"].format(
                error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            )
        )
        return None
    return decoder
