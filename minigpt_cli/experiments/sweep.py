"""``minigpt sweep``: many runs of one base config, compared fairly, resumable after a kill (the README's
sweep file); runs go in ``<out_dir>/<name>/<variant>-s<seed>/``, the state in ``sweep.json`` beside them."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..config.schema import Config, apply_overrides, validate
from ..config.yaml_io import parse_yaml
from ..errors import Interrupted, MinigptError, refuse
from ..fileio import atomic_write_text, read_text_file
from ..paths import list_configs, resolve_config
from ..run import folder as runs
from ..runtime.kernels import check_settings
from .compare import read_model, summarize, value_text

STATE = "sweep.json"
#: The key a sweep sets itself: its runs go in ``<out_dir>/<name>/``.
OUT_DIR = "train.out_dir"

_MESSAGES = {
    "schema": "{path}: {why}",
    "budget": "{path}: budget: give exactly one of iters, tokens or seconds",
    "seeds": "{path}: seeds: the list must be without repeats",
    "no_variants": "{path}: give grid: or variants: (at least one variant to run)",
    "collide": "{path}: variants {a!r} and {b!r} get the same name {name!r}; name them under variants: instead",
    "out_dir": ("{path}: {where}: train.out_dir cannot be set in a sweep: its runs go in the sweep's folder, "
                "{folder}; choose that folder with out_dir: (and name:) in the sweep file"),
    "base_top": "{path}: base: {base} must hold a mapping of config sections",
    "no_base": ("{path}: base: config file {name!r} not found, neither beside the sweep file ({near}) nor among "
                "the shipped configs; give a config's path relative to the sweep file, or one of {shipped}"),
    "changed": "{source} changed since this sweep started in {folder} ({what}); restore it, or give the sweep "
               "another name: to start a new one",
    "taken": "{folder} exists and is not a sweep's folder (no sweep.json); give the sweep in {path} another "
             "name:",
    "jobs": "--jobs {jobs}: use 1 to {cores} (this machine's cores); more jobs than cores only share them",
    "interrupted": "interrupted; the runs under way saved their checkpoints",
    "failed": "run {run} failed (exit status {code}); its log: {log}",
    "state": "{path} is damaged or unreadable ({why}); restore it, or move the sweep's folder away to start anew",
}


class Budget(BaseModel):
    """What each run gets: exactly one of optimizer steps, tokens or seconds (:func:`load_sweep` checks one)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    iters: Optional[int] = Field(None, gt=0, description="optimizer steps per run")
    tokens: Optional[float] = Field(None, gt=0, description="training tokens per run")
    seconds: Optional[float] = Field(None, gt=0, description="wall-clock seconds per run, evals included")

    def overrides(self, cfg: Config) -> list[str]:
        """The ``--set`` values that give ``cfg`` this budget."""
        if self.iters is not None:
            return [f"train.max_iters={self.iters}"]
        if self.tokens is not None:
            tc = cfg.train
            per_step = tc.batch_size * tc.grad_accum_steps * cfg.model.block_size
            return [f"train.max_iters={max(1, math.ceil(self.tokens / per_step))}"]
        return [f"train.max_seconds={self.seconds}"]


Scalar = Union[bool, int, float, str, None, list]
Seed = Annotated[int, Field(ge=0, lt=2**32)]
Key = Annotated[str, Field(pattern=r"^\s*[^=\s]")]  # a config key, as --set spells it


#: The most runs one sweep file may ask for (variants x seeds), counted before anything is expanded.
MAX_RUNS = 10_000


class SweepFile(BaseModel):
    """The sweep file's schema (module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: Optional[str] = None
    base: str
    set: list[Annotated[str, Field(pattern=r"^\s*[^=\s][^=]*=")]] = Field(default_factory=list)  # key=value
    grid: dict[Key, Annotated[list[Scalar], Field(min_length=1)]] = Field(default_factory=dict)
    variants: dict[str, dict[Key, Scalar]] = Field(default_factory=dict)
    seeds: Union[Annotated[int, Field(ge=1, le=MAX_RUNS)],  # a count, or the seeds
                 Annotated[list[Seed], Field(min_length=1, max_length=MAX_RUNS)]] = 1
    budget: Budget
    target_loss: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    out_dir: str = "runs"

    @model_validator(mode="after")
    def _countable(self) -> "SweepFile":
        """Refuse more than :data:`MAX_RUNS` runs from their count alone: a 10^12 grid is never built."""
        variants = math.prod(len(v) for v in self.grid.values()) * bool(self.grid) + len(self.variants)
        runs_ = variants * (self.seeds if isinstance(self.seeds, int) else len(self.seeds))
        if runs_ > MAX_RUNS:
            raise ValueError(f"{runs_:,} runs ({variants:,} variants x seeds) is more than one sweep may ask for "
                             f"({MAX_RUNS:,}); split it into several sweep files")
        return self


class _State(BaseModel):
    """``sweep.json``: the sweep file and base config as read, and the runs done."""

    model_config = ConfigDict(strict=True)
    sweep: dict[str, Any]
    base: dict[str, Any]
    done: list[str] = Field(default_factory=list)


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "", value_text(value)) or "x"


@dataclass
class Run:
    """One run of the sweep: a variant at a seed, its validated config and the ``--set`` values that give it."""

    variant: str
    seed: int
    cfg: Config
    overrides: list[str]

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


class Sweep:
    """A sweep file read and checked: its runs, in order, each with its validated config."""

    def __init__(self, path: Path, spec: SweepFile, base: Path, base_data: dict, runs_: list[Run]):
        self.path, self.spec, self.base, self.base_data, self.runs = path, spec, base, base_data, runs_
        self.name = spec.name or path.stem
        self.folder = Path(spec.out_dir) / self.name


def _variants(spec: SweepFile) -> list[tuple[str, dict[str, Any]]]:
    """(variant name, its overrides): the grid's combinations (named key-value_key-value), then the named ones."""
    keys = list(spec.grid)
    grid = [dict(zip(keys, combo)) for combo in itertools.product(*spec.grid.values())] if keys else []
    named = [("_".join(f"{k.rpartition('.')[2]}-{_slug(v)}" for k, v in g.items()), g) for g in grid]
    return [*named, *spec.variants.items()]


def load_sweep(path: str | Path, echo: Callable[[str], None] = lambda m: None) -> Sweep:
    """Read and check a sweep file, every run's config validated before anything runs (refusals: :data:`_MESSAGES`)."""
    p = Path(path)
    data = parse_yaml(read_text_file(p, "sweep file"), str(p))
    spec = read_model(SweepFile, data, _MESSAGES["schema"], path=p)
    sweep_name = runs.check_name(spec.name or p.stem, f"{p}: name:")  # the sweep's folder: never a path out of out_dir
    variants = _variants(spec)
    for variant, _ in variants:
        runs.check_name(variant, f"{p}: variants:")
    names = [v for v, _ in variants]
    same = next((v for i, v in enumerate(names) if v in names[:i]), None)
    near = p.parent / spec.base
    base = near if near.is_file() else resolve_config(Path(spec.base), echo)
    overriding = [("set", [item.split("=", 1)[0].strip() for item in spec.set]), ("grid", list(spec.grid)),
                  *((f"variants.{v}", list(o)) for v, o in spec.variants.items())]
    where = next((where for where, keys in overriding if OUT_DIR in keys), None)
    seeds = spec.seeds if isinstance(spec.seeds, list) else None
    # A folder is refused by read_text_file; what is not there is looked for among the shipped configs.
    base_data = parse_yaml(read_text_file(base, f"{p}: base:"), str(base)) if base.exists() else {}
    refuse([(sum(v is not None for v in spec.budget.model_dump().values()) != 1, "budget"),
            (seeds and len(set(seeds)) != len(seeds), "seeds"),
            (not variants, "no_variants"),
            (same, "collide"),
            (where, "out_dir"),
            (not base.exists(), "no_base"),
            (not isinstance(base_data, (dict, type(None))), "base_top")], _MESSAGES,
           path=p, a=same and dict(variants[::-1])[same], b=same and dict(variants)[same], name=same or spec.base,
           where=where, folder=Path(spec.out_dir) / sweep_name, base=base, near=near, shipped=", ".join(list_configs()))
    base_data = base_data or {}
    planned = []
    for variant, overrides in variants:
        sets = [*spec.set, *(f"{k}={value_text(v)}" for k, v in overrides.items())]
        source = f"{p}: variant {variant}"
        cfg = validate(apply_overrides(base_data, sets), source)
        sets += spec.budget.overrides(cfg)
        for seed in seeds or [cfg.seed + i for i in range(spec.seeds)]:
            run_sets = [*sets, f"seed={seed}"]  # the schema bounds the seed: 0 .. 2**32-1
            planned.append(Run(variant, seed, validate(apply_overrides(base_data, run_sets), source), run_sets))
    return Sweep(p, spec, Path(base), base_data, planned)


def _difference(old: Any, new: Any, where: str = "") -> Optional[str]:
    """The first place two parsed documents differ, as ``key: old -> new``."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            found = _difference(old.get(key), new.get(key), f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    return None if old == new else f"{where or 'the file'}: {json.dumps(old)} -> {json.dumps(new)}"


def _read_state(sweep: Sweep, jobs: int) -> dict:
    """The sweep's state, created on the first start; refuses a changed sweep once a run saved a checkpoint."""
    path = sweep.folder / STATE
    record = {"sweep": sweep.spec.model_dump(mode="json"), "base": sweep.base_data}  # to notice a change
    state = read_model(_State, path, _MESSAGES["state"], path=path).model_dump() if path.is_file() else None
    changed = [(source, what) for part, source in (("sweep", sweep.path), ("base", sweep.base))
               if state and (what := _difference(state[part], record[part]))]
    # No run has a checkpoint yet (e.g. a failed download): the edited sweep replaces the record.
    trained = changed and (state["done"] or any(runs.has_checkpoint(d) for d in sweep.folder.iterdir() if d.is_dir()))
    cores = os.cpu_count() or 1
    refuse([(not 1 <= jobs <= cores, "jobs"),
            (state is None and sweep.folder.is_dir() and any(sweep.folder.iterdir()), "taken"),
            (trained, "changed")], _MESSAGES, jobs=jobs, cores=cores, folder=sweep.folder, path=sweep.path,
           source=changed and changed[0][0], what=changed and changed[0][1])
    if state is not None and not changed:
        return state
    sweep.folder.mkdir(parents=True, exist_ok=True)
    state = {**record, "done": []}
    atomic_write_text(path, json.dumps(state, indent=1) + "\n")
    return state


def _mark_done(sweep: Sweep, state: dict, run: Run) -> None:
    state["done"] = sorted(set(state["done"]) | {run.name})
    atomic_write_text(sweep.folder / STATE, json.dumps(state, indent=1) + "\n")


def _resumable(sweep: Sweep, run: Run) -> bool:
    """Whether ``run`` resumes a checkpoint a killed sweep left; a folder without one is emptied to start afresh."""
    folder = sweep.folder / run.name
    if folder.is_dir() and runs.has_checkpoint(folder):
        return True
    if folder.is_dir():
        runs.clear_unsaved(folder)
    return False


def _run_in_process(sweep: Sweep, run: Run) -> None:
    """Train ``run`` here: a new run folder, or a resume of the one a killed sweep left."""
    from ..trainer import train

    cfg = run.cfg.model_copy(update={"train": run.cfg.train.model_copy(update={"out_dir": str(sweep.folder)})})
    if _resumable(sweep, run):
        train(cfg, resume=str(sweep.folder / run.name), echo=lambda m: None, progress=False)
    else:
        train(cfg, run.name, echo=lambda m: None, progress=False)


def _command(sweep: Sweep, run: Run) -> list[str]:
    """The ``minigpt train`` command of ``run`` (for ``--jobs``)."""
    folder = sweep.folder / run.name
    words = [sys.executable, "-m", "minigpt_cli", "train", str(sweep.base), "--no-progress",
             *[w for item in [*run.overrides, f"train.out_dir={sweep.folder}"] for w in ("--set", item)]]
    return [*words, "--resume", str(folder)] if _resumable(sweep, run) else [*words, "--run-name", run.name]


#: Linux's prctl option that has the kernel signal a process when its parent dies (<linux/prctl.h>).
PR_SET_PDEATHSIG = 1


def die_with_parent() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` giving a child SIGTERM (a trainer saves ``last``) when this process dies; None off Linux.
    The kernel sends it when the *thread* that started the child ends: a worker thread that waits for it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # every Linux C library has had it since Linux 2.1.57
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the sweep died before the call: its signal will never come
            os._exit(128 + int(signal.SIGTERM))

    return set_parent_death_signal


def run_sweep(path: str | Path, *, jobs: int = 1, progress: Optional[bool] = None,
              echo: Callable[[str], None] = lambda m: None) -> dict:
    """Run (or finish) a sweep, then write its summary. Raises MinigptError (a bad kernel setting, sweep file or
    state, a failed run) and Interrupted (Ctrl-C: checkpoints saved, the same command goes on)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tqdm.auto import tqdm

    check_settings()  # the runs would each refuse a bad MINIGPT_ONEDNN / MINIGPT_FAST_DROPOUT: refuse it once, first
    sweep = load_sweep(path, echo)
    state = _read_state(sweep, jobs)
    todo = [r for r in sweep.runs if r.name not in state["done"]]
    echo(f"sweep {sweep.name}: {len(sweep.runs)} runs ({len(sweep.runs) - len(todo)} done), "
         f"{len({r.variant for r in sweep.runs})} variants; runs in {sweep.folder}")
    bar = tqdm(total=len(sweep.runs), initial=len(sweep.runs) - len(todo), desc=f"sweep {sweep.name}", unit="run",
               disable=None if progress is None else not progress, dynamic_ncols=True, file=sys.stderr)
    with bar:
        if jobs == 1:
            for run in todo:
                bar.set_postfix_str(run.name)
                _run_in_process(sweep, run)
                _mark_done(sweep, state, run)
                bar.update(1)
        else:
            env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // jobs)))
            # Each run in a session of its own (the sweep passes a Ctrl-C on), ended if the sweep is killed.
            preexec_fn = die_with_parent()

            running: dict[str, subprocess.Popen] = {}
            stopping = threading.Event()

            def one(run: Run) -> Optional[Run]:
                if stopping.is_set():
                    return None
                log = sweep.folder / f"{run.name}.log"
                with open(log, "w") as out:
                    proc = running[run.name] = subprocess.Popen(_command(sweep, run), env=env, stdout=out,
                                                                stderr=subprocess.STDOUT, start_new_session=True,
                                                                preexec_fn=preexec_fn)
                    code = proc.wait()
                del running[run.name]
                if stopping.is_set():
                    return None
                if code != 0:
                    raise MinigptError(_MESSAGES["failed"].format(run=run.name, code=code, log=log))
                log.unlink()
                return run

            pool = ThreadPoolExecutor(max_workers=jobs)
            try:
                for future in as_completed([pool.submit(one, run) for run in todo]):
                    if (done := future.result()) is not None:
                        _mark_done(sweep, state, done)
                        bar.update(1)
            except KeyboardInterrupt:
                raise Interrupted(_MESSAGES["interrupted"]) from None
            finally:  # after a Ctrl-C or a failed run, stop the others, each saving its checkpoint
                stopping.set()
                for proc in list(running.values()):
                    proc.send_signal(signal.SIGINT)
                pool.shutdown(wait=True, cancel_futures=True)
    return summarize([sweep.folder / r.name for r in sweep.runs], out=sweep.folder, target=sweep.spec.target_loss,
                     variants={r.name: r.variant for r in sweep.runs}, echo=echo)
