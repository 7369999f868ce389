"""Decoders: the model's next-token logits for a window, then for one new token at a time.

One interface (:class:`Decoder`), as nanochat's ``Engine`` and litgpt's ``generate/base.py`` split
decoding: :meth:`~Decoder.prefill` feeds a whole window (the prompt, or what stays after the window
slides) from position 0, and :meth:`~Decoder.step` feeds the newest token. Three implementations:

- :class:`UncachedDecoder`: no cache; every step runs the whole window again (``--no-kv-cache``);
- :class:`CachedDecoder`: a :class:`KVCache` that grows by the tokens fed;
- :class:`StaticDecoder`: a :class:`StaticKVCache` of fixed shape, written at positions given as a
  tensor, so that the one-token step sees the same shapes at every position and compiles once
  (gpt-fast's way, pytorch-labs/gpt-fast ``generate.py``; ``mode="reduce-overhead"``: on CUDA,
  replayed as a CUDA graph). Its prefill runs eagerly, since its length varies. On a CPU compiling
  does not pay (BENCHMARKS.md), so ``generate`` leaves it off there unless asked.

Each gives the same logits to float32 rounding, and the loop that samples from them
(:func:`~minigpt_cli.sample.sampling.generate_tokens`) is the same for all three.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from ..model.gpt import GPT

# ----------------------------------------------------------------------------- caches


def _buffers(model: GPT, batch: int, capacity: int) -> list[torch.Tensor]:
    """One zeroed (batch, n_kv_head, capacity, head_dim) buffer per layer, in the model's dtype."""
    cfg, p = model.config, model.wte.weight
    shape = (batch, cfg.kv_heads, capacity, cfg.head_dim)
    return [torch.zeros(shape, device=p.device, dtype=p.dtype) for _ in range(cfg.n_layer)]


class KVCache:
    """Keys and values of past positions for every layer of ``model``, preallocated, filled in
    order.

    Per layer ``k``/``v`` are (batch, n_kv_head, capacity, head_dim), positions 0..length-1 filled
    (keys after RoPE). Nothing drops the oldest entry: past the first layer each key saw every
    earlier token, so a sliding window is refilled
    (:func:`~minigpt_cli.sample.sampling.generate_tokens`)."""

    def __init__(self, model: GPT, batch: int, capacity: Optional[int] = None):
        self.capacity = capacity or model.config.block_size
        self.k = _buffers(model, batch, self.capacity)
        self.v = _buffers(model, batch, self.capacity)
        self.length = 0

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Append k, v (B, n_kv, T, hs) of ``layer`` after the ``length`` held (``positions`` follow
        them: unread); the last layer's update advances ``length`` by T.

        Returns:
            All keys and values (B, n_kv, length+T, hs), and the mask (T, length+T) bool (True: may
            attend) of the new queries, or None where plain causal attention (an empty cache) or
            none (one new query) is right.

        Raises:
            RuntimeError: more positions than the capacity."""
        T = k.size(2)
        past, end = self.length, self.length + T
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} > capacity {self.capacity}")
        self.k[layer][:, :, past:end] = k
        self.v[layer][:, :, past:end] = v
        mask = None
        if past and T > 1:  # T new queries after `past` cached keys: query i sees keys 0..past+i
            mask = torch.ones(T, end, dtype=torch.bool, device=k.device).tril(diagonal=past)
        if layer == len(self.k) - 1:  # every layer has stored these T positions
            self.length = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end], mask

    def reset(self) -> None:
        """Forget every position (the buffers are reused)."""
        self.length = 0


class StaticKVCache:
    """Keys and values for every layer in buffers of fixed shape, written at positions given as a
    tensor.

    gpt-fast's static cache (pytorch-labs/gpt-fast, ``model.py``): ``k``/``v`` (batch, n_kv_head,
    block_size, head_dim) never change shape or address, and the positions are an int64 tensor, so a
    one-token step compiles once and captures as a CUDA graph. Attention masks key slot j for a
    query at p unless j <= p, so stale slots count for nothing. ``length`` is always 0: the
    positions are given, never taken from the cache."""

    length = 0

    def __init__(self, model: GPT, batch: int):
        self.capacity = model.config.block_size
        self.k = _buffers(model, batch, self.capacity)
        self.v = _buffers(model, batch, self.capacity)
        self.slots = torch.arange(self.capacity, device=model.wte.weight.device)

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor the cache holds (for ``torch._dynamo.mark_static_address``)."""
        return [*self.k, *self.v, self.slots]

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write k, v (B, n_kv, T, hs) of ``layer`` at ``positions`` (T,) int64.

        Returns:
            The whole buffers (B, n_kv, capacity, hs) and the mask (T, capacity) bool, True where a
            query may attend (slot <= its position)."""
        self.k[layer].index_copy_(2, positions, k)
        self.v[layer].index_copy_(2, positions, v)
        return self.k[layer], self.v[layer], self.slots[None, :] <= positions[:, None]


# ----------------------------------------------------------------------------- decoders


class Decoder:
    """Next-token logits of ``model`` (eval mode) for ``batch`` rows: :meth:`prefill`, then
    :meth:`step`.

    A window holds at most block_size tokens, at positions 0.. (the sampling loop slides it)."""

    model: GPT
    batch: Optional[int]  # rows it decodes: fixed for a cache, any for no cache (None)

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Start over with the window idx (B, T), T <= block_size; logits (B, V) after its last
        token."""
        raise NotImplementedError

    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Feed token (B,) int64 at ``position`` (< block_size) of the window, right after the
        tokens fed so far; logits (B, V) of the token after it."""
        raise NotImplementedError


class UncachedDecoder(Decoder):
    """No cache: each step runs the model over the whole window again (O(T²) per token)."""

    batch = None

    def __init__(self, model: GPT):
        self.model = model
        self.window: Optional[torch.Tensor] = None

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        self.window = idx
        return self.model(idx, last_only=True)[0][:, -1, :]

    @torch.no_grad()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        return self.prefill(torch.cat([self.window, token[:, None]], dim=1))


class CachedDecoder(Decoder):
    """A :class:`KVCache` that grows by each token fed and is refilled by each prefill."""

    def __init__(self, model: GPT, batch: int):
        self.model = model
        self.batch = batch
        self.cache = KVCache(model, batch)

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        self.cache.reset()
        return self.model(idx, cache=self.cache, last_only=True)[0][:, -1, :]

    @torch.no_grad()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        # The position is the cache's length: the default positions follow it.
        return self.model(token[:, None], cache=self.cache, last_only=True)[0][:, -1, :]


def _step(
    model: GPT, cache: StaticKVCache, idx: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Logits (B, V) of the token after idx (B, 1) at ``positions`` (1,), its keys and values
    written to the cache."""
    logits, _ = model(idx, positions=positions, cache=cache, last_only=True)
    return logits[:, -1, :]


@functools.cache
def compiled_step(mode: Optional[str], backend: str = "inductor"):
    """:func:`_step` through ``torch.compile`` in ``mode`` (None: the default), one graph, static
    shapes; ``backend`` ``aot_eager`` captures the same graph on eager kernels in a fraction of the
    time (the tests)."""
    return torch.compile(_step, mode=mode, fullgraph=True, dynamic=False, backend=backend)


def default_mode(device: torch.device) -> Optional[str]:
    """``reduce-overhead`` (CUDA graphs) on CUDA, Inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


class StaticDecoder(Decoder):
    """A :class:`StaticKVCache` of ``batch`` rows (fixed: the compiled step has static shapes), its
    one-token step compiled with ``compile`` (eager otherwise). ``mode`` None: :func:`default_mode`
    of the model's device; ``backend``: ``torch.compile``'s."""

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
        self.cache = StaticKVCache(model, batch)
        self.device = model.wte.weight.device
        # The step's inputs live in fixed tensors, filled in place: the same strides (no
        # recompiles) and addresses (a CUDA graph reads them there).
        self.positions = torch.zeros(1, dtype=torch.long, device=self.device)
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
                # about 2 s to import: only where something is compiled
                from torch._dynamo import mark_static_address

                for t in self.cache.buffers():  # written in place inside the graph: fixed addresses
                    mark_static_address(t)
            self._step = compiled_step(mode, backend)
        else:
            self._step = _step

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.size(1), device=idx.device)
        logits, _ = self.model(idx, positions=positions, cache=self.cache, last_only=True)
        return logits[:, -1, :]

    @torch.no_grad()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        self.positions.fill_(position)  # a host value written on the device: no wait
        self.token.copy_(token[:, None])
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are done with
        logits = self._step(self.model, self.cache, self.token, self.positions)
        # A graph's outputs are overwritten by its next replay.
        return logits.clone() if self.cuda_graphs else logits

    def warm_up(self, steps: int = 3) -> None:
        """Run the step a few times at position 0 (compiling it; on CUDA, recording its graph); what
        they write to the cache is overwritten by the next :meth:`prefill`. Raises whatever
        ``torch.compile`` raises."""
        token = torch.zeros(self.batch, dtype=torch.long, device=self.device)
        for _ in range(steps):
            self.step(token, 0)


def compiled_decoder(
    model: GPT, batch: int, echo: Callable[[str], None]
) -> Optional[StaticDecoder]:
    """A :class:`StaticDecoder` of ``batch`` rows with its step compiled and warmed up, saying so
    through ``echo``; None, with a warning, where compiling fails (``torch.compile`` fails at the
    first call: no C++ compiler, an unsupported platform), so that the caller decodes eagerly."""
    echo("compiling the one-token decoding step (torch.compile; seconds to a minute, once)")
    try:
        decoder = StaticDecoder(model, batch, compile=True)
        decoder.warm_up()
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        echo(f"warning: torch.compile failed ({error}); decoding without it")
        return None
    return decoder


def new_decoder(model: GPT, batch: int, use_cache: bool = True) -> Decoder:
    """The eager decoder for ``batch`` rows: :class:`CachedDecoder`, or :class:`UncachedDecoder`
    without ``use_cache``."""
    return CachedDecoder(model, batch) if use_cache else UncachedDecoder(model)
