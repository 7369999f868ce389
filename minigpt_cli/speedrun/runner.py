"""A speedrun: a recipe trained at several seeds, one ``minigpt train`` process after another on a
fixed thread count, then the rule's statistics.

Each seed's time to target is its run's ``elapsed_s`` at the first eval whose val loss is at or
below the target: the trainer's clock starts before the first step, and every eval, checkpoint save
and sample before that point counts as training time (process start-up and data preparation do
not).
Its stop val is the loss of the run's last checkpoint over the whole val split, every character
scored once in windows of ``block_size`` (:func:`~minigpt_cli.eval.evaluate.evaluate`), not the
eval's sample of windows. A seed that never reaches the target is a miss and keeps its stop val in
the statistics; its time counts as infinite in the median. The record rule is modded-nanogpt's:
the one-sided t-test (``scipy.stats.ttest_1samp``, ``alternative="less"``) that the mean stop val
is below the target, at p < :data:`P_RECORD`.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..config.schema import text_override
from ..errors import Interrupted, MinigptError
from ..run import folder as runs
from ..run.metrics import METRICS, read_events

#: The record rule: the one-sided p-value that the mean stop val beats the target stays below this.
P_RECORD = 0.01
#: The speedrun's own file in its output folder.
REPORT = "speedrun.json"


@dataclass
class SeedResult:
    """One seed's run: time to target in seconds (None: a miss) and its whole-split val at the
    stop step (nats per character)."""

    seed: int
    run: str
    time_to_target_s: Optional[float]
    hit_step: Optional[int]
    stop_step: int
    stop_val: float
    torch_threads: Optional[int]  # what the run's env.json says it trained with
    #: The CPU cores other processes kept busy while the seed's process ran, on average (Linux's
    #: /proc/stat; None elsewhere).
    other_cores_busy: Optional[float] = None

    @property
    def hit(self) -> bool:
        return self.time_to_target_s is not None


def cpu_model() -> str:
    """The CPU's model name, with its family and model numbers (which tell generations apart where
    the name is generic, as a cloud VM's "Intel(R) Xeon(R) Processor" is)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine() or "unknown CPU"
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def logical_cpus() -> int:
    """The logical CPUs this process may run on (``sched_getaffinity``, Linux's), else the
    machine's."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def physical_cores() -> int:
    """The physical cores this process may run on (hyperthread siblings counted once; Linux's
    sysfs topology), else the logical CPU count."""
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = sorted(affinity(0)) if affinity is not None else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
            cores.add(siblings.read_text().strip())
        except OSError:
            return len(cpus)
    return max(1, len(cores))


def time_to_target(run_dir: Path, target: float) -> tuple[Optional[float], Optional[int]]:
    """``elapsed_s`` and step of the run's first eval with ``val_loss <= target``; (None, None)
    when none reached it."""
    for event in read_events(run_dir / METRICS):
        if event["event"] == "eval" and event["val_loss"] <= target:
            return event["elapsed_s"], event["step"]
    return None, None


def stop_val(run_dir: Path, block_size: int, device: str) -> tuple[float, int]:
    """The loss of the run's last checkpoint on the whole val split, each character scored once
    with up to ``block_size`` before it (disjoint windows, as the training eval's), and its step."""
    from ..eval.evaluate import evaluate

    result = evaluate(
        run_dir, checkpoint=runs.LAST, full=True, stride=block_size, device=device, progress=False
    )
    return result["loss"], result["step"]


#: The lines of a seed's training that the speedrun passes on as they come (``minigpt train
#: --no-progress`` writes them on stderr): its time estimate before the first step, the estimate its
#: own first steps measure (a run past a minute), a status line every 30 s, and each eval's losses.
PROGRESS = re.compile(
    r"time to train: |note: about .+ to go \(|step [\d,]+/[\d,]+: loss |"
    r"step [\d,]+: train loss [\d.]+, val loss "
)
#: Cores that other processes may keep busy beside a seed's threads before its time is called a
#: busy machine's (a quiet machine's daemons take a few hundredths of a core).
BUSY_SLACK = 0.25


def cpu_with_children() -> float:
    """CPU seconds of this process and of its children that have ended (Unix)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def contended(seed: dict, threads: int, cpus: int) -> bool:
    """Whether other processes took cores that a seed's ``threads`` wanted (``seed``: a report's
    seed entry, or its baseline), on a machine of ``cpus`` logical CPUs: the time is not the
    machine's."""
    others = seed.get("other_cores_busy")
    return others is not None and others + threads > cpus + BUSY_SLACK


def train_seed(
    recipe: Path,
    seed: int,
    out: Path,
    threads: int,
    target: float,
    block_size: int,
    device: str,
    progress: Callable[[str], None] = lambda line: None,
) -> SeedResult:
    """Train ``recipe`` at ``seed`` as a ``minigpt train`` process with ``threads`` OpenMP threads
    into ``out/seed-<seed>``, passing its :data:`PROGRESS` lines to ``progress`` as they come, and
    read its time to target and stop val, and the cores other processes kept busy meanwhile.

    Raises:
        MinigptError: the training failed (its own error line).
    """
    import torch

    from ..runtime.device import CpuThreads

    name = f"seed-{seed}"
    cmd = [sys.executable, "-m", "minigpt_cli", "train", str(recipe), "--run-name", name]
    cmd += ["--set", f"seed={seed}", "--set", text_override("train.out_dir", str(out))]
    cmd += ["--no-progress"]
    # Both variables: PyTorch takes its intra-op threads from them, and minigpt's trainer then
    # keeps that count instead of adapting it to the machine's load (runtime.device.CpuThreads).
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    lines = []
    meter = CpuThreads(torch.device("cpu"), read_own=cpu_with_children)
    mark = meter.mark()  # the machine's busy time, less this process's and the seed's
    # One pipe for both streams, read as the run writes them (its stderr is line-buffered): a seed
    # of the nanogpt-gpu track trains for the best part of an hour.
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        try:
            for line in proc.stdout:
                lines.append(line)
                if PROGRESS.match(line):
                    progress(line.rstrip("\n"))
        except KeyboardInterrupt:  # the run got the same Ctrl-C: it saves, then the speedrun stops
            proc.wait()  # (a second Ctrl-C stops the waiting too)
            raise
    returncode = proc.returncode
    others = meter.others_since(mark)
    run_dir = out / name
    (out / f"{name}.log").write_text("".join(lines), encoding="utf-8")
    if returncode > 128:  # stopped by a signal (Ctrl-C reaches the whole process group)
        raise Interrupted(
            f"seed {seed}'s training was stopped by signal {returncode - 128}; the speedrun "
            f"stops here (its runs are in {out})",
            returncode - 128,
        )
    if returncode != 0:
        errors = [line.rstrip("\n") for line in lines if line.startswith("error:")]
        last = errors[-1] if errors else ("".join(lines).strip().splitlines() or ["no output"])[-1]
        raise MinigptError(
            f"seed {seed}'s training failed (exit status {returncode}): {last}",
            f"its output is in {out / (name + '.log')}",
        )
    seconds, step = time_to_target(run_dir, target)
    val, stop_step = stop_val(run_dir, block_size, device)
    env_json = json.loads((run_dir / runs.ENV).read_text(encoding="utf-8"))
    return SeedResult(
        seed, str(run_dir), seconds, step, stop_step, val, env_json.get("torch_threads"), others
    )


def summarize(results: list[SeedResult], target: float) -> dict:
    """The rule's statistics over every seed, misses included: the mean stop val, the one-sided
    p-value that it is below ``target`` (None under 2 seeds, or when every val is the same), the
    median time to target (misses as infinite: None when half or more missed), and whether the
    record rule holds."""
    from scipy import stats

    vals = [r.stop_val for r in results]
    p = None
    if len(vals) >= 2:
        p = float(stats.ttest_1samp(vals, target, alternative="less").pvalue)
        p = None if math.isnan(p) else p
    median = statistics.median(
        [r.time_to_target_s if r.hit else math.inf for r in results]
    )  # a miss has no time: counted as never
    return {
        "mean_val": statistics.fmean(vals),
        "p": p,
        "median_time_s": None if math.isinf(median) else median,
        "hits": sum(r.hit for r in results),
        "record_rule_met": p is not None and p < P_RECORD,
    }


def run_speedrun(
    track,
    recipe: Path,
    cfg,
    seeds: list[int],
    threads: int,
    out: Path,
    echo: Callable[[str], None],
    overrides: Sequence[str] = (),
) -> dict:
    """Train ``recipe`` (whose config is ``cfg``; ``overrides``: the ``--set`` values it was written
    with) at each of ``seeds`` (:func:`train_seed`) and summarize; the report, not yet written.
    Stopped by a signal (Ctrl-C) after one seed or more, it writes the report of the seeds that
    finished (``"interrupted"``: how many of how many) before it stops: a seed can take an hour.

    Raises:
        MinigptError: a seed's training failed.
        Interrupted, KeyboardInterrupt: stopped by a signal.
    """
    import torch

    torch.set_num_threads(threads)  # the stop vals, scored in this process
    results = []
    try:
        for i, seed in enumerate(seeds, 1):
            echo(f"seed {seed} ({i} of {len(seeds)}): training {recipe} ...")
            r = train_seed(
                recipe,
                seed,
                out,
                threads,
                track.target,
                cfg.model.block_size,
                cfg.device,
                progress=lambda line: echo(f"  {line}"),
            )
            reached = (
                f"val <= {track.target} at step {r.hit_step}, {r.time_to_target_s:.1f} s"
                if r.hit
                else f"missed {track.target}"
            )
            echo(f"seed {seed}: {reached}; stop val {r.stop_val:.4f} at step {r.stop_step}")
            if contended(asdict(r), threads, logical_cpus()):
                echo(f"  {_busy_line([r.other_cores_busy], [seed], logical_cpus())}")
            results.append(r)
    except (Interrupted, KeyboardInterrupt):
        if results:
            report = _report(track, recipe, cfg, threads, overrides, results)
            report.update(
                baseline=None, ratio=None, interrupted=f"after {len(results)} of {len(seeds)} seeds"
            )
            path = write_report(out, report)
            echo(
                f"the finished seeds' report ({len(results)} of {len(seeds)}) is in {path}; "
                "not a record"
            )
        raise
    return _report(track, recipe, cfg, threads, overrides, results)


def _report(track, recipe: Path, cfg, threads: int, overrides: Sequence[str], results) -> dict:
    """The speedrun's report of ``results`` (:class:`SeedResult`), without the baseline."""
    import torch

    return {
        "track": track.name,
        "target": track.target,
        "recipe": str(recipe),
        "set": list(overrides),
        "budget_iters": cfg.train.max_iters,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "threads": threads,
        "cpus": logical_cpus(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "seeds": [asdict(r) | {"hit": r.hit} for r in results],
        **summarize(results, track.target),
        "p_record": P_RECORD,
    }


def format_report(report: dict) -> str:
    """The report as the terminal shows it: a line per seed, then the statistics."""
    lines = [
        f"track {report['track']}: val <= {report['target']} on Tiny Shakespeare's val split; "
        f"recipe {report['recipe']} ({report['budget_iters']} steps"
        + (f"; --set {' --set '.join(report['set'])}" if report.get("set") else "")
        + ")",
        f"CPU {report['cpu']}; threads {report['threads']}; torch {report['torch']}",
        "",
        f"{'seed':>6}  {'time to target':>14}  {'stop step':>9}  {'stop val':>8}  result",
    ]
    for s in report["seeds"]:
        t = f"{s['time_to_target_s']:.1f} s" if s["hit"] else "-"
        lines.append(
            f"{s['seed']:>6}  {t:>14}  {s['stop_step']:>9}  {s['stop_val']:>8.4f}  "
            + ("hit" if s["hit"] else "miss")
        )
    median = report["median_time_s"]
    p = report["p"]
    lines += [
        "",
        "median time to target: "
        + (f"{median:.1f} s" if median is not None else "not reached (half or more missed)"),
        f"mean stop val: {report['mean_val']:.4f} over {len(report['seeds'])} seeds "
        f"({report['hits']} hit)",
        "p (one-sided t-test, mean val < target): "
        + (f"{p:.3g}" if p is not None else "undefined (needs 2 seeds that differ)"),
        f"record rule (p < {report['p_record']}): "
        + ("met" if report["record_rule_met"] else "not met"),
    ]
    base = report.get("baseline")
    if base is not None:
        lines.append(f"baseline: {base['label']}, {base['seconds']:.1f} s")
    if report.get("ratio") is not None:
        lines.append(f"ratio to the baseline: {report['ratio']:.3f}x")
    if base and contended(base, report["threads"], report.get("cpus", 0)):
        lines.append(baseline_busy_line(base, report["cpus"]))
    busy = [s for s in report["seeds"] if contended(s, report["threads"], report.get("cpus", 0))]
    if busy:
        lines.append(
            _busy_line(
                [s["other_cores_busy"] for s in busy], [s["seed"] for s in busy], report["cpus"]
            )
        )
    return "\n".join(lines) + "\n"


def _busy_line(others: list[float], seeds: list[int], cpus: int) -> str:
    """The warning for seeds that other processes slowed (their busy cores, on average)."""
    which = ", ".join(str(seed) for seed in seeds)
    return (
        f"warning: other processes kept up to {max(others):.1f} of {cpus} CPU cores busy during "
        f"seed{'s' * (len(seeds) > 1)} {which}: {'their times are' if len(seeds) > 1 else 'its time is'} "
        "not this machine's (run the speedrun on a quiet machine)"
    )


def baseline_busy_line(base: dict, cpus: int) -> str:
    """The warning for a baseline that other processes slowed (``base``: the baseline's entry of a
    report, :func:`~minigpt_cli.speedrun.baseline.run_nanogpt`'s)."""
    return (
        f"warning: other processes kept {base['other_cores_busy']:.1f} of {cpus} CPU cores busy "
        f"during nanoGPT's baseline: its {base['seconds']:.1f} s is not this machine's time, and "
        "the ratio flatters the seeds (run the speedrun on a quiet machine)"
    )


def write_report(out: Path, report: dict) -> Path:
    """Write ``speedrun.json`` into the speedrun's folder (atomically); its path."""
    from ..fileio import atomic_write_text

    path = out / REPORT
    atomic_write_text(path, json.dumps(report, indent=1) + "\n")
    return path
