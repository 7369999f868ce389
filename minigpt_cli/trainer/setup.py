"""Everything a run needs before its first step: :func:`plan` resolves and checks it once
(``--dry-run`` is :func:`plan` without a :class:`Claim`: the same refusals, nothing written);
:func:`build` makes the run folder, the model and the :class:`Setup`."""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from ..accounting.count import counted_vocab
from ..accounting.steps import batch_size_at, block_size_at, ramp_start, step_tokens
from ..config.schema import Config
from ..data.pipeline import (
    BatchSampler,
    DataStage,
    check_corpus,
    on_run_corpus,
    prepare_data,
    with_vocab,
)
from ..data.train_tokenizer import chosen_tokenizer
from ..errors import MinigptError
from ..fileio import atomic_write_text, check_writable
from ..hf.finetune import load_pretrained, resolve_init_from
from ..model.gpt import GPT
from ..run import claim as claims
from ..run import env as run_env
from ..run import folder as runs
from ..run import trackers
from ..run.checkpoint import load_weights_into, read_ema, sweep_stale_temps
from ..run.metrics import METRICS, RunLogger
from ..runtime import distributed as parallel
from ..runtime.device import (
    CpuThreads,
    check_memory,
    emulated_bfloat16_note,
    resolve_device,
    resolve_dtype,
    restore_rng,
    seed_everything,
    tune_runtime,
)
from ..runtime.distributed import Dist, Elastic, barrier, broadcast, init_distributed
from ..runtime.kernels import dropout, onednn
from ..runtime.kernels import swap as swap_kernels
from ..sample.sampling import encode_prompt
from ..tokenizer.kinds import Tokenizer
from .compiled import compile_model
from .ema import WeightEMA
from .estimate import run_estimate
from .optim import make_optimizer
from .resume import Resumed
from .run_notes import config_notes
from .signals import StopFlag
from .step import Prefetcher

#: Said when a resumed run's dropout masks come from another kernel than its last session's
#: (MINIGPT_FAST_DROPOUT).
DROPOUT_CHANGED = (
    "note: the last session of this run drew its dropout masks with {before}'s kernel, this one with "
    "{now}'s (MINIGPT_FAST_DROPOUT, the device, dtype or compile changed); the run goes on, but no "
    "longer as one uninterrupted run would"
)


class Claim(ExitStack):
    """What :func:`~.loop.train` must undo when it ends: a new run folder that never got a
    checkpoint (after a failure), the run lock, and the process-wide settings pushed as
    callbacks."""

    folder: Optional[claims.RunFolder] = None

    def __exit__(self, exc_type, exc, tb):
        try:
            if self.folder is not None:
                if exc_type is not None:
                    self.folder.discard_if_unsaved()
                self.folder.lock.release()
        finally:
            return super().__exit__(exc_type, exc, tb)


@dataclass
class Progress:
    """What the trainer state carries besides optimizer and RNG."""

    step: int = 0
    evaluated: bool = False  # whether the eval at `step` already ran
    best_val: float = math.inf
    bad_evals: int = 0  # evals in a row without a new best (early stopping)
    last: dict[str, float] = field(default_factory=dict)  # the latest eval: losses and eval_step


@dataclass
class Setup:
    """A run ready to train: the config with its vocabulary resolved, the model and every
    component."""

    cfg: Config
    device: torch.device
    dist: Dist
    echo: Callable[[str], None]
    tok: Tokenizer
    run_dir: Path
    model: GPT
    train_model: torch.nn.Module  # compiled and/or DDP-wrapped
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: Any
    train_sampler: Prefetcher  # the BatchSampler, one batch ahead
    prog: Progress
    logger: RunLogger
    stop: StopFlag
    env: dict[str, Any]
    eager_kernels: dict[str, str]
    data: Any  # the PreparedData the evaluator reads
    corpus: dict[str, Any] = field(
        default_factory=dict
    )  # fingerprint and files, for the checkpoints' meta.json
    trackers: Optional[trackers.Trackers] = None  # rank 0's (train.trackers); None elsewhere
    bar: Any = None
    # What evals run: the compiled model when compile is on (set by compiled.compile_model).
    eval_model: Optional[torch.nn.Module] = None
    # What the estimate before the run said (the CPU recipe's note is said once).
    estimate: list[str] = field(default_factory=list)
    ema: Optional[WeightEMA] = None  # the moving average of the weights (train.ema_decay)

    def __post_init__(self):
        self.cpu_threads = CpuThreads(self.device, echo=self.thread_note)

    @property
    def params(self) -> list[torch.Tensor]:
        """The trainable parameters (for gradient clipping): the optimizer's, so under FSDP always
        the shards."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step consumes past the batch-size ramp and the sequence-length
        warmup, over every process."""
        tc = self.cfg.train
        return tc.batch_size * self.cfg.model.block_size * tc.grad_accum_steps * self.dist.world

    def step_tokens(self, step: int) -> int:
        """Tokens optimizer step ``step`` (0-based) consumes, over every process
        (:func:`~minigpt_cli.accounting.steps.step_tokens`)."""
        return step_tokens(step, self.cfg, self.dist.world)

    def say(self, line: str) -> None:
        """A line for the user: above the progress bar while one is shown."""
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=sys.stderr)
        else:
            self.echo(line)

    def write_env(self) -> None:
        """Write env.json (rank 0)."""
        if self.dist.main:
            run_env.write_env(self.run_dir, self.env)

    def thread_note(self, message: str) -> None:
        """The thread count changed: say so, log it, and list it in env.json."""
        self.say(message)
        self.logger.log(message.removeprefix("note: "))
        # env.json's torch_threads is the count at the start; changes are listed after it.
        self.env.setdefault("torch_threads_changes", []).append(
            {"step": self.prog.step, "threads": torch.get_num_threads()}
        )
        self.write_env()


def run_files(run_dir: Path) -> tuple[list[Path], set[Path]]:
    """The files ``train`` writes in a run folder it resumes (its lock, the logs of
    :class:`~minigpt_cli.run.metrics.RunLogger`, config.yaml, env.json, the plot), and those it
    appends to."""
    log = RunLogger(run_dir, enabled=False)
    appended = [run_dir / runs.LOCK, log.metrics_path, log.log_path, log.samples_path]
    return appended + [run_dir / runs.CONFIG, run_dir / runs.ENV, log.plot_path], set(appended)


@dataclass
class Plan:
    """What ``train`` will do, resolved once (:func:`plan`): ``given`` is the config as the user
    gave it (``model.init_from`` resolved), ``cfg`` with the vocabulary and corpus fingerprint
    filled in where known."""

    given: Config
    cfg: Config
    device: torch.device
    dtype: torch.dtype
    dist: Dist
    run_name: Optional[str]
    resume: Optional[str]
    resumed: Optional[Resumed]
    stage: DataStage
    notes: list[str]
    vocab_size: Optional[int]  # None: not known until the corpus is downloaded (a dry run)
    estimate: list[str] = field(default_factory=list)  # the run's time here, the CPU recipe note
    seconds: Optional[float] = None  # that time, in seconds (None: not estimated)
    trackers: list[str] = field(default_factory=list)  # train.trackers, their packages imported
    group: Optional[dict] = None  # a sweep's run: its tracker group (the sweep, the trial)
    elastic: Optional[Elastic] = None  # under torchrun: the job's run id and restart count
    # A group torchrun restarted: the folder an earlier group made and saved nothing in, which this
    # one trains in from step 0 (one that has a checkpoint is resumed: ``resumed``).
    reuse: Optional[Path] = None

    @property
    def done(self) -> bool:
        """A resumed run that already reached ``train.max_iters``: nothing to train."""
        return self.resumed is not None and self.resumed.done


def plan(
    cfg: Config,
    run_name: Optional[str],
    resume: Optional[str],
    echo: Callable[[str], None],
    progress: Optional[bool],
    claim: Optional["Claim"] = None,
) -> Plan:
    """Resolve and check everything ``train`` needs before it makes a run folder; ``claim`` None: a
    dry run, which writes nothing; else the resumed run's lock is registered in it.

    Raises:
        MinigptError: as :func:`~.loop.train` documents, up to its first write into a run folder.
    """
    write = claim is not None
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    dist, device = init_distributed(device) if write else (Dist.from_env(), device)
    if not dist.main:
        echo = lambda message: None  # noqa: E731 - only rank 0 talks
    tc = cfg.train
    tracker_names = trackers.check(tc) if dist.main else []
    elastic = Elastic.from_env()
    restarted = _restarted_run(tc.out_dir, elastic, dist, write)
    reuse, restart = None, None
    if restarted is not None and runs.has_checkpoint(restarted):
        # Continued in place from checkpoints/last, whatever --run-name or --resume named.
        run_name, resume, restart = None, str(restarted), elastic
    else:
        reuse = restarted
    resumed = Resumed.find(cfg, resume, restart) if resume is not None else None
    if resumed is not None:  # a run that trained on the fallback corpus continues on it
        cfg = on_run_corpus(cfg, resumed.saved)
    if run_name is not None and resume is not None and not (resumed and resumed.branch):
        raise MinigptError(
            "pass either --resume or --run-name, not both (a resumed run keeps its folder; "
            "--resume RUN/checkpoints/NAME starts a new one, which --run-name may name)"
        )
    cfg = resolve_init_from(cfg, resumed.run_dir if resumed is not None else None, echo)
    cfg = chosen_tokenizer(cfg, echo)  # own text: the tokenizer train-tokenizer made for it
    if resumed is not None and not resumed.branch:
        appended = run_files(resumed.run_dir)[1]
        run = resumed.run_dir
        for path, folder in [(run, True), (run / runs.CHECKPOINTS, True)] + [
            (p, False) for p in run_files(run)[0]
        ]:
            check_writable(path, folder, append=path in appended, in_run=True)
    elif reuse is not None:  # the folder this torchrun job's earlier group made
        check_writable(reuse, folder=True)
    else:  # a new run folder (a branch from a checkpoint too)
        check_writable(tc.out_dir, folder=True)
        if run_name is not None:
            claims.check_run_name(tc.out_dir, run_name)
        name = run_name or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        check_writable(Path(tc.out_dir) / name, folder=True)
    if resumed is not None:  # locks the run it continues in place (rank 0 of a real run)
        resumed.check(cfg, claim if write and dist.main else None)
    found: list[str] = []

    def checked(corpus) -> None:
        if resumed is not None:
            resumed.check_corpus(corpus)
        check_corpus(cfg, corpus)

    def noted(corpus) -> None:  # before the download: the data.url note looks at the corpus on disk
        found[:] = config_notes(cfg, dist, corpus is not None and cfg.data.path is None)
        if emulated := emulated_bfloat16_note(device, dtype):
            found.append(emulated)
        for note in found if write else []:
            echo(note)

    if write and dist.local_rank != 0:
        barrier(
            dist
        )  # under torchrun the first process of a node prepares the data; the others wait, then read
    # samples.txt samples from sample.prompt, and generate will: refused as generate refuses it,
    # before a tokenizer trained for this run or its token files are written.
    stage = prepare_data(
        cfg,
        echo,
        progress if dist.main else False,
        write,
        check=checked,
        found=noted,
        check_tokenizer=lambda tok: encode_prompt(tok, cfg.sample.prompt, "sample.prompt"),
    )
    if write and dist.local_rank == 0:
        barrier(dist)
    if stage.fallback is not None:  # data.dataset's source was unreachable: the run names its own
        cfg = cfg.model_copy(
            update={"data": cfg.data.model_copy(update={"dataset": stage.fallback})}
        )
    given, vocab = cfg, stage.tok.vocab_size if stage.tok is not None else cfg.tokenizer.vocab_size
    if cfg.tokenizer.kind == "char" and stage.tok is None:
        vocab = None  # the corpus's characters, not known before it is downloaded
    # With no vocabulary yet, the memory check counts what count-params counts (one estimate).
    counted = counted_vocab(cfg) or 1 + len(cfg.tokenizer.special_tokens)
    cfg = with_vocab(cfg, vocab if vocab is not None else counted)
    if stage.corpus is not None:
        cfg = cfg.model_copy(
            update={"data": cfg.data.model_copy(update={"fingerprint": stage.corpus.fingerprint})}
        )
    check_memory(cfg, device, dtype, shards=parallel.shards(tc.parallelism, dist))
    if resumed is not None:
        resumed.open(cfg, stage.tok)
    elif resume is not None and write:
        echo(
            f"--resume auto: no run named {cfg.name!r} under {tc.out_dir}/ yet; starting a new one"
        )
    # The run's time on this device, from a few timed steps (not under torchrun: one process would
    # say it for all, timed alone).
    left = resumed is None or not resumed.done
    estimate, seconds = (
        run_estimate(
            cfg,
            device,
            dtype,
            *(resumed.position if resumed else (0, False)),
            val_tokens=stage.data.counts[1] if stage.data is not None else None,
        )
        if left and not dist.enabled
        else ([], None)
    )
    return Plan(
        given,
        cfg,
        device,
        dtype,
        dist,
        run_name,
        resume,
        resumed,
        stage,
        found,
        vocab,
        estimate=estimate,
        seconds=seconds,
        trackers=tracker_names,
        elastic=elastic,
        reuse=reuse,
    )


def _restarted_run(
    out_dir: str, elastic: Optional[Elastic], dist: Dist, write: bool
) -> Optional[Path]:
    """In a group torchrun restarted (``--max-restarts``), the run folder an earlier group of the
    job trained in, found by the job's run id (:func:`~minigpt_cli.run.claim.find_elastic_run`);
    None in a first group, outside torchrun, or when no earlier group made one. Rank 0 looks and
    tells the others (in a real run), so that every process opens the same folder."""
    if elastic is None or elastic.restart == 0:
        return None
    found = claims.find_elastic_run(out_dir, elastic.run_id) if dist.main or not write else None
    if write:  # a dry run has no process group
        found = broadcast(None if found is None else str(found), dist)
    return None if found is None else Path(found)


def build(p: Plan, claim: Claim, echo: Callable[[str], None], progress: Optional[bool]) -> Setup:
    """Make the run folder, the model, the optimizer and the :class:`Setup`; what must be undone
    goes in ``claim``."""
    cfg, dist, device, dtype, resumed = p.cfg, p.dist, p.device, p.dtype, p.resumed
    tc, mc, tok = cfg.train, cfg.model, p.stage.tok
    if not dist.main:
        echo = lambda message: None  # noqa: E731 - only rank 0 talks
        progress = False
    in_place = resumed is not None and not resumed.branch
    if in_place:
        run_dir = resumed.run_dir
    elif dist.main:
        # Under torchrun --max-restarts, a folder with no checkpoint yet stays for the next group.
        keep = p.elastic is not None and p.elastic.restarts_left
        claim.folder = (
            claims.reuse_run_dir(p.reuse, keep)
            if p.reuse is not None
            else claims.new_run_dir(tc.out_dir, cfg.name, p.run_name, keep)
        )
        run_dir = claim.folder.path
    else:
        run_dir = None
    if dist.main and p.elastic is not None:  # before anything can fail: a restarted group's key
        claims.mark_elastic(run_dir, p.elastic.run_id)
    run_dir = Path(broadcast(str(run_dir), dist))
    # Before the run's own files: a tracker that cannot start leaves a new run folder unmade.
    started = (
        trackers.start(p.trackers, run_dir, cfg.flat(), p.group, echo, echo)
        if p.trackers and dist.main
        else None
    )
    if started is not None:
        claim.callback(started.finish)  # on any exit; a finished set finishes nothing twice

    seed_everything(cfg.seed)
    model = GPT(mc)
    if (
        mc.init_from is not None and resumed is None
    ):  # fine-tuning; a resumed run loads its own checkpoint
        load_pretrained(model, cfg)
    model = parallel.place(swap_kernels(model), device, dist, tc.parallelism)  # FSDP: sharded here
    eager_kernels = {
        "linear_kernel": onednn.linear_kernel(model, tc.batch_size * mc.block_size, device, dtype),
        "dropout_kernel": dropout.dropout_kernel(model, device, dtype),
    }
    logger = RunLogger(run_dir, echo=None, enabled=dist.main)
    swept: list[Path] = []
    if dist.main:
        # The first writes into a resumed run's folder: plan() refused whatever it could before
        # them.
        if in_place and claim.folder is not None:
            claim.folder.lock.mark()
            # Safe under the lock: no other process saves.
            swept = sweep_stale_temps(runs.checkpoint_dir(run_dir, runs.LAST).parent)
        # On resume too: the run's config.yaml follows the train values it now runs with (an edit
        # made to it by hand is kept beside it, and said, not lost).
        edited = runs.keep_edited_config(run_dir, cfg.to_yaml()) if in_place else None
        if edited is not None:
            echo(
                f"note: {run_dir / runs.CONFIG} was edited since the last checkpoint; a resume runs with the "
                f"config given here (now in config.yaml), and the edited file is kept as {edited.name}"
            )
        atomic_write_text(run_dir / runs.CONFIG, cfg.to_yaml())
        if not in_place:
            tok.save(run_dir / runs.TOKENIZER)
        if resumed is not None and resumed.branch and (resumed.run_dir / METRICS).is_file():
            # The branch's curve starts with its run's, up to the checkpoint (_restore cuts the
            # rest).
            shutil.copyfile(resumed.run_dir / METRICS, run_dir / METRICS)
        swept += logger.sweep_temps()
    compiled_kernels = {
        "linear_kernel": "torch.mm",  # torch.compile keeps PyTorch's kernels
        "dropout_kernel": dropout.dropout_kernel(model, device, dtype, compiled=True),
    }
    env = run_env.env_info(
        device, dtype, dist.world, **(compiled_kernels if cfg.compile else eager_kernels)
    )
    # The GPUs this process was given (a sweep's --jobs gives each run its own); None when unset.
    env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    env["config_changes"] = (
        resumed.changes if resumed is not None else {}
    )  # this session's keys, old -> new
    if resumed is not None and resumed.branch:
        env["started_from"] = str(resumed.checkpoint)
    if in_place and dist.main:  # a resumed run: the sessions before this one are kept, oldest first
        env["earlier_sessions"] = run_env.earlier_sessions(run_dir)
        before = (
            env["earlier_sessions"][-1].get("dropout_kernel") if env["earlier_sessions"] else None
        )
        if before not in (None, env["dropout_kernel"]):
            echo(DROPOUT_CHANGED.format(before=before, now=env["dropout_kernel"]))

    data, corpus = p.stage.data, p.stage.corpus
    s = Setup(
        cfg=cfg,
        device=device,
        dist=dist,
        echo=echo,
        tok=tok,
        run_dir=run_dir,
        model=model,
        train_model=model,
        optimizer=make_optimizer(model, tc),
        scaler=torch.amp.GradScaler(
            device.type, enabled=device.type == "cuda" and dtype == torch.float16
        ),
        autocast=torch.autocast(device_type=device.type, dtype=dtype)
        if dtype != torch.float32
        else nullcontext(),
        train_sampler=Prefetcher(
            BatchSampler(
                data.train,
                mc.block_size,
                tc.batch_size,
                cfg.seed + 1,
                device,
                rank=dist.rank,
                world=dist.world,
                sizes=_step_sizes(cfg),
                accum=tc.grad_accum_steps,
            )
        ),
        prog=Progress(),
        logger=logger,
        stop=StopFlag(),
        env=env,
        eager_kernels=eager_kernels,
        data=data,
        corpus={"fingerprint": corpus.fingerprint, "files": corpus.records()},
    )
    s.write_env()
    claim.callback(tune_runtime(device))
    claim.callback(s.cpu_threads.restore)
    if resumed is not None:
        _restore(s, resumed)
    s.ema = _weight_ema(s, resumed)
    if swept:
        logger.log(
            f"removed {len(swept)} temporary file(s) left by a killed process: "
            f"{', '.join(p.name for p in swept)}"
        )
    if p.reuse is not None:
        line = (
            f"{p.elastic.describe()}: {run_dir} got no checkpoint before the failure; training it "
            "from step 0 again"
        )
        echo(line)
        logger.log(line)
    compile_model(s)
    _announce(s, data, dtype)
    s.estimate = list(p.estimate)
    for line in [f"time to train: {p.estimate[0]}", *p.estimate[1:]] if p.estimate else []:
        s.echo(line)
        s.logger.log(line.removeprefix("note: "))
    s.trackers = started
    if started is not None:  # a tracker failing mid-run: said above the bar, and in train.log
        started.warn = lambda line: (s.say(line), s.logger.log(line.removeprefix("warning: ")))
    # disable=None: tqdm shows the bar only when stderr is a terminal (no bar flooding a log file).
    s.bar = tqdm(
        total=tc.max_iters,
        initial=s.prog.step,
        desc="train",
        unit="step",
        disable=None if progress is None else not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    return s


def _restore(s: Setup, resumed: Resumed) -> None:
    """Load a resumed run's weights, optimizer, scaler, RNGs, data position and progress into
    ``s``."""
    state = resumed.state
    weights_dir = runs.resolve(resumed.checkpoint)
    load_weights_into(s.model, weights_dir)
    # torch.optim's load takes every group's hyperparameters from the checkpoint too; the config's
    # (betas, weight decay, Muon's momentum and Newton-Schulz steps, ...) are put back, since a
    # resume that changes one says so and must train with it. The moments stay the checkpoint's;
    # the learning rate is the schedule's at every step.
    built = [{k: v for k, v in g.items() if k != "params"} for g in s.optimizer.param_groups]
    parallel.load_optimizer_state(s.model, s.optimizer, state["optimizer"])
    for group, values in zip(s.optimizer.param_groups, built):
        group.update(values)
    if state.get("scaler"):
        s.scaler.load_state_dict(state["scaler"])
    restore_rng(state["rng"])
    s.train_sampler.set_state(state["data_rng"]["train"], state["step"])
    s.prog = Progress(
        step=state["step"],
        evaluated=state["evaluated"],
        best_val=state["best_val_loss"],
        bad_evals=state["bad_evals"],
    )
    s.logger.truncate_to(s.prog.step, s.prog.evaluated)
    restart = f"{resumed.restart.describe()}: " if resumed.restart is not None else ""
    s.logger.log(f"{restart}resumed from step {s.prog.step} ({weights_dir})")
    if resumed.restart is not None:
        s.echo(f"{restart}resuming {s.run_dir} from step {s.prog.step} ({weights_dir})")
    elif resumed.branch:
        s.echo(
            f"continuing {resumed.checkpoint} (step {s.prog.step}) in a new run folder {s.run_dir}; "
            f"{resumed.run_dir} is left as it is"
        )
    else:
        s.echo(f"resuming {s.run_dir} from step {s.prog.step}")
    for note in resumed.change_notes() + ([resumed.note] if resumed.note else []):
        s.logger.log(note.removeprefix("note: "))
        s.echo(note)


def _step_sizes(cfg: Config) -> Optional[Callable[[int], tuple[int, int]]]:
    """Each step's (sequences, window) under the batch-size ramp and the sequence-length warmup;
    None without them (the sampler's fixed shape)."""
    tc = cfg.train
    if not (tc.batch_size_warmup_iters or tc.block_size_warmup_iters):
        return None
    return lambda step: (batch_size_at(step, tc), block_size_at(step, cfg))


def _weight_ema(s: Setup, resumed: Optional[Resumed]) -> Optional[WeightEMA]:
    """The moving average of the weights (``train.ema_decay``; None without), from the resumed
    checkpoint's ``ema.safetensors``, or the weights themselves where there is none."""
    tc = s.cfg.train
    if tc.ema_decay is None:
        return None
    ema = WeightEMA(s.model, tc.ema_decay, tc.ema_start)
    saved = read_ema(resumed.checkpoint, s.model) if resumed is not None else None
    if saved is not None:
        ema.load_state_dict(saved)
    elif resumed is not None:
        note = (
            f"note: {resumed.checkpoint} holds no EMA weights (trained without train.ema_decay); "
            f"the EMA starts from its weights at step {s.prog.step}"
        )
        s.echo(note)
        s.logger.log(note.removeprefix("note: "))
    return ema


def _announce(s: Setup, data, dtype: torch.dtype) -> None:
    """The run's header in train.log, and one line for the user."""
    tc, mc, d = s.cfg.train, s.cfg.model, s.dist
    n_params = s.model.num_params()
    dtype_name = str(dtype).removeprefix("torch.")
    s.logger.log(f"run folder {s.run_dir}")
    s.logger.log(
        f"device {s.device} x {d.world} process(es), dtype {dtype_name}, {n_params:,} parameters, "
        f"vocab {mc.vocab_size} ({s.tok.kind})"
    )
    s.logger.log(
        f"global batch {tc.batch_size * tc.grad_accum_steps * d.world} sequences = batch {tc.batch_size} "
        f"x accum {tc.grad_accum_steps} x world {d.world}; {s.tokens_per_step:,} tokens per step"
    )
    if tc.batch_size_warmup_iters:
        s.logger.log(
            f"batch-size ramp: {ramp_start(tc)} to {tc.batch_size} sequences per micro-batch, "
            f"linearly over {tc.batch_size_warmup_iters:,} steps"
        )
    if tc.block_size_warmup_iters:
        s.logger.log(
            f"sequence-length warmup: windows of {tc.block_size_warmup_multiple} to "
            f"{mc.block_size} tokens, in steps of {tc.block_size_warmup_multiple}, over "
            f"{tc.block_size_warmup_iters:,} steps (evals use {mc.block_size})"
        )
    if tc.ema_decay is not None:
        s.logger.log(
            f"weight EMA: decay {tc.ema_decay:g} from step {tc.ema_start}; evals and samples use "
            "the EMA weights"
        )
    s.logger.log(f"data {data.directory}: {len(data.train):,} train / {len(data.val):,} val tokens")
    s.echo(
        f"training {n_params / 1e6:.2f}M parameters on {s.device}"
        f"{f' x {d.world} processes' if d.enabled else ''} ({dtype_name}); run folder {s.run_dir}"
    )
