"""The training loop: data, AdamW, schedule, evaluation, checkpoints, logging.

The loop body stays short; each component decides when it acts (:func:`lr_at`,
:func:`should_eval`, :class:`~minigpt_cli.metrics.RunLogger`). A run can be
interrupted (SIGINT/SIGTERM save ``checkpoints/last``, also in the middle of
an eval) and resumed with the same losses at every later step: the trainer
state holds the optimizer, every RNG, the data samplers' positions, the best
val loss and the early-stopping counter. One process at a time trains in a
run folder (:class:`RunLock`). Under ``torchrun`` the model is wrapped in
DistributedDataParallel and only rank 0 writes files.
"""

from __future__ import annotations

import errno
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

try:  # POSIX; elsewhere run folders are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

from . import checkpoint
from .config import Config, TrainConfig
from .data import (BatchSampler, PreparedData, check_split_sizes, ensure_corpus, ensure_tokenizer, eval_seed,
                   prepare)
from .device import CpuThreads, resolve_device, resolve_dtype, tune_runtime
from .errors import Interrupted, MinigptError
from .fileio import atomic_write_text
from .generate import generate_tokens
from .metrics import RunLogger
from .model import GPT, linear_kernel
from .paths import dataset_dir
from .tokenizer import Tokenizer

#: Consecutive non-finite losses after which a run stops.
MAX_NONFINITE = 5


# ----------------------------------------------------------------------------- schedule


def lr_at(step: int, tc: TrainConfig, n_embd: int = 512) -> float:
    """Learning rate for optimizer step ``step`` (0-based).

    Linear warmup reaching ``learning_rate`` after ``warmup_iters`` steps and
    above zero on the first (nanoGPT: lr·(step+1)/(warmup+1)), then

    - cosine: half a cosine from learning_rate down to min_lr at lr_decay_iters
      (Loshchilov & Hutter 2017, SGDR, without restarts);
    - linear: a straight line down to min_lr;
    - constant: learning_rate;
    - inverse_sqrt: d^-0.5 · min(s^-0.5, s · warmup^-1.5) with s = step+1,
      scaled by learning_rate (Vaswani et al. 2017 §5.3; learning_rate 1 gives
      the paper's values).
    """
    if tc.lr_schedule == "inverse_sqrt":
        s = step + 1
        w = max(tc.warmup_iters, 1)
        return tc.learning_rate * n_embd ** -0.5 * min(s ** -0.5, s * w ** -1.5)
    if step < tc.warmup_iters:
        return tc.learning_rate * (step + 1) / (tc.warmup_iters + 1)
    if tc.lr_schedule == "constant":
        return tc.learning_rate
    decay_iters = tc.lr_decay_iters or tc.max_iters
    if step >= decay_iters:
        return tc.min_lr
    span = max(decay_iters - tc.warmup_iters, 1)
    ratio = (step - tc.warmup_iters) / span
    if tc.lr_schedule == "linear":
        coeff = 1.0 - ratio
    else:
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return tc.min_lr + coeff * (tc.learning_rate - tc.min_lr)


def should_eval(step: int, tc: TrainConfig) -> bool:
    """Evaluate before the first step, every ``eval_interval`` steps, and after the last."""
    return step % tc.eval_interval == 0 or step == tc.max_iters


def make_optimizer(model: torch.nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) with weight decay on matrices only (nanoGPT).

    Biases, norm gains and other vectors get no decay. The fused
    implementation where the device has one, else foreach (multi-tensor).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    try:  # one fused kernel per step (CUDA; CPU since torch 2.4): measured 7% faster on 2 CPU cores
        return torch.optim.AdamW(groups, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2), foreach=True)


def describe_derived(cfg: Config) -> list[str]:
    """The values the config leaves to be derived (null keys), as ``--dry-run`` shows them.

    ``model.vocab_size`` comes from the tokenizer file when it exists already
    (it is trained at the first ``train`` otherwise); with it, the parameter
    count and the memory estimate of :func:`check_memory` follow.
    """
    from . import params as P
    from .paths import default_tokenizer_path

    mc, tc = cfg.model, cfg.tokenizer
    lines = ["derived values (\"(set)\": given in the config):"]
    vocab = mc.vocab_size
    if vocab is None:
        path = (Path(tc.path) if tc.path else
                default_tokenizer_path(cfg.data.data_dir, cfg.data.dataset, tc.kind, tc.vocab_size, tc.special_tokens))
        if path.is_file():
            from .tokenizer import load_tokenizer

            try:
                vocab = load_tokenizer(path).vocab_size
                lines.append(f"  model.vocab_size      {vocab} (from {path})")
            except MinigptError as exc:
                lines.append(f"  model.vocab_size      unknown: {exc}")
        else:
            lines.append(f"  model.vocab_size      from the tokenizer, trained into {path} at the first run")
    lines.append(f"  model.d_ff            {mc.ffn_hidden}" + (" (set)" if mc.d_ff is not None else ""))
    lines.append(f"  model.n_kv_head       {mc.kv_heads}" + (" (set)" if mc.n_kv_head is not None else ""))
    lines.append(f"  head size             {mc.head_dim}")
    lines.append(f"  sample.window_stride  {cfg.sample.window_stride or max(1, mc.block_size // 4)}"
                 + (" (set)" if cfg.sample.window_stride is not None else ""))
    lines.append(f"  train.lr_decay_iters  {cfg.train.lr_decay_iters or cfg.train.max_iters}"
                 + (" (set)" if cfg.train.lr_decay_iters is not None else ""))
    if vocab is not None:
        mcv = mc.model_copy(update={"vocab_size": vocab})
        dtype = "float32" if cfg.dtype == "auto" else cfg.dtype
        need, _ = training_memory(mcv, dtype, cfg.train.batch_size)
        lines.append(f"  parameters            {P.count(mcv).total:,}")
        lines.append(f"  memory to train       about {P.human_bytes(need)} ({dtype}, batch {cfg.train.batch_size})")
    return lines


def describe_schedule(cfg: Config, points: int = 8) -> str:
    """The resolved config, the values it leaves to be derived, and the learning rate at a few steps (for ``--dry-run``)."""
    tc = cfg.train
    steps = sorted({0, max(tc.warmup_iters - 1, 0), tc.warmup_iters, tc.max_iters // 4, tc.max_iters // 2,
                    3 * tc.max_iters // 4, max(tc.max_iters - 1, 0)})
    steps = [s for s in steps if 0 <= s < max(tc.max_iters, 1)][:points]
    lines = [cfg.to_yaml().rstrip(), "", *describe_derived(cfg), "",
             f"learning rate ({tc.lr_schedule}, warmup {tc.warmup_iters}):"]
    lines += [f"  step {s:>7,}: {lr_at(s, tc, cfg.model.n_embd):.3e}" for s in steps]
    return "\n".join(lines)


def describe_resume(cfg: Config, resume: str) -> list[str]:
    """What ``--resume`` would do, for ``--dry-run``: the run, its step, and the schedule note if any.

    Raises:
        MinigptError: as :func:`train` would: no such run, or one with another model, tokenizer or data.
    """
    run_dir = find_resume_dir(cfg, resume)
    if run_dir is None:
        return [f"--resume auto: no run named {cfg.name!r} under {cfg.train.out_dir}/ yet; a new run would start"]
    last = checkpoint.resolve(run_dir / "checkpoints" / "last")
    saved = checkpoint.saved_config(last)
    _check_resume_config(cfg, saved)
    state = checkpoint.load_trainer_state(last)
    step, n = state["step"], cfg.train.max_iters
    if step > n or (step == n and state["evaluated"]):
        return [f"--resume: {run_dir} is at step {step}, train.max_iters is {n}: nothing would be trained"]
    lines = [f"--resume: would continue {run_dir} from step {step} to train.max_iters {n}"]
    note = schedule_note(cfg, saved, step)
    return lines + ([note] if note else [])


# ----------------------------------------------------------------------------- distributed


@dataclass
class Dist:
    """Where this process stands in a torchrun job (world 1 without torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def init_distributed(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the torchrun process group (NCCL on CUDA, gloo on CPU) if launched by torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return Dist(), device
    import torch.distributed as dist

    info = Dist(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]))
    if info.world == 1:
        return info, device
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return info, device


def _all_mean(value: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.enabled:
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= d.world
    return value


def _broadcast(obj: Any, d: Dist) -> Any:
    if not d.enabled:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _barrier(d: Dist) -> None:
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()


def _close_distributed(d: Dist) -> None:
    """Wait for every rank, then leave the process group (a no-op without torchrun)."""
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- run folder


class RunLock:
    """An exclusive ``flock`` on ``runs/<name>/.lock``, held while one process trains in the folder.

    Two processes writing one run folder would interleave metrics and
    checkpoints; the second one is refused instead. The lock goes with the
    process (the kernel drops it on exit, SIGKILL included), so a crashed run
    never leaves its folder locked. The file holds the owner's pid, for the
    message, and is left in place (removing it would race with a new owner).
    """

    FILE = ".lock"

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / self.FILE
        self._fd: Optional[int] = None

    def acquire(self, fix: str) -> "RunLock":
        """Take the lock without waiting.

        Args:
            fix: what the user should do when another process holds it.

        Raises:
            MinigptError: another process holds it (the message names its pid
                and ``fix``), or the lock file cannot be created.
        """
        if fcntl is None:
            return self
        not_a_file = (f"{self.path} is not a regular file (a link, folder or device where minigpt keeps its "
                      f"lock); remove it and try again")
        try:
            # O_NOFOLLOW: a link planted as .lock must not make us truncate its target;
            # O_NONBLOCK: a FIFO there must not hang the open.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise MinigptError(not_a_file) from None
            raise MinigptError(
                f"cannot create the lock file {str(self.path)!r} ({exc.strerror}); "
                "check the run folder's permissions"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise MinigptError(not_a_file)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            try:
                pid = self.path.read_text(encoding="utf-8").strip() or "unknown"
            except OSError:
                pid = "unknown"
            raise MinigptError(f"{self.run_dir} is in use by another minigpt train (pid {pid}); {fix}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (closing the file drops it); a second call does nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _has_checkpoint(run_dir: Path) -> bool:
    for which in ("last", "best"):
        try:
            checkpoint.resolve(run_dir / "checkpoints" / which)
            return True
        except MinigptError:
            pass
    return False


@dataclass
class RunFolder:
    """The run folder this process trains in, its lock, and whether this process made it."""

    path: Path
    lock: RunLock
    created: bool = False  # made by this process
    was_empty: bool = False  # existed and was empty (a --run-name folder the user made)

    def discard_if_unsaved(self) -> None:
        """After a failure: undo a new run folder that never got a checkpoint.

        A folder this process created is removed; one that was empty before is
        emptied again. A folder with a checkpoint, or one that held anything
        before, is left alone.
        """
        if not (self.created or self.was_empty) or _has_checkpoint(self.path):
            return
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for entry in self.path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def new_run_dir(cfg: Config, run_name: Optional[str]) -> RunFolder:
    """Create and lock ``runs/<run_name>``, or ``runs/<name>-<YYYYmmdd-HHMMSS>``.

    Race-free: the folder is made with ``mkdir(exist_ok=False)``, and an
    unnamed run that meets a folder of the same name (two runs started in the
    same second) takes the next free one, ``<name>-<date>-<time>-2``, ``-3``, ...
    A folder named by ``--run-name`` may already exist only if it is empty.
    The caller releases the lock.

    Raises:
        MinigptError: a bad --run-name, a folder that already holds something,
            or one another process is training in.
    """
    root = Path(cfg.train.out_dir)
    if run_name is not None and (not re.fullmatch(r"[A-Za-z0-9._-]+", run_name) or run_name in (".", "..")):
        raise MinigptError(f"--run-name {run_name!r}: use letters, digits, '.', '_' and '-' only "
                           "(a plain folder name that needs no quoting), e.g. --run-name my-run")
    root.mkdir(parents=True, exist_ok=True)
    if run_name is None:
        base = f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        for n in range(1, 1000):
            run_dir = root / (base if n == 1 else f"{base}-{n}")
            try:
                run_dir.mkdir()
            except FileExistsError:
                continue
            return RunFolder(run_dir, RunLock(run_dir).acquire("pass --run-name"), created=True)
        raise MinigptError(f"999 run folders named {base}* already exist under {root}; pass --run-name")
    run_dir = root / run_name
    try:
        run_dir.mkdir()
        created = True
    except FileExistsError:
        created = False
        if not run_dir.is_dir():
            raise MinigptError(f"{str(run_dir)!r} exists and is not a folder; pick another --run-name") from None

    def refuse() -> MinigptError:
        if _has_checkpoint(run_dir):
            return MinigptError(
                f"run folder {str(run_dir)!r} already exists; pick another --run-name, "
                f"or continue it with --resume {run_dir}"
            )
        return MinigptError(
            f"run folder {str(run_dir)!r} already exists and holds no checkpoint (a run that stopped "
            f"before its first save); delete the folder or pick another --run-name"
        )

    def occupied() -> bool:
        return any(p.name != RunLock.FILE for p in run_dir.iterdir())

    if not created and occupied() and not (run_dir / RunLock.FILE).exists():
        raise refuse()  # an old run: no lock file to create in it
    lock = RunLock(run_dir).acquire("wait for it or pass another --run-name")
    if not created and occupied():
        lock.release()
        raise refuse()
    return RunFolder(run_dir, lock, created=created, was_empty=not created)


def find_resume_dir(cfg: Config, resume: str) -> Optional[Path]:
    """The run folder ``--resume`` names: ``auto`` (the newest run of this config's name) or a path.

    Returns None for ``auto`` when no run of that name has a checkpoint yet.

    Raises:
        MinigptError: a given path has no resumable checkpoint.
    """
    if resume != "auto":
        run_dir = Path(resume)
        last = run_dir / "checkpoints" / "last"
        if not run_dir.is_dir():
            raise MinigptError(f"--resume {resume}: no such run folder")
        checkpoint.resolve(last)  # raises a clear error when there is none
        return run_dir
    root = Path(cfg.train.out_dir)
    found = []
    if root.is_dir():
        for run in root.iterdir():
            ckpt = run / "checkpoints" / "last"
            try:
                ckpt = checkpoint.resolve(ckpt)
            except MinigptError:
                continue
            try:
                name = json.loads((ckpt / checkpoint.META).read_text()).get("name")
            except (OSError, json.JSONDecodeError):
                name = None
            if name == cfg.name:
                found.append(((ckpt / checkpoint.WEIGHTS).stat().st_mtime, run))
    return max(found)[1] if found else None


def git_commit() -> Optional[str]:
    """The project's git commit, if the package runs from a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
        return (out.stdout.strip() or None) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


#: Said when compile: true takes the training step's linear layers off oneDNN (torch.compile keeps its own kernels).
COMPILE_ONEDNN_NOTE = ("note: compile: true keeps PyTorch's MKL matrix products; without it the linear layers run on "
                       "oneDNN, 1.5x faster on the CPU of BENCHMARKS.md (compare with minigpt bench and compile=false)")


def env_info(device: torch.device, dtype: torch.dtype, d: Dist, linear_kernel: str = "torch.mm") -> dict:
    """Versions, device, git commit and the linear layers' kernel (:func:`~minigpt_cli.model.linear_kernel`
    for the training step), for env.json."""
    import importlib.metadata as md

    def ver(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "minigpt": ver("minigpt-cli"),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "world_size": d.world,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # The kernel behind the training step's linear layers (model.linear); results differ by float32 rounding.
        "linear_kernel": linear_kernel,
        "cuda": torch.version.cuda,
        "git_commit": git_commit(),
        "argv": sys.argv,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# ----------------------------------------------------------------------------- RNG state


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """Every RNG state as tensors and plain numbers (loadable with ``weights_only``)."""
    py = random.getstate()
    npy = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [npy[0], torch.from_numpy(npy[1].astype(np.int64)), int(npy[2]), int(npy[3]), float(npy[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npy = state["numpy"]
    np.random.set_state((npy[0], npy[1].numpy().astype(np.uint32), npy[2], npy[3], npy[4]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------- steps


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, samplers: dict[str, BatchSampler], iters: int, autocast,
                  d: Dist = Dist(), should_stop: Optional[Callable[[], bool]] = None) -> Optional[dict[str, float]]:
    """Mean loss over ``iters`` batches of each split, in eval mode, without gradients.

    ``should_stop`` is asked before every batch (a long eval must not hold up a
    Ctrl-C); when it answers True the evaluation ends there and None is
    returned, the samplers advanced part-way (the trainer reseeds them before
    every eval). Under DDP ``should_stop`` must give every rank the same answer.
    """
    model.eval()
    out = {}
    try:
        for split, sampler in samplers.items():
            losses = torch.zeros(iters, device=sampler.device)
            for i in range(iters):
                if should_stop is not None and should_stop():
                    return None
                x, y = sampler.next()
                with autocast:
                    _, loss = model(x, y)
                losses[i] = loss.float()
            out[split] = _all_mean(losses.mean(), d).item()
    finally:
        model.train()
    return out


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator,
               accum: int, autocast, scaler: torch.amp.GradScaler, grad_clip: float,
               params: list[torch.Tensor]) -> tuple[torch.Tensor, bool]:
    """One optimizer step over ``accum`` micro-batches; returns (mean loss, whether it was applied).

    The loss is averaged over micro-steps (each micro-batch loss divided by
    ``accum``), so 4 micro-batches of 8 give the update of one batch of 32.
    Under DDP, gradients are synchronised on the last micro-step only. A
    non-finite loss or gradient skips the update (gradients are dropped).
    """
    loss_sum = None
    for micro in range(accum):
        x, y = next(batches)
        sync = nullcontext()
        if hasattr(model, "no_sync") and micro < accum - 1:
            sync = model.no_sync()
        with sync:
            with autocast:
                _, loss = model(x, y)
                loss = loss / accum
            scaler.scale(loss).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    scaler.unscale_(optimizer)  # gradients unscaled before clipping (a no-op without a scaler)
    finite = bool(torch.isfinite(loss_sum))  # one host sync per optimizer step, none per micro-step
    if finite and grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
        finite = bool(torch.isfinite(norm))
    if finite:
        scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, finite


def sample_text(model: GPT, tok: Tokenizer, device: torch.device, n_tokens: int, seed: int,
                window_stride: Optional[int] = None, should_stop: Optional[Callable[[], bool]] = None) -> str:
    """A short sample from a newline prompt, for samples.txt.

    ``should_stop`` is asked after every token; when it answers True the
    sample ends there (a Ctrl-C must not wait for a long sample).
    """
    model.eval()
    try:
        prompt = tok.encode("\n") or [0]
    except MinigptError:
        prompt = [0]
    idx = torch.tensor([prompt], dtype=torch.long, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    ids = []
    try:
        for t in generate_tokens(model, idx, n_tokens, temperature=0.8, top_k=200, generator=g,
                                 vocab_limit=tok.vocab_size, window_stride=window_stride):
            ids.append(int(t[0]))
            if should_stop is not None and should_stop():
                break
    except MinigptError as exc:  # NaN output: the loss says so too, and the run decides what to do
        return f"(no sample: {exc})"
    finally:
        model.train()
    return tok.decode(prompt + ids)


class _StopFlag:
    """SIGINT/SIGTERM/SIGHUP set a flag the loop checks between steps and eval batches; a second Ctrl-C aborts at once.

    The abort is a KeyboardInterrupt raised wherever the program is; the
    trainer turns it into a one-line message (nothing saved, where the last
    checkpoint is). A repeated SIGTERM only sets the flag again.
    """

    def __init__(self):
        self.signal: Optional[str] = None
        self.signum: int = signal.SIGINT
        #: Builds the error that replaces the KeyboardInterrupt of a second Ctrl-C.
        self.on_abort: Optional[Callable[[], Exception]] = None
        self._old: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is None:
                continue
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. inside some test runners)
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        self.signum = int(signum)

    def __exit__(self, exc_type, exc, tb):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        if exc_type is KeyboardInterrupt and self.signal is not None and self.on_abort is not None:
            raise self.on_abort() from None
        return False


# ----------------------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    train_loss: Optional[float]
    val_loss: Optional[float]
    best_val_loss: Optional[float]
    stopped_early: bool = False
    already_done: bool = False  # a resumed run that had reached max_iters: nothing trained


@dataclass
class _Progress:
    """What the trainer state carries besides optimizer and RNG."""

    step: int = 0
    evaluated: bool = False  # whether the eval at `step` already ran
    best_val: float = math.inf
    bad_evals: int = 0  # evals in a row without a new best (early stopping)
    last: dict[str, float] = field(default_factory=dict)  # the latest eval: losses and eval_step


def _check_resume_config(cfg: Config, saved: Config) -> None:
    """Refuse to resume with another model, tokenizer or data than the run's own.

    Other keys may change. The ``train`` section in particular: a larger
    ``max_iters`` trains a finished run further; see :func:`schedule_note`
    for what that does to the learning rate.

    Raises:
        MinigptError: a ``model``, ``tokenizer`` or ``data`` key differs; names the key.
    """
    for section in ("model", "tokenizer", "data"):
        a, b = getattr(cfg, section).model_dump(), getattr(saved, section).model_dump()
        if section == "model":
            a["vocab_size"] = b["vocab_size"] = None
        diff = [k for k in a if a[k] != b.get(k)]
        if diff:
            raise MinigptError(
                f"--resume: {section}.{diff[0]} differs from the run's config.yaml "
                f"({a[diff[0]]!r} vs {b.get(diff[0])!r}); resume with the run's own config"
            )


#: The ``train`` keys that shape the learning-rate schedule (:func:`lr_at`).
SCHEDULE_KEYS = ("max_iters", "learning_rate", "min_lr", "warmup_iters", "lr_decay_iters", "lr_schedule")


def schedule_note(cfg: Config, saved: Config, step: int) -> Optional[str]:
    """The note a resume prints when the schedule keys differ from the checkpoint's config, else None.

    Resuming with other schedule values is allowed (raising ``max_iters`` is
    how a finished run trains further), but the learning rate from ``step`` on
    follows the new values, so with the default ``lr_decay_iters: null`` the
    cosine stretches to the new ``max_iters`` and the lr jumps at the resume
    step. The note names the changed keys and the lr before and after.
    """
    old, new = saved.train, cfg.train
    changed = [k for k in SCHEDULE_KEYS if getattr(old, k) != getattr(new, k)]
    if not changed:
        return None
    what = ", ".join(f"train.{k} {getattr(old, k)} -> {getattr(new, k)}" for k in changed)
    lr_old, lr_new = lr_at(step, old, cfg.model.n_embd), lr_at(step, new, cfg.model.n_embd)
    jump = "unchanged" if math.isclose(lr_old, lr_new, rel_tol=1e-9) else f"was {lr_old:.3e}"
    return (f"note: resuming with {what}; the learning-rate schedule follows the new values "
            f"from here: lr {lr_new:.3e} at step {step} ({jump})")


class _Claim:
    """The run folder :func:`train` has locked, so the caller can undo and unlock it after a failure."""

    folder: Optional[RunFolder] = None


def train(cfg: Config, run_name: Optional[str] = None, echo: Callable[[str], None] = print,
          progress: Optional[bool] = None, resume: Optional[str] = None,
          config_path: Optional[str | Path] = None, overrides: Sequence[str] = ()) -> TrainResult:
    """Train a GPT as ``cfg`` says and leave a run folder (DESIGN §4).

    The run folder is locked for the whole run (:class:`RunLock`). A new run
    that fails before its first checkpoint removes the folder it created.

    Resuming (``resume``) keeps model, tokenizer and data fixed but accepts
    other ``train`` values. Changing a schedule key (``max_iters``,
    ``learning_rate``, ``min_lr``, ``warmup_iters``, ``lr_decay_iters``,
    ``lr_schedule``) is allowed, with a note: the learning rate from the resume
    step on follows the new values (:func:`schedule_note`). A run that already
    reached ``max_iters`` trains nothing and returns ``already_done``.

    Args:
        cfg: the validated config.
        run_name: folder name under ``train.out_dir``; default ``<name>-<timestamp>``.
        echo: where status lines go (the CLI prints them to stderr).
        progress: show a tqdm bar; None: only when stderr is a terminal.
        resume: ``auto`` (the newest run named ``cfg.name``) or a run folder to continue.
        config_path, overrides: the config file and ``--set`` values the user
            gave, for the "continue with: minigpt train ..." hint.

    Returns:
        The run folder, the final step and losses.

    Raises:
        MinigptError: device not available, data cannot be fetched, run exists
            or is in use, checkpoint unusable, a model too large for the free
            memory (estimated up front, or the allocator failing), or training
            diverged.
        Interrupted: stopped by SIGINT/SIGTERM (after saving ``checkpoints/last``),
            or aborted by a second Ctrl-C (without saving).
    """
    claim = _Claim()
    try:
        try:
            return _train(cfg, run_name, echo, progress, resume, config_path, overrides, claim)
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
    except BaseException:
        if claim.folder is not None:
            claim.folder.discard_if_unsaved()
        raise
    finally:
        if claim.folder is not None:
            claim.folder.lock.release()


def available_memory(device: torch.device) -> Optional[int]:
    """Bytes free for a new run on ``device``: CUDA's free memory, the CPU's ``MemAvailable``; None if unknown."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except RuntimeError:
            return None
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
    return None


def training_memory(model_cfg, dtype: str, batch_size: int) -> tuple[int, dict[str, Any]]:
    """Bytes to train ``model_cfg`` at ``batch_size`` × block_size: model states, activations with fused
    attention and the logits (:func:`minigpt_cli.params.memory`'s estimate), and that estimate."""
    from . import params as P

    mem = P.memory(model_cfg, dtype, batch_size, model_cfg.block_size)
    return mem["model_states"] + mem["activations_estimate_fused"] + mem["logits"], mem


def check_memory(cfg: Config, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, before any tensor exists, a model that cannot fit in the device's free memory.

    The need is :func:`minigpt_cli.params.memory`'s estimate (the accounting
    ``count-params`` prints): weights, gradients and AdamW moments, 16 bytes a
    parameter (ZeRO §3.1), plus activations with fused attention and the
    logits for one micro-batch. Only a model that needs more than all the
    free memory is refused: the estimate leaves out allocator slack, so a
    run that passes can still run out.

    Raises:
        MinigptError: the estimate exceeds the free memory; the message gives both.
    """
    from . import params as P

    free = available_memory(device)
    if free is None:
        return
    need, mem = training_memory(cfg.model, str(dtype).removeprefix("torch."), cfg.train.batch_size)
    if need > free:
        raise MinigptError(
            f"this model needs about {P.human_bytes(need)} to train ({P.human_bytes(mem['model_states'])} for "
            f"weights, gradients and AdamW moments of {P.count(cfg.model).total:,} parameters, "
            f"{P.human_bytes(need - mem['model_states'])} for activations at batch {cfg.train.batch_size} x "
            f"{cfg.model.block_size}) but {device.type} has {P.human_bytes(free)} free; make model.n_layer, "
            f"n_embd, block_size or train.batch_size smaller (minigpt count-params --config CONFIG shows the "
            f"accounting)"
        )


def _train(cfg: Config, run_name: Optional[str], echo: Callable[[str], None], progress: Optional[bool],
           resume: Optional[str], config_path: Optional[str | Path], overrides: Sequence[str],
           claim: _Claim) -> TrainResult:
    """The body of :func:`train`; registers the run folder it locks in ``claim``."""
    from tqdm.auto import tqdm

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if device.type == "cpu" and dtype == torch.float16:
        raise MinigptError("dtype: float16 needs a GPU; use dtype: auto, float32 or bfloat16 on the CPU")
    d, device = init_distributed(device)
    if not d.main:
        echo = lambda message: None  # noqa: E731 - only rank 0 talks
        progress = False
    tc = cfg.train

    if tc.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MinigptError(
                "train.tensorboard: true needs the tensorboard package; pip install tensorboard, "
                "or set train.tensorboard: false"
            ) from None

    # Data: rank 0 downloads, trains the tokenizer and prepares token files; the others wait.
    if d.main:
        corpus = ensure_corpus(cfg, echo, progress=progress)
        tok, _ = ensure_tokenizer(cfg, corpus, echo)
        prepare(corpus, tok, dataset_dir(cfg.data.data_dir, cfg.data.dataset), cfg.data.val_fraction, log=echo)
    _barrier(d)
    corpus = ensure_corpus(cfg, echo)
    tok, _ = ensure_tokenizer(cfg, corpus, echo)
    data: PreparedData = prepare(corpus, tok, dataset_dir(cfg.data.data_dir, cfg.data.dataset),
                                 cfg.data.val_fraction, log=echo)
    check_split_sizes(data, cfg.model.block_size)
    mc = cfg.model
    if mc.vocab_size is None:
        mc = mc.model_copy(update={"vocab_size": tok.vocab_size})
    elif mc.vocab_size < tok.vocab_size:
        raise MinigptError(
            f"model.vocab_size ({mc.vocab_size}) is smaller than the tokenizer's {tok.vocab_size} entries; "
            "set model.vocab_size: null to take it from the tokenizer"
        )
    cfg = cfg.model_copy(update={"model": mc})
    check_memory(cfg, device, dtype)

    # The run folder: new, or the one being resumed.
    state: Optional[dict] = None
    run_dir: Optional[Path] = None
    if resume is not None:
        run_dir = find_resume_dir(cfg, resume)
        if run_dir is None:
            echo(f"--resume auto: no run named {cfg.name!r} under {tc.out_dir}/ yet; starting a new one")
    swept: list[Path] = []
    note: Optional[str] = None
    if run_dir is not None:
        if d.main:
            claim.folder = RunFolder(run_dir, RunLock(run_dir).acquire("wait for it to finish before resuming"))
            # Safe under the lock: no other process is saving here.
            swept = checkpoint.sweep_stale_temps(run_dir / "checkpoints")
        saved = checkpoint.saved_config(run_dir / "checkpoints" / "last")
        _check_resume_config(cfg, saved)
        from .tokenizer import load_run_tokenizer

        run_tok = load_run_tokenizer(run_dir, saved)
        if run_tok.fingerprint() != tok.fingerprint():
            raise MinigptError(
                f"--resume: the tokenizer file the config names differs from {run_dir / 'tokenizer.json'}; "
                "point tokenizer.path at the run's tokenizer.json"
            )
        state = checkpoint.load_trainer_state(run_dir / "checkpoints" / "last")
        if state["step"] > tc.max_iters or (state["step"] == tc.max_iters and state["evaluated"]):
            try:  # the losses of the run's last eval, for the result
                meta = json.loads((checkpoint.resolve(run_dir / "checkpoints" / "last") / checkpoint.META).read_text())
            except (OSError, json.JSONDecodeError):
                meta = {}
            _close_distributed(d)
            best = state["best_val_loss"]
            return TrainResult(run_dir, state["step"], meta.get("train_loss"), meta.get("val_loss"),
                               best if math.isfinite(best) else None, already_done=True)
        note = schedule_note(cfg, saved, state["step"])
    elif d.main:
        claim.folder = new_run_dir(cfg, run_name)
        run_dir = claim.folder.path
    run_dir = Path(_broadcast(str(run_dir), d))

    seed_everything(cfg.seed)
    model = GPT(mc).to(device)
    eager_kernel = linear_kernel(model, tc.batch_size * mc.block_size, device, dtype)
    kernel = "torch.mm" if cfg.compile else eager_kernel  # torch.compile keeps PyTorch's kernels

    logger = RunLogger(run_dir, echo=None, enabled=d.main)
    if d.main:
        # On resume too: the run's config.yaml follows the train values it now runs with.
        atomic_write_text(run_dir / "config.yaml", cfg.to_yaml())
        if state is None:
            tok.save(run_dir / "tokenizer.json")
        swept += logger.sweep_temps()
    env = env_info(device, dtype, d, kernel)
    if state is not None and d.main:  # a resumed run: the sessions before this one are kept, oldest first
        try:
            before = json.loads((run_dir / "env.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = None
        if isinstance(before, dict):
            earlier = before.pop("earlier_sessions", [])
            env["earlier_sessions"] = (earlier if isinstance(earlier, list) else []) + [before]

    def write_env() -> None:
        if d.main:
            atomic_write_text(run_dir / "env.json", json.dumps(env, indent=1))

    write_env()

    optimizer = make_optimizer(model, tc, device)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda" and dtype == torch.float16)
    autocast = torch.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32 else nullcontext()
    tune_runtime(device)

    bar = None  # the progress bar, once training starts

    def say(line: str) -> None:
        """A line for the user: above the progress bar while one is shown."""
        if bar is not None and not bar.disable:
            bar.write(line, file=sys.stderr)
        else:
            echo(line)

    def thread_note(message: str) -> None:
        say(message)
        logger.log(message.removeprefix("note: "))
        # env.json's torch_threads is the count at the start; changes are listed after it.
        env.setdefault("torch_threads_changes", []).append({"step": prog.step, "threads": torch.get_num_threads()})
        write_env()

    cpu_threads = CpuThreads(device, echo=thread_note)

    def sampler(tokens, offset):
        return BatchSampler(tokens, mc.block_size, tc.batch_size, cfg.seed + offset, device,
                            rank=d.rank, world=d.world)

    train_sampler = sampler(data.train, 1)
    eval_samplers = {"train": sampler(data.train, 2), "val": sampler(data.val, 3)}
    prog = _Progress()

    if state is not None:
        weights_dir = checkpoint.resolve(run_dir / "checkpoints" / "last")
        checkpoint.load_weights_into(model, weights_dir)
        optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        restore_rng(state["rng"])
        train_sampler.set_state(state["data_rng"]["train"])
        prog = _Progress(step=state["step"], evaluated=state["evaluated"], best_val=state["best_val_loss"],
                         bad_evals=state["bad_evals"])
        logger.truncate_to(prog.step, prog.evaluated)
        logger.log(f"resumed from step {prog.step} ({weights_dir})")
        echo(f"resuming {run_dir} from step {prog.step}")
        if note:
            logger.log(note.removeprefix("note: "))
            echo(note)
    if swept:
        logger.log(f"removed {len(swept)} temporary file(s) left by a killed process: "
                   f"{', '.join(p.name for p in swept)}")

    train_model: torch.nn.Module = model
    if cfg.compile and "oneDNN" in eager_kernel:
        echo(COMPILE_ONEDNN_NOTE)
        logger.log(COMPILE_ONEDNN_NOTE)
    if cfg.compile:
        try:
            train_model = torch.compile(model)
        except Exception as exc:  # platform support varies
            echo(f"warning: torch.compile unavailable ({type(exc).__name__}: {exc}); training without it")
    compile_failed = False
    ddp_ids = [device.index] if device.type == "cuda" else None
    if d.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(train_model, device_ids=ddp_ids)

    tokens_per_step = tc.batch_size * mc.block_size * tc.grad_accum_steps * d.world
    n_params = model.num_params()
    dtype_name = str(dtype).removeprefix("torch.")
    logger.log(f"run folder {run_dir}")
    logger.log(f"device {device} x {d.world} process(es), dtype {dtype_name}, {n_params:,} parameters, "
               f"vocab {mc.vocab_size} ({tok.kind})")
    logger.log(f"global batch {tc.batch_size * tc.grad_accum_steps * d.world} sequences = batch {tc.batch_size} "
               f"x accum {tc.grad_accum_steps} x world {d.world}; {tokens_per_step:,} tokens per step")
    logger.log(f"data {data.directory}: {len(data.train):,} train / {len(data.val):,} val tokens")
    echo(f"training {n_params / 1e6:.2f}M parameters on {device}"
         f"{f' x {d.world} processes' if d.enabled else ''} ({dtype_name}); run folder {run_dir}")

    writer = None
    if tc.tensorboard and d.main:
        writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def save_state() -> dict:
        return {
            "step": prog.step, "evaluated": prog.evaluated, "best_val_loss": prog.best_val,
            "bad_evals": prog.bad_evals, "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else {},
            "rng": capture_rng(),
            "data_rng": {"train": train_sampler.state()},  # eval batches follow the step (eval_seed)
        }

    def save(which: str) -> None:
        if d.main:
            # The tokenizer's fingerprint lets generate tell a swapped tokenizer.json from the run's own.
            meta = {"name": cfg.name, "step": prog.step, "tokenizer_fingerprint": tok.fingerprint(), **prog.last}
            checkpoint.save(run_dir / "checkpoints" / which, model, cfg, save_state(), meta)

    # disable=None: tqdm shows the bar only when stderr is a terminal (no bar flooding a log file).
    bar = tqdm(total=tc.max_iters, initial=prog.step, desc="train", unit="step",
               disable=None if progress is None else not progress, dynamic_ncols=True, file=sys.stderr)
    t0 = time.perf_counter() - logger.elapsed_offset()
    t_log, tokens_since_log = time.perf_counter(), 0
    params = [p for p in model.parameters() if p.requires_grad]
    batches = iter(train_sampler.next, None)
    stopped_early = False
    nonfinite = 0
    stop = _StopFlag()

    def stop_requested() -> bool:
        return bool(_broadcast(stop.signal, d) if d.enabled else stop.signal)

    def resume_command() -> str:
        words = ["minigpt", "train", str(config_path) if config_path is not None else "CONFIG"]
        for item in overrides:
            words += ["--set", item]
        return shlex.join([*words, "--resume", str(run_dir)])

    def abort_error() -> Interrupted:
        bar.close()
        last = run_dir / "checkpoints" / "last"
        try:
            step = json.loads((checkpoint.resolve(last) / checkpoint.META).read_text()).get("step", "?")
        except (MinigptError, OSError, json.JSONDecodeError):
            return Interrupted("aborted by a second Ctrl-C without saving; no checkpoint had been written yet, "
                               "so there is nothing to resume")
        logger.log(f"aborted by a second Ctrl-C at step {prog.step} without saving")
        return Interrupted(f"aborted by a second Ctrl-C without saving; the last checkpoint is {last} "
                           f"(step {step}); continue with: {resume_command()}")

    def evaluate() -> bool:
        """Eval, log, checkpoint; returns True when early stopping says to stop.

        The eval batches depend on the step alone (:func:`~minigpt_cli.data.eval_seed`).
        A stop request cuts the eval short and ``prog.evaluated`` stays False,
        so the resumed run repeats this eval exactly as the uninterrupted one does it.
        """
        nonlocal t_log
        t_eval = time.perf_counter()
        for split, s in eval_samplers.items():
            s.reseed(eval_seed(cfg.seed, split, prog.step))

        # A second bar under the training one while the eval runs (a big eval_iters can take minutes).
        ebar = tqdm(total=len(eval_samplers) * tc.eval_iters, desc=f"eval at step {prog.step}", unit="batch",
                    leave=False, disable=bar.disable, dynamic_ncols=True, file=sys.stderr)
        started = False

        def eval_should_stop() -> bool:
            nonlocal started
            if started:  # asked before every batch: the one before has finished
                ebar.update(1)
            started = True
            cpu_threads.poll()
            return stop_requested()

        try:
            losses = estimate_loss(model, eval_samplers, tc.eval_iters, autocast, d, should_stop=eval_should_stop)
        finally:
            ebar.close()
        if losses is None:
            return False
        # eval_step: a checkpoint saved later (on a stop) carries the losses of this eval, with their step.
        prog.last = {"train_loss": losses["train"], "val_loss": losses["val"], "eval_step": prog.step}
        prog.evaluated = True
        logger.event({"step": prog.step, "event": "eval", "elapsed_s": round(time.perf_counter() - t0, 3),
                      "train_loss": losses["train"], "val_loss": losses["val"]})
        line = f"step {prog.step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
        logger.log(line)
        say(line)
        if writer is not None:
            writer.add_scalars("loss", {"train": losses["train"], "val": losses["val"]}, prog.step)
        if losses["val"] < prog.best_val:
            prog.best_val, prog.bad_evals = losses["val"], 0
            save("best")
        elif prog.step > 0:
            prog.bad_evals += 1
        save("last")
        if d.main and tc.sample_tokens > 0:
            # Only rank 0 samples, so it asks its own flag (stop_requested would wait for the other ranks).
            logger.sample(prog.step, sample_text(model, tok, device, tc.sample_tokens, cfg.seed,
                                                 cfg.sample.window_stride, should_stop=lambda: stop.signal is not None))
            if stop.signal is not None:
                logger.log(f"the step-{prog.step} sample was cut short by {stop.signal}")
        logger.plot()
        t_log += time.perf_counter() - t_eval  # tokens/s counts training time only
        return tc.early_stop_patience is not None and prog.bad_evals >= tc.early_stop_patience

    model.train()
    stop.on_abort = abort_error
    with stop:
        while True:
            if should_eval(prog.step, tc) and not prog.evaluated:
                if evaluate():
                    stopped_early = True
                    logger.log(f"early stopping at step {prog.step}: no better val loss in "
                               f"{prog.bad_evals} evals (best {prog.best_val:.4f})")
                    echo(f"early stopping at step {prog.step} (best val loss {prog.best_val:.4f})")
                    break
            # At max_iters the run ends once its final eval ran (a stop request can cut that eval short).
            if prog.step > tc.max_iters or (prog.step == tc.max_iters and prog.evaluated):
                break
            if stop_requested():
                save("last")
                bar.close()
                logger.log(f"stopped by {stop.signal} at step {prog.step}; saved checkpoints/last")
                raise Interrupted(
                    f"stopped by {stop.signal} at step {prog.step}; saved {run_dir / 'checkpoints' / 'last'}; "
                    f"continue with: {resume_command()}", stop.signum
                )
            lr = lr_at(prog.step, tc, mc.n_embd)
            for group in optimizer.param_groups:
                group["lr"] = lr
            try:
                loss, applied = train_step(train_model, optimizer, batches, tc.grad_accum_steps, autocast,
                                           scaler, tc.grad_clip, params)
            except Exception as exc:
                # torch.compile fails lazily, at the first call; fall back to eager once.
                if not cfg.compile or train_model is model or compile_failed:
                    raise
                compile_failed = True
                echo(f"warning: torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                     "training without it")
                logger.log(f"torch.compile failed ({type(exc).__name__}); training without it")
                optimizer.zero_grad(set_to_none=True)
                train_model = model if not d.enabled else DDP(model, device_ids=ddp_ids)
                env["linear_kernel"] = eager_kernel  # the eager step's kernel, not the compiled one's
                write_env()
                continue
            if not applied:
                nonfinite += 1
                logger.log(f"step {prog.step + 1}: non-finite loss or gradient ({float(loss)}); step skipped")
                if nonfinite >= MAX_NONFINITE:
                    bar.close()
                    if prog.step == 0:  # no update was ever applied: the fresh model itself overflows
                        raise MinigptError(
                            f"the loss was not finite for the first {nonfinite} steps, before any update: the "
                            f"model overflows as initialised; lower model.init_std (now {mc.init_std:g}) or "
                            f"the model's size"
                        )
                    raise MinigptError(
                        f"the loss was not finite for {nonfinite} steps in a row at step {prog.step + 1}; "
                        f"lower train.learning_rate (now {tc.learning_rate:g}) or raise train.warmup_iters; "
                        f"{run_dir / 'checkpoints' / 'last'} holds the last finite state"
                    )
                continue
            nonfinite = 0
            cpu_threads.poll()
            prog.step += 1
            prog.evaluated = False
            tokens_since_log += tokens_per_step
            bar.update(1)
            if prog.step % tc.log_interval == 0 or prog.step == tc.max_iters:
                train_loss = _all_mean(loss, d).item()
                now = time.perf_counter()
                tps = tokens_since_log / max(now - t_log, 1e-9)
                t_log, tokens_since_log = now, 0
                logger.event({"step": prog.step, "event": "train", "elapsed_s": round(now - t0, 3),
                              "loss": train_loss, "lr": lr, "tokens_per_sec": round(tps, 1)})
                if writer is not None:
                    writer.add_scalar("train/loss", train_loss, prog.step)
                    writer.add_scalar("train/lr", lr, prog.step)
                bar.set_postfix(loss=f"{train_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
            if tc.keep_every and prog.step % tc.keep_every == 0:
                save(f"step-{prog.step:07d}")
    bar.close()
    if writer is not None:
        writer.close()
    logger.log(f"done at step {prog.step} in {time.perf_counter() - t0:.1f}s; best val loss {prog.best_val:.4f}")
    _close_distributed(d)
    return TrainResult(run_dir, prog.step, prog.last.get("train_loss"), prog.last.get("val_loss"),
                       prog.best_val if math.isfinite(prog.best_val) else None, stopped_early)
