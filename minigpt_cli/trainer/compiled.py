"""``torch.compile`` for a run, decided once before its first step (:func:`compile_model`, called
by :func:`~.setup.build`): the compiled model warmed up, or, when that fails, the eager one."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Optional

import torch

from ..runtime import distributed as parallel
from ..runtime.device import capture_rng, restore_rng
from ..runtime.kernels import onednn


def compile_model(s: Any) -> None:
    """Wrap the model of ``s`` (the run's :class:`~.setup.Setup`) for training: ``torch.compile``
    when asked, DDP under torchrun (unless sharded by FSDP).

    Compile is decided here, once: the compiled model is warmed up (:func:`_warm_up`), and if that
    fails on any rank, every rank trains eagerly (the ranks agree by one all-reduce). No later step
    falls back: an error there, an out-of-memory one included, ends the run as an error."""
    if s.cfg.compile and "oneDNN" in s.eager_kernels["linear_kernel"]:
        s.echo(onednn.COMPILE_NOTE)
        s.logger.log(onednn.COMPILE_NOTE)
    compiled = None
    if s.cfg.compile:
        failure: Optional[Exception] = None
        # A process that trains run after run (a sweep, a search) would reach Dynamo's limit of 8
        # compiles of GPT.forward (one per model) and silently run the later ones eagerly: the
        # earlier runs' graphs are dropped first.
        torch.compiler.reset()
        try:
            compiled = torch.compile(s.model)
            s.train_model = parallel.wrap(compiled, s.device, s.dist)
            _warm_up(s, compiled)
        except torch.OutOfMemoryError:
            raise  # not a compile failure: eager would run out as well
        except Exception as exc:  # platform support varies (no C++ compiler, no Triton, ...)
            failure = exc
        if not parallel.all_agree(failure is None, s.dist, s.device):
            why = "it failed on another process"
            if failure is not None:  # Dynamo's first line can be "backend='inductor' raised:"
                lines = [line.strip() for line in str(failure).splitlines() if line.strip()]
                why = f"{type(failure).__name__}: {' '.join(lines[:2])[:200]}"
            s.echo(f"warning: torch.compile failed ({why}); training without it")
            s.logger.log(f"torch.compile failed ({why}); training without it")
            compiled, s.train_model = None, s.model  # DDP's wrapper of it (and its hooks) let go
            s.optimizer.zero_grad(set_to_none=True)
            s.env.update(s.eager_kernels)  # the eager step's kernels, not the compiled one's
            s.write_env()
    if compiled is None:
        s.train_model = parallel.wrap(s.model, s.device, s.dist)
    s.eval_model = compiled if compiled is not None else s.model
    if parallel.is_sharded(s.model):
        s.logger.log(
            f"FSDP: weights, gradients and AdamW moments sharded over {s.dist.world} processes"
        )


def _warm_up(s: Any, compiled: torch.nn.Module) -> None:
    """Compile now rather than at the first step: a forward and backward in training mode (through
    DDP's wrapper without its gradient all-reduce, so that a rank whose compile fails leaves no
    collective half-done) and a forward in eval mode (the evals' graph), on a batch of token 0. The
    gradients are dropped and every RNG put back, so the run's numbers are those of a run without
    the warm-up."""
    tc, mc = s.cfg.train, s.cfg.model
    x = torch.zeros(tc.batch_size, mc.block_size, dtype=torch.long, device=s.device)
    rng = capture_rng()
    sync = s.train_model.no_sync() if hasattr(s.train_model, "no_sync") else nullcontext()
    try:
        with sync:
            with s.autocast:
                _, loss = s.train_model(x, x)
            loss.backward()
        s.optimizer.zero_grad(set_to_none=True)
        compiled.eval()
        with torch.no_grad(), s.autocast:
            compiled(x, x)
    finally:
        compiled.train()
        restore_rng(rng)
        # FSDP: the root's weights, gathered by the eval forward, back to shards
        parallel.reshard(s.model)
