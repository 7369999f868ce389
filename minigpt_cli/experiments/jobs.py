"""``--jobs``: how a sweep trains its runs, one at a time in this process or N at a time as
``minigpt train`` processes (a GPU each where there are GPUs), resuming what a killed sweep left."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..config.schema import apply_overrides, text_override
from ..errors import Interrupted, MinigptError
from ..run import claim as claims
from ..run import folder as runs
from ..run.metrics import METRICS, read_events
from ..run.trackers import GROUP_ENV
from .sweepfile import Run, Sweep

#: What a stopped sweep says (Ctrl-C, or a run's stop): the same command goes on from the
#: checkpoints.
INTERRUPTED = "interrupted; the runs under way saved their checkpoints"


def _resumable(sweep: Sweep, run: Run) -> bool:
    """Whether ``run`` resumes a checkpoint a killed sweep left; a folder without one is emptied to
    start afresh."""
    folder = sweep.folder / run.name
    if folder.is_dir() and runs.has_checkpoint(folder):
        return True
    if folder.is_dir():
        claims.clear_unsaved(folder)
    return False


def run_in_process(
    sweep: Sweep, run: Run, on_eval: Optional[Callable[[int, float], bool]] = None
) -> None:
    """Train ``run`` here: a new run folder, or a resume of the one a killed sweep left;
    ``on_eval``: the trainer's."""
    from ..trainer import train

    cfg = run.cfg.model_copy(
        update={"train": run.cfg.train.model_copy(update={"out_dir": str(sweep.folder)})}
    )
    if _resumable(sweep, run):
        # A killed search may have logged an eval it never reported: ``on_eval`` hears the logged
        # ones first.
        logged = [e for e in read_events(sweep.folder / run.name / METRICS) if e["event"] == "eval"]
        if on_eval is not None and any(on_eval(e["step"], e["val_loss"]) for e in logged):
            return
        train(
            cfg,
            resume=str(sweep.folder / run.name),
            echo=lambda m: None,
            progress=False,
            on_eval=on_eval,
            group=run.group,
        )
    else:
        train(cfg, run.name, echo=lambda m: None, progress=False, on_eval=on_eval, group=run.group)


def _command(sweep: Sweep, run: Run) -> list[str]:
    """The ``minigpt train`` command of ``run`` (for ``--jobs``)."""
    folder = sweep.folder / run.name
    words = [
        sys.executable,
        "-m",
        "minigpt_cli",
        "train",
        str(sweep.base),
        "--no-progress",
        *[
            w
            for item in [*run.overrides, text_override("train.out_dir", str(sweep.folder))]
            for w in ("--set", item)
        ],
    ]
    return (
        [*words, "--resume", str(folder)]
        if _resumable(sweep, run)
        else [*words, "--run-name", run.name]
    )


#: Linux's prctl option that has the kernel signal a process when its parent dies (<linux/prctl.h>).
PR_SET_PDEATHSIG = 1


def die_with_parent() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` giving a child SIGTERM (a trainer saves ``last``) when this process dies;
    None off Linux. The kernel sends it when the *thread* that started the child ends: a worker
    thread that waits for it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    # Every Linux C library has had prctl since Linux 2.1.57.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the sweep died before the call: its signal will never come
            os._exit(128 + int(signal.SIGTERM))

    return set_parent_death_signal


#: How often a ``--jobs`` search reads a run's metrics.jsonl for evals to report, in seconds.
POLL_S = 0.5


def visible_gpus() -> list[str]:
    """The CUDA devices ``--jobs`` shares out, as ``CUDA_VISIBLE_DEVICES`` names them: the entries
    already set there (a job gets one of them), else ``0`` .. ``count - 1``; none without CUDA."""
    import torch

    count = torch.cuda.device_count()  # 0 without CUDA; counts without creating a CUDA context
    given = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return given[:count] if given else [str(i) for i in range(count)]


def default_jobs(sweep: Sweep, echo: Callable[[str], None]) -> int:
    """``--jobs`` when not given: one run per GPU where the runs train on CUDA and there are several
    GPUs, saying so; else 1 (the runs one after another, in this process)."""
    gpus = visible_gpus()
    # A search has no runs before its trials: the base config with the sweep's --set says the
    # device.
    device = (
        sweep.runs[0].cfg.device
        if sweep.runs
        else apply_overrides(sweep.base_data, sweep.sets).get("device", "auto")
    )
    if len(gpus) < 2 or device in ("cpu", "mps"):
        return 1
    echo(
        f"note: {len(gpus)} GPUs here: {len(gpus)} runs at a time, each on its own GPU "
        "(--jobs 1: one run at a time)"
    )
    return len(gpus)


class Processes:
    """``--jobs N``: each run a ``minigpt train`` process with 1/N of the cores, in a session of its
    own (the sweep passes a Ctrl-C on) and ended if the sweep is killed; :meth:`stop` stops them
    all, each saving its checkpoint. On a machine with GPUs each running process sees one of them
    (``CUDA_VISIBLE_DEVICES``), a GPU of its own while N is at most the GPU count (more jobs share
    them evenly)."""

    def __init__(self, sweep: Sweep, jobs: int):
        self.sweep, self.jobs = sweep, jobs
        self.env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // jobs)))
        # One entry per job: a run takes a GPU when it starts and gives it back when it ends.
        gpus = visible_gpus()
        self.gpus: Optional[queue.Queue] = queue.Queue() if gpus else None
        for slot in range(jobs if gpus else 0):
            self.gpus.put(gpus[slot % len(gpus)])
        self.preexec_fn = die_with_parent()
        self.running: dict[str, subprocess.Popen] = {}
        self.stopping = threading.Event()

    def train(self, run: Run, on_eval: Optional[Callable[[int, float], bool]] = None) -> None:
        """Train ``run`` in a process, ``on_eval`` hearing each eval its metrics.jsonl logs (True:
        SIGTERM, so the run saves and stops). Raises Interrupted (:meth:`stop` was called) and
        MinigptError (the run failed)."""
        if self.stopping.is_set():
            raise Interrupted(INTERRUPTED)
        log = self.sweep.folder / f"{run.name}.log"
        gpu = self.gpus.get() if self.gpus else None
        env = self.env if gpu is None else {**self.env, "CUDA_VISIBLE_DEVICES": gpu}
        env = {**env, GROUP_ENV: json.dumps(run.group)}  # the run's trackers' group
        try:
            with open(log, "w") as out:
                proc = self.running[run.name] = subprocess.Popen(
                    _command(self.sweep, run),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=self.preexec_fn,
                )
                asked = self._wait(proc, self.sweep.folder / run.name, on_eval)
        finally:
            if gpu is not None:
                self.gpus.put(gpu)
        del self.running[run.name]
        if self.stopping.is_set():
            raise Interrupted(INTERRUPTED)
        if proc.returncode != 0 and not asked:
            raise MinigptError(
                f"run {run.name} failed (exit status {proc.returncode}); its log: {log}"
            )
        log.unlink()

    @staticmethod
    def _wait(
        proc: subprocess.Popen, folder: Path, on_eval: Optional[Callable[[int, float], bool]]
    ) -> bool:
        """Wait for ``proc``, reading its evals every :data:`POLL_S` for ``on_eval``; True when that
        stopped it."""
        heard = 0
        while on_eval is not None:
            # Asked before reading: an ended run's last evals are heard too.
            ended = proc.poll() is not None
            evals = [e for e in read_events(folder / METRICS) if e["event"] == "eval"]
            for e in evals[heard:]:
                if on_eval(e["step"], e["val_loss"]):
                    proc.send_signal(signal.SIGTERM)
                    proc.wait()
                    return True
            heard = len(evals)
            if ended:
                return False
            time.sleep(POLL_S)
        proc.wait()
        return False

    def stop(self) -> None:
        self.stopping.set()
        for proc in list(self.running.values()):
            proc.send_signal(signal.SIGINT)


def parallel(
    procs: Optional[Processes], tasks: list[Callable[[], Any]], done: Callable[[Any], None]
) -> None:
    """Run ``tasks`` one after another (``procs`` None), or on ``procs.jobs`` threads, ``done``
    hearing each result; a Ctrl-C or a failed run stops the others, each saving its checkpoint."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    if procs is None:
        for task in tasks:
            done(task())
        return
    pool = ThreadPoolExecutor(max_workers=procs.jobs)
    try:
        for future in as_completed([pool.submit(task) for task in tasks]):
            done(future.result())
    except KeyboardInterrupt:
        raise Interrupted(INTERRUPTED) from None
    finally:
        procs.stop()
        pool.shutdown(wait=True, cancel_futures=True)
