"""Where a process runs: device and dtype, RNG state for a bit-exact resume, the CPU thread count
(:class:`CpuThreads`) and whether a model fits in the free memory (:func:`check_memory`)."""

from __future__ import annotations

import os
import random
import re
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from ..accounting import params as P
from ..config.schema import DEVICE_PATTERN, FLOAT16_ON_CPU, Config, ModelConfig
from ..errors import MinigptError
from .kernels import check_settings
from .kernels.onednn import multiplies_bfloat16 as cpu_multiplies_bfloat16


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA, then MPS, then CPU; an explicit device must exist.

    Raises:
        MinigptError: the device is not available here, or
            ``MINIGPT_ONEDNN``/``MINIGPT_FAST_DROPOUT`` is neither on nor off
            (:func:`~minigpt_cli.runtime.kernels.check_settings`)."""
    check_settings()  # raises on a value that is neither on nor off
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise MinigptError(f"device {name!r} is not one of auto, cpu, cuda, cuda:N, mps")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise MinigptError(
                f"device: {name} was asked for, but this machine has no CUDA GPU; use device: auto or cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise MinigptError(
                f"device: {name} was asked for, but this machine has {torch.cuda.device_count()} CUDA GPU(s); "
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    if dev.type == "mps" and not (
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    ):
        raise MinigptError(
            "device: mps was asked for, but MPS is not available here; use device: auto or cpu"
        )
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA where supported, else float16 on CUDA, float32 elsewhere. Raises
    MinigptError: float16 on a CPU (autocast has no float16 there)."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    if device.type == "cpu" and dtype == torch.float16:
        raise MinigptError(FLOAT16_ON_CPU)
    return dtype


def emulated_bfloat16_note(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """The note for training in bfloat16 on a CPU without bfloat16 units; None elsewhere."""
    if device.type != "cpu" or dtype != torch.bfloat16 or cpu_multiplies_bfloat16():
        return None
    return (
        f"note: dtype bfloat16 on a CPU without bfloat16 units "
        f"({torch.backends.cpu.get_cpu_capability()}): PyTorch emulates its products, some 25 times "
        "slower than float32 (a step of speedrun-nanogpt-cpu took 2.5 s against 0.1 s on an AMD "
        "Zen 3); set dtype: float32"
    )


# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_runtime(device: torch.device) -> Callable[[], None]:
    """Per-process settings that make training and sampling faster on ``device``; returns a function
    that puts the TF32 flags back.

    CUDA: TF32 matmuls and convolutions (nanoGPT's settings). CPU on glibc: raise malloc's mmap
    threshold to its maximum (32 MiB) and the trim threshold to 1 GiB, so freed activations stay in
    the process instead of being faulted back in, zero-filled, each step (as Intel's PyTorch CPU
    tuning guide's jemalloc preload does)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    def restore() -> None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device.type == "cpu":
        import ctypes
        import platform

        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return restore
        try:
            libc = ctypes.CDLL(
                None
            )  # the process's own symbols, glibc's among them (find_library runs ldconfig)
            libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
            libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
        except (OSError, AttributeError):
            pass
    return restore


def _proc_stat_busy() -> Optional[float]:
    """Seconds of CPU time all processes have spent busy since boot (user, nice, system, irq,
    softirq), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class CpuThreads:
    """PyTorch's intra-op threads on a CPU, matched to the cores other processes leave free.

    PyTorch's OpenMP threads wait for each other by spinning, so one that loses its core to another
    process stalls them all: two trainings side by side on the 2-core machine each ran 70 times
    slower than alone. Every ``interval`` seconds :meth:`poll` measures the cores the rest of the
    machine used (``/proc/stat``'s busy time less this process's, over wall time) and sets
    ``torch.set_num_threads`` to the cores left (at least 1, at most PyTorch's own count); after the
    first decision a change needs two polls that agree. Nothing changes with
    ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` set, off the CPU, or without ``/proc/stat``. ``echo``
    gets a note when the count changes; ``read_busy`` and ``read_own`` are test hooks."""

    def __init__(
        self,
        device: torch.device,
        echo: Callable[[str], None] = lambda m: None,
        interval: float = 2.0,
        read_busy: Callable[[], Optional[float]] = _proc_stat_busy,
        read_own: Callable[[], float] = time.process_time,
    ):
        self.echo = echo
        self.interval = interval
        self._read_busy, self._read_own = read_busy, read_own
        self.max_threads = torch.get_num_threads()
        # The cores this process may run on (sched_getaffinity is Linux's); elsewhere the machine's.
        affinity = getattr(os, "sched_getaffinity", None)
        self.cpus = len(affinity(0)) if affinity is not None else os.cpu_count() or self.max_threads
        user_chose = any(os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))
        self.enabled = device.type == "cpu" and not user_chose and self.max_threads > 1
        self._last = self._sample() if self.enabled else None
        self.enabled = self._last is not None
        #: time.monotonic() when measuring began.
        self.started = time.monotonic()
        self._decided = False
        self._pending: Optional[int] = None
        #: The cores other processes used over the last measurement window.
        self.others: Optional[float] = None

    def _sample(self) -> Optional[tuple[float, float, float]]:
        busy = self._read_busy()
        return None if busy is None else (time.monotonic(), busy, self._read_own())

    def mark(self) -> Optional[tuple[float, float, float]]:
        """A reading to measure a stretch of work from (:meth:`others_since`); None without
        ``/proc/stat``.

        Works whether or not the thread count is adjusted (``OMP_NUM_THREADS`` set).
        """
        return self._sample()

    def others_since(
        self, mark: Optional[tuple[float, float, float]], min_seconds: float = 0.5
    ) -> Optional[float]:
        """The cores other processes kept busy, on average, since ``mark``.

        None if unknown, or if less than ``min_seconds`` passed: ``/proc/stat``
        counts in 10 ms ticks, so one tick of a short window reads as whole cores.
        """
        now = self._sample() if mark is not None else None
        if now is None or now[0] - mark[0] < min_seconds:
            return None
        return max(0.0, ((now[1] - mark[1]) - (now[2] - mark[2])) / (now[0] - mark[0]))

    def restore(self) -> None:
        """Put back the thread count PyTorch had when this object was made."""
        if self.enabled and torch.get_num_threads() != self.max_threads:
            torch.set_num_threads(self.max_threads)

    def poll(self, force: bool = False) -> int:
        """Measure (when ``interval`` has passed, or ``force``) and adjust; returns the thread count
        in use."""
        if not self.enabled:
            return torch.get_num_threads()
        now = time.monotonic()
        if not force and now - self._last[0] < (
            self.interval if self._decided else min(self.interval, 0.25)
        ):
            return torch.get_num_threads()
        sample = self._sample()
        if sample is None:
            return torch.get_num_threads()
        (t0, busy0, own0), (t1, busy1, own1) = self._last, sample
        self._last = sample
        wall = t1 - t0
        if wall <= 0:
            return torch.get_num_threads()
        self.others = max(0.0, ((busy1 - busy0) - (own1 - own0)) / wall)
        target = max(1, min(self.max_threads, int(self.cpus - self.others + 0.35)))
        current = torch.get_num_threads()
        if target == current:
            self._pending = None
        elif not self._decided or self._pending == target:
            torch.set_num_threads(target)
            self._pending = None
            if target < current:
                self.echo(
                    f"note: other processes keep {self.others:.1f} of {self.cpus} CPU cores busy; "
                    f"using {target} thread{'s' if target > 1 else ''} (set OMP_NUM_THREADS to choose)"
                )
            else:
                self.echo(f"note: CPU cores are free again; using {target} threads")
        else:
            self._pending = target
        self._decided = True
        return torch.get_num_threads()


# ----------------------------------------------------------------------------- spec peaks

#: Dense bf16 tensor-core peaks of known CUDA GPUs, in FLOP/s (fp16's are the same), by a pattern of
#: the name torch.cuda.get_device_name gives: NVIDIA's datasheets print these figures doubled "with
#: sparsity" (2:4 structured sparsity, which a dense model never uses), so each is the datasheet's
#: figure halved. The first pattern that matches wins: the more specific names come first ("NVIDIA
#: H100 PCIe" before "NVIDIA H100 80GB HBM3", the SXM board).
GPU_BF16_PEAKS = (
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756e12),
    (r"\bH100\b.*\bNVL\b", "H100 NVL", 835e12),
    (r"\bH100\b", "H100 SXM", 989e12),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", 835e12),
    (r"\bG?H200\b", "H200 SXM", 989e12),  # GH200's GPU is an H200 SXM's
    (r"\bA100\b", "A100", 312e12),
    (r"\bL40S\b", "L40S", 362e12),
    (r"\bL4\b", "L4", 121e12),
    (r"\bA10\b", "A10", 125e12),  # not the A10G, whose clocks are lower
)


def spec_peak(device_name: str, dtype: torch.dtype) -> Optional[tuple[str, float]]:
    """The datasheet's dense peak of a known GPU for ``dtype`` products: (the board, FLOP/s), from
    :data:`GPU_BF16_PEAKS`; None for another GPU, a CPU's name, or float32 (TF32's peak is another
    figure)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    for pattern, board, flops in GPU_BF16_PEAKS:
        if re.search(pattern, device_name):
            return board, flops
    return None


# ----------------------------------------------------------------------------- RNG state


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """Every RNG state as tensors and plain numbers (loadable with ``weights_only``)."""
    py = random.getstate()
    npy = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [
            npy[0],
            torch.from_numpy(npy[1].astype(np.int64)),
            int(npy[2]),
            int(npy[3]),
            float(npy[4]),
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back every RNG state :func:`capture_rng` took."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npy = state["numpy"]
    np.random.set_state((npy[0], npy[1].numpy().astype(np.uint32), npy[2], npy[3], npy[4]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------- memory


def available_memory(device: torch.device) -> Optional[int]:
    """Bytes free for a new run on ``device``: CUDA's free memory, the CPU's ``MemAvailable``; None
    if unknown."""
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


def bytes_to_train(
    model_cfg: ModelConfig, dtype: str, batch_size: int, optimizer: str = "adamw"
) -> tuple[int, dict[str, Any]]:
    """Bytes to train ``model_cfg`` at ``batch_size`` × block_size with ``optimizer``, and the
    estimate they come from: the ``total_estimate`` of :func:`minigpt_cli.accounting.params.memory`,
    the figure ``count-params`` prints."""
    mem = P.memory(model_cfg, dtype, batch_size, model_cfg.block_size, optimizer=optimizer)
    return mem["total_estimate"], mem


def check_memory(cfg: Config, device: torch.device, dtype: torch.dtype, shards: int = 1) -> None:
    """Refuse, before any tensor exists, a model that cannot fit in the device's free memory.

    The need is :func:`minigpt_cli.accounting.params.memory`'s estimate (what ``count-params``
    prints): 16 bytes a parameter for weights, gradients and AdamW moments (ZeRO §3.1), plus one
    micro-batch's activations (``grad_accum_steps`` adds time, not memory). Under FSDP each of
    ``shards`` processes holds 1/shards of the model states (ZeRO stage 3, §5.3). The estimate
    leaves out allocator slack, so a run that passes can still run out. Raises MinigptError: the
    estimate exceeds the free memory; the message gives both."""
    free = available_memory(device)
    if free is None:
        return
    need, mem = bytes_to_train(
        cfg.model, str(dtype).removeprefix("torch."), cfg.train.batch_size, cfg.train.optimizer
    )
    need -= mem["model_states"] - mem["model_states"] // shards
    if need > free:
        raise MinigptError(
            f"this model needs about {P.human_bytes(need)} to train "
            f"({P.human_bytes(mem['model_states'] // shards)} for "
            f"weights, gradients and AdamW moments of {P.count(cfg.model).total:,} parameters"
            f"{f', its share of {shards} processes (FSDP)' if shards > 1 else ''}, "
            f"{P.human_bytes(need - mem['model_states'] // shards)} for activations at batch {cfg.train.batch_size} x "
            f"{cfg.model.block_size}) but {device.type} has {P.human_bytes(free)} free; make model.n_layer, "
            f"n_embd, block_size or train.batch_size smaller (minigpt count-params --config CONFIG shows the "
            f"accounting)"
        )


@contextmanager
def flush_denormals(device: Optional[torch.device] = None) -> Iterator[None]:
    """Flush subnormal floats to zero (the CPU's FTZ/DAZ modes, ``torch.set_flush_denormal``) while
    training on a CPU (``device`` None: the host, whatever the run's device), and turn it off in the
    calling thread after (PyTorch's default; it has no getter).

    Why: as a model trains, values below float32's smallest normal (1.2e-38) appear, and x86 CPUs
    compute with them through a microcode assist many times slower than a normal product: a 4 x
    256 model 750 steps into training took 1.7x as long a step with them as without (BENCHMARKS.md);
    a fresh model has none, so short runs see no change. Values that small change no loss a float32
    sum can show. Elsewhere (CUDA, MPS) the device's own arithmetic is not affected.

    The mode is per thread, and PyTorch's OpenMP threads take their creator's when they start: set
    once they run, it reaches the calling thread alone. ``minigpt train`` therefore enters this
    before any computation, so that its whole pool flushes (threads started inside keep the mode
    after); a caller of the library's ``train`` does the same to get it everywhere."""
    on = (device is None or device.type == "cpu") and torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if on:
            torch.set_flush_denormal(False)
