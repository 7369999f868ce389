"""The training loop: a :class:`Trainer` that asks its components when to act, and :func:`train`,
the command.

A stop request (SIGINT/SIGTERM) saves ``checkpoints/last``, also mid-eval; the trainer state holds
the optimizer, every RNG, the sampler's position, the best val loss and the early-stopping counter,
so a resumed run has the same losses at every later step.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ..accounting.steps import full_steps, tokens_through
from ..config.schema import Config
from ..errors import Interrupted, MinigptError
from ..run import folder as runs
from ..run import trackers
from ..run.checkpoint import Checkpointer
from ..runtime import distributed as parallel
from ..runtime.device import capture_rng, flush_denormals
from ..runtime.distributed import all_mean, close_distributed
from ..sample.sampling import sample_prompt_text
from .estimate import CPU_RECIPE, CPU_RECIPES, TimeEstimate, eval_batches
from .evaluate import Evaluator
from .guards import MAX_NONFINITE, Skips, Stops
from .optim import set_lr
from .schedule import lr_at
from .setup import Claim, Setup, build, plan
from .step import train_step

#: Without a progress bar (stderr not a terminal), a status line at most this often, in seconds.
STATUS_EVERY_S = 30.0
#: Why :meth:`Trainer.evaluate` stops a run: early stopping, or the caller's ``on_eval`` (a search's
#: pruner).
EARLY, ASKED = "early stopping", "stopped as on_eval asked"
#: A stop request that came once the run's last eval was done: the run ended anyway
#: (:meth:`Trainer.fit`).
STOPPED_AT_END = (
    "stopped by {signal} as the run ended at step {step}: it is complete{losses} and saved in {last}; "
    "nothing is left to resume"
)


@dataclass
class TrainResult:
    """What :func:`train` returns: the run folder, the final step and losses (None where no eval
    ran)."""

    run_dir: Path
    step: int
    train_loss: Optional[float]
    val_loss: Optional[float]
    best_val_loss: Optional[float]
    stopped_early: bool = False
    already_done: bool = False  # a resumed run that had reached max_iters: nothing trained


class Trainer:
    """Runs the optimizer steps of one prepared run (:class:`~.setup.Setup`) until it ends."""

    def __init__(self, s: Setup, on_eval: Optional[Callable[[int, float], bool]] = None):
        self.s = s
        self.on_eval = (
            on_eval  # (step, val loss) after each eval; True stops the run there, as early stopping
        )
        self.prog = s.prog
        self.t0 = time.perf_counter() - s.logger.elapsed_offset()
        self.t_log, self.tokens_since_log = time.perf_counter(), 0
        self.t_status = time.perf_counter()
        tc = s.cfg.train
        # Tokens trained on so far, exact under the batch-size ramp and sequence-length warmup.
        self.tokens = tokens_through(s.prog.step, s.cfg, s.dist.world)
        self.skips = Skips(s.logger.log, self.diverged)
        self.stops = Stops(s.stop, s.dist, s.device, tc.max_seconds, self.t0)
        self.estimate = TimeEstimate(
            tc,
            s.prog.step,
            s.prog.evaluated,
            eval_batches(s.cfg, len(s.data.val), s.dist.world),
            # the CPU recipe's note once: not again when the estimate before the run gave it
            s.device.type == "cpu"
            and s.cfg.name not in CPU_RECIPES
            and CPU_RECIPE not in s.estimate,
            say=s.say,
            log=s.logger.log,
            full_steps=lambda a, b: full_steps(a, b, s.cfg),
            ramp_end=max(tc.batch_size_warmup_iters, tc.block_size_warmup_iters),
        )
        self.evaluator = Evaluator(
            s.cfg,
            s.data,
            s.device,
            s.dist,
            s.autocast,
            s.cpu_threads,
            show_bar=not s.bar.disable,
            should_stop=self.stops.stop_requested,
            on_batch=self.estimate.eval_batch,
        )
        self.checkpointer = Checkpointer(
            s.run_dir,
            s.cfg,
            snapshot=self.snapshot,
            enabled=s.dist.main,
            collective=parallel.is_sharded(s.model),
            ema=s.ema.state_dict if s.ema is not None else None,
        )

    # ------------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        """Train from the current step to ``train.max_iters`` (or early stopping, or a stop
        request).

        Raises:
            Interrupted: a stop request (after saving ``last``; at the end, naming the saved run,
                with no ``resume_dir``) or a second Ctrl-C (without saving).
            MinigptError: the loss stayed non-finite for :data:`MAX_NONFINITE` steps.
        """
        s, p, tc = self.s, self.prog, self.s.cfg.train
        stopped_early = False
        s.model.train()
        with s.stop, self.second_ctrl_c(), flush_denormals(s.device):
            while True:
                # train.max_seconds passed: this step is the last, after its eval
                late = self.stops.out_of_time()
                due = self.evaluator.due(p.step, p.evaluated) or (late and not p.evaluated)
                if due and (why := self.evaluate()):
                    stopped_early = True
                    s.logger.log(
                        f"{why} at step {p.step}"
                        + (
                            f": no better val loss in {p.bad_evals} evals (best {p.best_val:.4f})"
                            if why == EARLY
                            else ""
                        )
                    )
                    s.echo(f"{why} at step {p.step} (best val loss {p.best_val:.4f})")
                    break
                # At max_iters the run ends once its final eval ran (a stop request can cut that
                # eval short).
                if p.step > tc.max_iters or ((p.step == tc.max_iters or late) and p.evaluated):
                    break
                if self.stops.stop_requested():
                    self.interrupt()
                lr = lr_at(p.step, tc, s.cfg.model.n_embd)
                t_step = time.perf_counter()
                loss, skipped = self.step(lr)
                s.cpu_threads.poll()
                tokens = s.step_tokens(p.step)
                self.tokens += tokens
                self.tokens_since_log += tokens
                p.step += 1
                p.evaluated = False
                self.skips.record(p.step, loss, skipped)
                self.estimate.step_done(p.step, time.perf_counter() - t_step)
                s.bar.update(1)
                if p.step % tc.log_interval == 0 or p.step == tc.max_iters:
                    self.log_train(loss, lr)  # the host's one look at the step's numbers
                    self.stops.agree()
                self.checkpointer.after_step(p.step)
            self.skips.read()  # the steps since the last log
            result = self.finish(stopped_early)
            if s.stop.signal is not None:
                raise self.stopped_at_end(result)
        return result

    @contextmanager
    def second_ctrl_c(self):
        """A second Ctrl-C (a KeyboardInterrupt once a stop was asked) becomes
        :meth:`abort_error`."""
        try:
            yield
        except KeyboardInterrupt:
            if self.s.stop.signal is None:
                raise
            raise self.abort_error() from None

    def step(self, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step at learning rate ``lr``: the mean loss and whether the update was
        skipped (1.0) as not finite, both on the device (:func:`~.step.train_step`)."""
        s = self.s
        set_lr(s.optimizer, lr)
        loss, skipped = train_step(
            s.train_model,
            s.optimizer,
            s.train_sampler,
            s.cfg.train.grad_accum_steps,
            s.autocast,
            s.scaler,
            s.cfg.train.grad_clip,
            s.params,
            dist=s.dist,
        )
        if s.ema is not None:  # on the device: a skipped step leaves the average as it was
            s.ema.update(self.prog.step + 1, skipped)
        return loss, skipped

    def with_ema(self):
        """The model holds the EMA weights inside (``train.ema_decay``), its own after; a no-op
        without EMA."""
        return self.s.ema.applied() if self.s.ema is not None else nullcontext()

    def diverged(self, first: int, last: int) -> MinigptError:
        """The error for :data:`~.guards.MAX_NONFINITE` skipped steps in a row, ``first`` to
        ``last``: what to change."""
        s = self.s
        s.bar.close()
        mc, tc = s.cfg.model, s.cfg.train
        # The step's flag joins the loss and the gradient norm (train_step): say both.
        what = "the loss or its gradients were" if tc.grad_clip > 0 else "the loss was"
        if first == 1:  # no update was ever applied: the fresh model, or its compiled graph
            if s.eval_model is not s.model:  # compiled: the eager model may be fine (a 6-layer,
                # 384-wide model with attention dropout under a CPU's bfloat16 autocast got NaN
                # gradients from Inductor's backward and finite ones eagerly: PyTorch 2.13)
                fix = (
                    ", with compile on; try the same run with compile: false (--set compile=false): "
                    "if it trains, torch.compile's graph is at fault, else lower model.init_std "
                    f"(now {mc.init_std:g})"
                )
            else:
                fix = (
                    f": the model overflows as initialised; lower model.init_std (now "
                    f"{mc.init_std:g}) or the model's size"
                )
            return MinigptError(
                f"{what} not finite for the first {MAX_NONFINITE} steps, before any update{fix}"
            )
        return MinigptError(
            f"{what} not finite for {MAX_NONFINITE} steps in a row, steps {first} to {last}; "
            f"lower train.learning_rate (now {tc.learning_rate:g}) or raise train.warmup_iters; "
            f"{self.checkpointer.last} holds the last finite state"
        )

    def log_train(self, loss: torch.Tensor, lr: float) -> None:
        """A ``train`` event: the loss (averaged over ranks), the learning rate and tokens/s since
        the last one; none for a step that was skipped. The skipped steps since the last event are
        logged first.

        Raises:
            MinigptError: :data:`~.guards.MAX_NONFINITE` steps in a row were skipped
            (:meth:`diverged`).
        """
        s, step = self.s, self.prog.step
        if self.skips.read():
            return
        train_loss = all_mean(loss, s.dist).item()
        now = time.perf_counter()
        tps = self.tokens_since_log / max(now - self.t_log, 1e-9)
        self.t_log, self.tokens_since_log = now, 0
        self.record(
            {
                "step": step,
                "event": "train",
                "elapsed_s": round(now - self.t0, 3),
                "loss": train_loss,
                "lr": lr,
                "tokens_per_sec": round(tps, 1),
                "tokens": self.tokens,
            }
        )
        s.bar.set_postfix(
            loss=f"{train_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False
        )
        if (
            s.bar.disable and now - self.t_status >= STATUS_EVERY_S
        ):  # a log file or pipe still hears of progress
            self.t_status = now
            s.echo(
                f"step {step:,}/{s.cfg.train.max_iters:,}: loss {train_loss:.4f}, lr {lr:.2e}, {tps:,.0f} tokens/s"
            )

    def record(self, event: dict) -> None:
        """One metrics.jsonl event, and the same to the run's trackers (``train.trackers``)."""
        self.s.logger.event(event)
        if self.s.trackers is not None:
            self.s.trackers.log(event)

    def evaluate(self) -> Optional[str]:
        """Evaluate at the current step, then log, checkpoint, sample and plot; why to stop
        (:data:`EARLY`, :data:`ASKED`) when early stopping or ``on_eval`` says so, else None."""
        s, p = self.s, self.prog
        t_eval = time.perf_counter()
        losses = None  # a stop request cut the eval short
        with s.stop.cutting(not s.dist.enabled), self.with_ema():
            losses = self.evaluator.losses(s.eval_model, p.step)
        if losses is None:
            return False
        # eval_step: a checkpoint saved later (on a stop) carries the losses of this eval, with
        # their step.
        p.last = {"train_loss": losses["train"], "val_loss": losses["val"], "eval_step": p.step}
        p.evaluated = True
        ema = s.ema is not None
        self.record(
            {
                "step": p.step,
                "event": "eval",
                "elapsed_s": round(time.perf_counter() - self.t0, 3),
                "train_loss": losses["train"],
                "val_loss": losses["val"],
                "tokens": self.tokens,
                # The losses are the EMA weights' (a number for the trackers, as every field).
                **({"ema": True} if ema else {}),
            }
        )
        line = f"step {p.step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
        line += " (EMA weights)" if ema else ""
        s.logger.log(line)
        s.say(line)
        improved = losses["val"] < p.best_val
        if improved:
            p.best_val, p.bad_evals = losses["val"], 0
        elif p.step > 0:
            p.bad_evals += 1
        self.checkpointer.after_eval(improved)
        self.sample()
        s.logger.plot()
        self.t_log += time.perf_counter() - t_eval  # tokens/s counts training time only
        s.bar.unpause()  # nor does the bar's rate (and its time left) count the eval
        if self.on_eval is not None and self.on_eval(p.step, losses["val"]):
            return ASKED
        patience = s.cfg.train.early_stop_patience
        return EARLY if patience is not None and p.bad_evals >= patience else None

    # ------------------------------------------------------------------ stopping

    def interrupt(self) -> None:
        """Save ``last`` and stop, as a signal asked.

        Raises:
            Interrupted: always; the exit status follows the signal.
        """
        s, step = self.s, self.prog.step
        self.skips.read()  # skipped steps are logged, and a divergence is said, before the save
        self.checkpointer.on_stop()
        s.bar.close()
        s.logger.log(
            f"stopped by {s.stop.signal} at step {step}; saved {runs.CHECKPOINTS}/{runs.LAST}"
        )
        raise Interrupted(
            f"stopped by {s.stop.signal} at step {step}; saved {self.checkpointer.last}",
            s.stop.signum,
            resume_dir=s.run_dir,
        )

    def stopped_at_end(self, result: TrainResult) -> Interrupted:
        """The answer to a stop request that came once the last eval was done: the run is complete
        and saved."""
        s = self.s
        losses = f" (val loss {result.val_loss:.4f})" if result.val_loss is not None else ""
        s.logger.log(
            f"{s.stop.signal} came as the run ended at step {result.step}; nothing was cut short"
        )
        return Interrupted(
            STOPPED_AT_END.format(
                signal=s.stop.signal, step=result.step, losses=losses, last=self.checkpointer.last
            ),
            s.stop.signum,
        )

    def abort_error(self) -> Interrupted:
        """The error that replaces a second Ctrl-C's KeyboardInterrupt: nothing saved, where the
        last checkpoint is."""
        s = self.s
        s.bar.close()
        step = self.checkpointer.last_step()
        if step is None:
            return Interrupted(
                "aborted by a second Ctrl-C without saving; no checkpoint had been written yet, "
                "so there is nothing to resume"
            )
        s.logger.log(f"aborted by a second Ctrl-C at step {self.prog.step} without saving")
        return Interrupted(
            f"aborted by a second Ctrl-C without saving; the last checkpoint is "
            f"{self.checkpointer.last} (step {step})",
            resume_dir=s.run_dir,
        )

    def sample(self) -> None:
        """Append ``train.sample_tokens`` tokens to samples.txt, sampled as ``minigpt generate``
        samples with the run's ``sample`` section; a stop cuts it short. Rank 0 only, asking its own
        stop flag; under FSDP (each forward gathers the weights from every rank) every rank samples
        the same tokens and asks rank 0's flag."""
        s, step, tc = self.s, self.prog.step, self.s.cfg.train
        sharded = parallel.is_sharded(s.model)
        if not (s.dist.main or sharded) or tc.sample_tokens <= 0:
            return
        with self.with_ema():
            text = sample_prompt_text(
                s.model,
                s.tok,
                s.cfg.sample,
                tc.sample_tokens,
                s.cfg.seed,
                should_stop=self.stops.stop_requested
                if sharded
                else lambda: s.stop.signal is not None,
            )
        parallel.reshard(
            s.model
        )  # FSDP: the root's weights, gathered for the sample, back to shards
        if not s.dist.main:
            return
        s.logger.sample(step, text)
        if s.stop.signal is not None:
            s.logger.log(f"the step-{step} sample was cut short by {s.stop.signal}")

    # ------------------------------------------------------------------ state

    def snapshot(self) -> tuple[torch.nn.Module, dict, dict]:
        """What a checkpoint holds now: the model (FSDP: its gathered weights), the trainer state
        and the meta facts."""
        s, p = self.s, self.prog
        weights, optimizer_state = parallel.gather_state(s.model, s.optimizer)  # FSDP: a collective
        state = {
            "step": p.step,
            "evaluated": p.evaluated,
            "best_val_loss": p.best_val,
            "bad_evals": p.bad_evals,
            "optimizer": optimizer_state,
            "scaler": s.scaler.state_dict() if s.scaler.is_enabled() else {},
            "rng": capture_rng(),
            "data_rng": {
                "train": s.train_sampler.state()
            },  # eval batches follow the step (eval_seed)
        }
        # The tokenizer's fingerprint lets generate tell a swapped tokenizer.json from the run's
        # own. The corpus's files let a resume name the one that changed since.
        meta = {
            "name": s.cfg.name,
            "step": p.step,
            "tokenizer_fingerprint": s.tok.fingerprint(),
            "corpus": s.corpus,
            "world_size": s.dist.world,
            **p.last,
        }  # world: evaluate's eval windows
        return weights, state, meta

    def finish(self, stopped_early: bool) -> TrainResult:
        """Close the bar, finish the trackers' runs, log the end, leave the process group."""
        s, p = self.s, self.prog
        s.bar.close()
        if s.trackers is not None:
            s.trackers.finish()
        s.logger.log(
            f"done at step {p.step} in {time.perf_counter() - self.t0:.1f}s; best val loss {p.best_val:.4f}"
        )
        close_distributed(s.dist)
        return TrainResult(
            s.run_dir,
            p.step,
            p.last.get("train_loss"),
            p.last.get("val_loss"),
            p.best_val if math.isfinite(p.best_val) else None,
            stopped_early,
        )


def train(
    cfg: Config,
    run_name: Optional[str] = None,
    *,
    resume: Optional[str] = None,
    echo: Callable[[str], None] = print,
    progress: Optional[bool] = None,
    on_eval: Optional[Callable[[int, float], bool]] = None,
    group: Optional[dict] = None,
) -> TrainResult:
    """Train a GPT as ``cfg`` says and leave a run folder (its layout:
    :mod:`minigpt_cli.run.folder`); ``resume``: ``auto`` or a run folder to continue;
    ``on_eval(step, val_loss)`` after each eval, True ending the run there (``stopped_early``;
    ``last`` is saved). Nothing global is left changed afterwards (a sweep calls this often).
    ``group``: a sweep's run's tracker group (the sweep's name, the trial's name and settings);
    None: the one :data:`~minigpt_cli.run.trackers.GROUP_ENV` gives, if any.

    Raises:
        MinigptError: what :func:`~.setup.plan` refuses before anything is written (a path that
            cannot be written, no such device, data that cannot be fetched, a run that exists or is
            in use, a damaged checkpoint, a prompt the tokenizer cannot encode, a model too large
            for the free memory), the allocator running out, or training that diverged.
        Interrupted: stopped by SIGINT/SIGTERM (after saving ``checkpoints/last``), or aborted by a
            second Ctrl-C (without saving); ``resume_dir`` names the run to continue (None: it is
            complete).
    """
    claim = Claim()
    try:
        with claim:
            p = plan(cfg, run_name, resume, echo, progress, claim)
            p.group = group if group is not None else trackers.group_from_env()
            if p.done:  # a resumed run that already reached max_iters
                close_distributed(p.dist)
                return TrainResult(**p.resumed.result(), already_done=True)
            return Trainer(build(p, claim, echo, progress), on_eval).fit()
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        # check_memory's estimate passed but the allocator did not: one line, not a traceback.
        text = str(exc)
        if not isinstance(exc, torch.OutOfMemoryError) and "can't allocate memory" not in text:
            raise
        first = (text.strip().splitlines() or [type(exc).__name__])[0][:200]
        raise MinigptError(
            f"out of memory ({first}); make model.n_layer, n_embd, model.block_size or train.batch_size "
            f"smaller (minigpt count-params --config CONFIG estimates the memory)"
        ) from None
