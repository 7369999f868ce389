"""Evaluation during training: when it runs and on which batches (the text sample that follows it is
:meth:`~.loop.Trainer.sample`)."""

from __future__ import annotations

import sys
import time
from contextlib import AbstractContextManager
from typing import Callable, Iterator, Optional

import torch
from tqdm.auto import tqdm

from ..config.schema import Config
from ..data.pipeline import eval_offsets, eval_seed, full_eval_batches, windows
from ..data.preparation import PreparedData
from ..runtime.device import CpuThreads
from ..runtime.distributed import Dist
from .estimate import eval_batches
from .schedule import should_eval
from .step import estimate_loss


class Evaluator:
    """Decides when the run evaluates and computes the losses. Each split's windows depend on the
    seed, the split, the step and the global batch alone
    (:func:`~minigpt_cli.data.pipeline.eval_seed`): any split into micro-batches and processes, and
    a resumed run, evaluate the same windows."""

    def __init__(
        self,
        cfg: Config,
        data: PreparedData,
        device: torch.device,
        dist: Dist,
        autocast: AbstractContextManager,
        cpu_threads: CpuThreads,
        show_bar: bool,
        should_stop: Callable[[], bool],
        on_batch: Callable[[int, float], None],
    ):
        self.cfg, self.device, self.dist, self.autocast = cfg, device, dist, autocast
        self.cpu_threads, self.show_bar, self.should_stop, self.on_batch = (
            cpu_threads,
            show_bar,
            should_stop,
            on_batch,
        )
        self.splits = {"train": data.train, "val": data.val}
        tc = cfg.train
        #: Sampled windows per split at each eval, over every process.
        self.n_windows = tc.eval_iters * tc.batch_size * tc.grad_accum_steps * dist.world
        #: Micro-batches that this process reads at each eval, both splits.
        self.batches_per_eval = eval_batches(cfg, len(data.val), dist.world)

    def due(self, step: int, evaluated: bool) -> bool:
        """Whether the run evaluates now (:func:`~.schedule.should_eval`), once per step."""
        return should_eval(step, self.cfg.train) and not evaluated

    def batches(self, split: str, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This process's micro-batches of ``split``'s eval windows at ``step``: sampled, or the
        whole val split with ``train.eval_full_val``."""
        tokens, T, B = self.splits[split], self.cfg.model.block_size, self.cfg.train.batch_size
        if split == "val" and self.cfg.train.eval_full_val:
            yield from full_eval_batches(tokens, T, B, self.dist.rank, self.dist.world, self.device)
            return
        share = self.n_windows // self.dist.world
        lo, hi = self.dist.rank * share, (self.dist.rank + 1) * share  # this process's windows
        pending, seen = torch.empty(0, dtype=torch.long), 0
        for chunk in eval_offsets(
            len(tokens), T, self.n_windows, eval_seed(self.cfg.seed, split, step)
        ):
            a, b = max(lo - seen, 0), min(hi - seen, len(chunk))
            seen += len(chunk)
            if a < b:
                pending = torch.cat([pending, chunk[a:b]])
            while len(pending) >= B or (seen >= hi and len(pending)):
                yield windows(tokens, pending[:B], T, self.device)
                pending = pending[B:]
            if seen >= hi:
                return

    def losses(self, model: torch.nn.Module, step: int) -> Optional[dict[str, float]]:
        """Mean train and val loss per token (:func:`~.step.estimate_loss`); None when a stop
        request cut it short."""
        # A second bar under the training one while the eval runs (a big eval_iters can take
        # minutes).
        bar = tqdm(
            total=self.batches_per_eval,
            desc=f"eval at step {step}",
            unit="batch",
            leave=False,
            disable=not self.show_bar,
            dynamic_ncols=True,
            file=sys.stderr,
        )
        done, started = 0, time.perf_counter()

        def counted(split: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            nonlocal done
            for batch in self.batches(split, step):
                yield batch  # resumed when the loss of this batch is computed and the next one is asked for
                done += 1
                bar.update(1)
                self.on_batch(done, time.perf_counter() - started)

        def poll_and_ask() -> bool:
            self.cpu_threads.poll()
            return self.should_stop()

        try:
            return estimate_loss(
                model,
                {split: counted(split) for split in self.splits},
                self.autocast,
                self.dist,
                should_stop=poll_and_ask,
            )
        finally:
            bar.close()
