"""Evaluation during training: when it runs, on which batches, and the text sample that follows it."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import Callable, Optional

import torch
from tqdm.auto import tqdm

from ..config import Config
from ..data import BatchSampler, PreparedData, eval_seed
from ..metrics import RunLogger
from ..runtime import CpuThreads, Dist
from ..tokenizer import Tokenizer
from .schedule import should_eval
from .signals import StopFlag
from .step import estimate_loss, sample_text


class Evaluator:
    """Decides when the run evaluates (:func:`~.schedule.should_eval`) and computes the losses.

    The eval batches of each split depend on the seed, the split and the step
    alone (:func:`~minigpt_cli.data.eval_seed`): the samplers are reseeded
    before every eval, so an interrupted and resumed run evaluates exactly as
    the uninterrupted one. A progress bar under the training bar shows a long
    eval; ``should_stop`` (the trainer's stop request) is asked before every
    batch, so a Ctrl-C does not wait for the eval to end.

    Args:
        cfg: the resolved config (``train.eval_iters``, ``eval_interval``,
            ``sample_tokens``, ``seed``, ``sample.window_stride``).
        data: the prepared token files.
        device, dist, autocast: where and how the model runs.
        tok: the run's tokenizer, for the text sample.
        cpu_threads: polled during long evals.
        stop: the run's stop flag (the sample, on rank 0 only, asks it directly).
        show_bar: whether the eval's progress bar is shown.
    """

    def __init__(self, cfg: Config, data: PreparedData, device: torch.device, dist: Dist,
                 autocast: AbstractContextManager, tok: Tokenizer, cpu_threads: CpuThreads, stop: StopFlag,
                 show_bar: bool):
        self.cfg, self.device, self.dist, self.autocast = cfg, device, dist, autocast
        self.tok, self.cpu_threads, self.stop, self.show_bar = tok, cpu_threads, stop, show_bar
        mc, tc = cfg.model, cfg.train
        self.samplers = {
            split: BatchSampler(tokens, mc.block_size, tc.batch_size, cfg.seed + offset, device,
                                rank=dist.rank, world=dist.world)
            for split, tokens, offset in (("train", data.train, 2), ("val", data.val, 3))
        }
        #: Asked before every eval batch; the trainer sets it (under DDP every rank must get the same answer).
        self.should_stop: Callable[[], bool] = lambda: stop.signal is not None

    def due(self, step: int, evaluated: bool) -> bool:
        """Whether the run evaluates now: at step 0, every ``eval_interval`` steps and at the end, once."""
        return should_eval(step, self.cfg.train) and not evaluated

    def losses(self, model: torch.nn.Module, step: int) -> Optional[dict[str, float]]:
        """Mean train and val loss over ``train.eval_iters`` batches each; None when a stop request cut it short."""
        iters = self.cfg.train.eval_iters
        for split, sampler in self.samplers.items():
            sampler.reseed(eval_seed(self.cfg.seed, split, step))
        # A second bar under the training one while the eval runs (a big eval_iters can take minutes).
        bar = tqdm(total=len(self.samplers) * iters, desc=f"eval at step {step}", unit="batch",
                   leave=False, disable=not self.show_bar, dynamic_ncols=True, file=sys.stderr)
        started = False

        def batch_done_or_stop() -> bool:
            nonlocal started
            if started:  # asked before every batch: the one before has finished
                bar.update(1)
            started = True
            self.cpu_threads.poll()
            return self.should_stop()

        try:
            return estimate_loss(model, self.samplers, iters, self.autocast, self.dist,
                                 should_stop=batch_done_or_stop)
        finally:
            bar.close()

    def sample(self, model: torch.nn.Module, step: int, logger: RunLogger) -> None:
        """Append ``train.sample_tokens`` sampled tokens to samples.txt (rank 0 only; 0 tokens: nothing).

        Only rank 0 samples, so it asks its own stop flag (the broadcast
        answer would wait for the other ranks); a stop cuts the sample short.
        """
        tc = self.cfg.train
        if not self.dist.main or tc.sample_tokens <= 0:
            return
        text = sample_text(model, self.tok, self.device, tc.sample_tokens, self.cfg.seed,
                           self.cfg.sample.window_stride, should_stop=lambda: self.stop.signal is not None)
        logger.sample(step, text)
        if self.stop.signal is not None:
            logger.log(f"the step-{step} sample was cut short by {self.stop.signal}")
