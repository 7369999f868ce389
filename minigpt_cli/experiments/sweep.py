"""``minigpt sweep``: many runs of one base config, compared fairly, resumable after a kill (the
README's sweep file); runs go in ``<out_dir>/<name>/<variant>-s<seed>/``, the state in
``sweep.json`` beside them. A grid or named variants, or a ``search:`` (:mod:`.search`: Optuna's
trials); ``--worker``: one of many on a shared study."""

from __future__ import annotations

import itertools
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..config.schema import Config, ConfigError, TrainConfig, apply_overrides, validate
from ..config.yaml_io import parse_yaml, read_yaml
from ..errors import Interrupted, MinigptError
from ..fileio import atomic_write_text
from ..paths import list_configs, resolve_config
from ..run import folder as runs
from ..run.metrics import METRICS, read_events
from ..run.trackers import GROUP_ENV
from ..runtime.kernels import check_settings
from . import search as optuna_search
from .compare import read_model, study_trials, summarize, value_text
from .search import Key, Scalar, SearchSpec, Seed

if TYPE_CHECKING:
    import optuna

#: The key a sweep sets itself: its runs go in ``<out_dir>/<name>/``.
OUT_DIR = "train.out_dir"

#: What a stopped sweep says (Ctrl-C, or a run's stop): the same command goes on from the
#: checkpoints.
INTERRUPTED = "interrupted; the runs under way saved their checkpoints"


class Budget(BaseModel):
    """What each run gets: exactly one of optimizer steps, tokens or seconds (:func:`load_sweep`
    checks one)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    iters: Optional[int] = Field(None, gt=0, description="optimizer steps per run")
    tokens: Optional[float] = Field(None, gt=0, description="training tokens per run")
    seconds: Optional[float] = Field(
        None, gt=0, description="wall-clock seconds per run, evals included"
    )

    def overrides(self, cfg: Config) -> list[str]:
        """The ``--set`` values that give ``cfg`` this budget."""
        if self.iters is not None:
            return [f"train.max_iters={self.iters}"]
        if self.tokens is not None:
            return [f"train.max_iters={_steps_for_tokens(self.tokens, cfg)}"]
        return [f"train.max_seconds={self.seconds}"]

    def steps(self, cfg: Config) -> Optional[int]:
        """The optimizer steps this budget gives ``cfg``; None for a budget in seconds (the clock
        decides)."""
        if self.seconds is not None:
            return None
        return int(self.overrides(cfg)[0].partition("=")[2])

    def text(self) -> str:
        """The budget as ``--budget`` spells it: ``iters=80``."""
        kind, value = next((k, v) for k, v in self.model_dump().items() if v is not None)
        return f"{kind}={value:g}" if isinstance(value, float) else f"{kind}={value}"


def _steps_for_tokens(tokens: float, cfg: Config) -> int:
    """The fewest optimizer steps (at least 1) whose tokens reach ``tokens``, counted exactly
    under a batch-size ramp or sequence-length warmup (:func:`~..accounting.steps.tokens_through`;
    one process, as the sweep's runs are)."""
    from ..accounting.steps import step_tokens, tokens_through

    lo, hi = 1, max(1, math.ceil(tokens / step_tokens(0, cfg)))  # hi: every step the smallest
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if tokens_through(mid, cfg) >= tokens else (mid + 1, hi)
    return lo


def scaled_schedule(tc: "TrainConfig", factor: float) -> list[str]:
    """The ``--set`` values that scale ``tc``'s schedule in steps by ``factor``
    (``--scale-schedule``: the budget's steps over the sweep file's): the warmup, the decay's end
    (``lr_decay_iters``, when set), the eval and log intervals, the batch-size ramp, the
    sequence-length warmup and the EMA's start (when set). wsd's decay is a share of the run
    already, and scales itself."""
    warmup = round(tc.warmup_iters * factor)
    sets = [
        f"train.warmup_iters={warmup}",
        f"train.eval_interval={max(1, round(tc.eval_interval * factor))}",
        f"train.log_interval={max(1, round(tc.log_interval * factor))}",
    ]
    for key in ("batch_size_warmup_iters", "block_size_warmup_iters", "ema_start"):
        if getattr(tc, key):  # the ramps and the EMA's start are steps of the schedule too
            sets.append(f"train.{key}={round(getattr(tc, key) * factor)}")
    if tc.lr_decay_iters is not None:  # never before the warmup's end, which the schema refuses
        sets.append(f"train.lr_decay_iters={max(1, warmup, round(tc.lr_decay_iters * factor))}")
    return sets


def schedule_problems(tc: "TrainConfig") -> dict[str, str]:
    """What a run of ``tc`` (``max_iters`` steps) would not get of its schedule, as {the key to
    scale: what}: a warmup or ramp that never ends, fewer than 3 evals (a curve needs them), a
    decay that never starts."""
    from ..trainer.schedule import wsd_decay_start

    steps = tc.max_iters
    # should_eval's steps: step 0 (eval_at_start), every eval_interval, and the last step.
    evals = int(tc.eval_at_start) + steps // tc.eval_interval + bool(steps % tc.eval_interval)
    start = {"constant": None, "wsd": wsd_decay_start(tc)}.get(tc.lr_schedule, tc.warmup_iters)
    problems = {}
    if tc.warmup_iters >= steps:
        problems["train.warmup_iters"] = (
            f"ends inside its warmup ({tc.warmup_iters} steps, before any decay)"
        )
    elif start is not None and start >= steps:  # wsd's share of the run rounds to no step
        problems["train.decay_fraction"] = "never starts its decay"
    for key, what in (
        ("batch_size_warmup_iters", "batch-size ramp"),
        ("block_size_warmup_iters", "sequence-length warmup"),
    ):
        if getattr(tc, key) >= steps:  # the run never trains at its full size
            problems[f"train.{key}"] = f"ends inside its {what} ({getattr(tc, key)} steps)"
    if evals < 3:
        problems["train.eval_interval"] = f"gets {evals} evals (one every {tc.eval_interval} steps)"
    return problems


#: The most runs one sweep file may ask for (variants x seeds), counted before anything is expanded.
MAX_RUNS = 10_000


class SweepFile(BaseModel):
    """The sweep file's schema (module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: Optional[str] = None
    base: str
    set: list[Annotated[str, Field(pattern=r"^\s*[^=\s][^=]*=")]] = Field(
        default_factory=list
    )  # key=value
    grid: dict[Key, Annotated[list[Scalar], Field(min_length=1)]] = Field(default_factory=dict)
    variants: dict[str, dict[Key, Scalar]] = Field(default_factory=dict)
    seeds: Union[
        Annotated[int, Field(ge=1, le=MAX_RUNS)],  # a count, or the seeds
        Annotated[list[Seed], Field(min_length=1, max_length=MAX_RUNS)],
    ] = 1
    budget: Budget
    target_loss: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    out_dir: str = "runs"
    search: Optional[SearchSpec] = None

    @model_validator(mode="after")
    def _countable(self) -> "SweepFile":
        """Refuse more than :data:`MAX_RUNS` runs from their count alone: a 10^12 grid is never
        built."""
        variants = math.prod(len(v) for v in self.grid.values()) * bool(self.grid) + len(
            self.variants
        )
        variants = self.search.trials if self.search else variants
        runs_ = variants * (self.seeds if isinstance(self.seeds, int) else len(self.seeds))
        if runs_ > MAX_RUNS:
            raise ValueError(
                f"{runs_:,} runs ({variants:,} variants x seeds) is more than one sweep may ask for "
                f"({MAX_RUNS:,}); split it into several sweep files"
            )
        return self


class _State(BaseModel):
    """``sweep.json``: the sweep file and base config as read, the command line's overrides, and the
    runs done."""

    model_config = ConfigDict(strict=True)
    sweep: dict[str, Any]
    base: dict[str, Any]
    overrides: dict[str, Any] = Field(default_factory=dict)
    storage: Optional[str] = (
        None  # the --storage whose study the runs belong to (None: the folder's own)
    )
    done: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Overrides:
    """What the command line changes in a sweep file: ``--set`` (after its ``set:``, before the
    variants' values), ``--seeds`` and ``--budget`` (``iters=50``: in place of the file's)."""

    set: tuple[str, ...] = ()
    seeds: Optional[int] = None
    budget: Optional[str] = None
    scale_schedule: bool = (
        False  # scale the schedule's steps with the budget (:func:`scaled_schedule`)
    )

    def record(self) -> dict[str, Any]:
        """What ``sweep.json`` records: the overrides given (none: ``{}``, as a sweep.json from
        before them)."""
        return {
            k: v
            for k, v in (
                ("set", list(self.set)),
                ("seeds", self.seeds),
                ("budget", self.budget),
                ("scale_schedule", self.scale_schedule),
            )
            if v
        }

    def sections(self) -> dict[str, Any]:
        """The sweep file's ``seeds:`` and ``budget:`` as given here. Raises MinigptError: a
        --budget not KIND=N."""
        kind, _, text = (self.budget or "").partition("=")
        number = re.fullmatch(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?", text.strip())
        if self.budget is not None and (kind.strip() not in Budget.model_fields or not number):
            raise MinigptError(
                f"--budget {self.budget}: give iters=N, tokens=N or seconds=S (one of them)"
            )
        if number:  # read as --set reads a number, so that 017 is refused here as there
            number = parse_yaml(text.strip(), "--budget", f"budget.{kind.strip()}")
        return {
            **({"seeds": self.seeds} if self.seeds is not None else {}),
            **({"budget": {kind.strip(): number}} if self.budget is not None else {}),
        }


#: The shipped experiments (package data): ``minigpt sweep ffn`` runs ``ffn.yaml`` there.
SHIPPED = resources.files(__package__) / "shipped"


def list_experiments() -> list[str]:
    """The names of the shipped sweep files, sorted (``base`` is their base config)."""
    return sorted(p.name[: -len(".yaml")] for p in SHIPPED.iterdir() if p.name.endswith(".yaml"))


def _shipped(path: str | Path) -> Optional[Path]:
    """The shipped experiment file ``path`` names (``ffn``, ``ffn.yaml``, ``experiments/ffn.yaml``),
    else None."""
    p = Path(path)
    name = p.name[: -len(".yaml")] if p.name.endswith(".yaml") else p.name
    found = SHIPPED / f"{name}.yaml"
    return (
        found
        if p.parent in (Path("."), Path("experiments"))
        and name in list_experiments()
        and isinstance(found, Path)
        else None
    )


def resolve_sweep(path: str | Path) -> Path:
    """The sweep file ``path`` names: the file itself, else the shipped experiment of that name
    (:data:`SHIPPED`). Raises MinigptError: neither."""
    p = Path(path)
    found = (
        p if p.exists() or p.is_symlink() else _shipped(p)
    )  # a dangling link: read_yaml names it
    if found is None:
        shipped = ", ".join(e for e in list_experiments() if e != "base")
        raise MinigptError(
            f"{p}: no such sweep file, nor a shipped experiment of that name ({shipped})"
        )
    return found


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "", value_text(value)) or "x"


@dataclass
class Run:
    """One run of the sweep: a variant at a seed, its validated config and the ``--set`` values that
    give it."""

    variant: str
    seed: int
    cfg: Config
    overrides: list[str]
    group: Optional[dict] = None  # for the run's trackers: the sweep, the trial and its settings

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


class Sweep:
    """A sweep file read and checked: its runs, in order, each with its validated config (none for a
    search: its trials' runs come from :meth:`runs_of`), and what to record of it (the file as read,
    the overrides)."""

    def __init__(
        self,
        path: Path,
        spec: SweepFile,
        recorded: dict,
        overrides: Overrides,
        base: Path,
        base_data: dict,
    ):
        self.path, self.spec, self.recorded, self.overrides = path, spec, recorded, overrides
        self.base, self.base_data = base, base_data
        self.name = spec.name or path.stem
        self.folder = Path(spec.out_dir) / self.name
        self.sets = [*spec.set, *overrides.set]
        self.runs: list[Run] = []

    def runs_of(self, variant: str, values: dict[str, Any]) -> list[Run]:
        """The runs of one variant (the sweep's overrides, then ``values``, the budget, a seed): one
        per seed."""
        sets = [*self.sets, *(f"{k}={value_text(v)}" for k, v in values.items())]
        source = f"{self.path}: variant {variant}"
        try:
            cfg = validate(apply_overrides(self.base_data, sets), source)
        except ConfigError:
            self._blame_overrides()
            raise
        sets += self.spec.budget.overrides(cfg)
        if self.overrides.scale_schedule:
            given = Budget.model_validate(
                self.recorded["budget"]
            )  # the file's, which its schedule fits
            factor = self.spec.budget.steps(cfg) / given.steps(cfg)
            sets += scaled_schedule(cfg.train, factor)
        seeds = (
            self.spec.seeds
            if isinstance(self.spec.seeds, list)
            else [cfg.seed + i for i in range(self.spec.seeds)]
        )
        planned = []
        for seed in seeds:
            run_sets = [*sets, f"seed={seed}"]  # the schema bounds the seed: 0 .. 2**32-1
            planned.append(
                Run(
                    variant,
                    seed,
                    validate(apply_overrides(self.base_data, run_sets), source),
                    run_sets,
                    {"sweep": self.name, "trial": variant, "settings": values},
                )
            )
        return planned

    def _blame_overrides(self) -> None:
        """A variant's config failed: raise ConfigError naming the file's ``set:`` or the command
        line's ``--set`` instead where the base with those alone fails (then no variant could pass);
        return where it passes."""
        validate(apply_overrides(self.base_data, list(self.spec.set)), f"{self.path}: set")
        validate(apply_overrides(self.base_data, self.sets), "--set")


def _variants(spec: SweepFile) -> list[tuple[str, dict[str, Any]]]:
    """(variant name, its overrides): the grid's combinations (named key-value_key-value), then the
    named ones."""
    keys = list(spec.grid)
    grid = (
        [dict(zip(keys, combo)) for combo in itertools.product(*spec.grid.values())] if keys else []
    )
    named = [
        ("_".join(f"{k.rpartition('.')[2]}-{_slug(v)}" for k, v in g.items()), g) for g in grid
    ]
    return [*named, *spec.variants.items()]


def load_sweep(
    path: str | Path,
    echo: Callable[[str], None] = lambda m: None,
    overrides: Overrides = Overrides(),
) -> Sweep:
    """Read and check a sweep file (a path, or a shipped experiment's name) with the command line's
    overrides, every run's config (a search: every parameter's ends or choices) validated before
    anything runs. Raises MinigptError: the file, an override, the base config or a variant's config
    is wrong."""
    p = resolve_sweep(path)
    data = read_yaml(p, "sweep file")
    recorded = read_model(SweepFile, data, "{path}: {why}", path=p).model_dump(mode="json")
    given = overrides.sections()  # the file alone passed: a problem now is the command line's
    if overrides.scale_schedule and (
        "budget" not in given or "seconds" in given["budget"] or recorded["budget"].get("seconds")
    ):
        raise MinigptError(
            "--scale-schedule scales the schedule by the steps of --budget over the sweep file's "
            f"budget ({Budget.model_validate(recorded['budget']).text()})",
            "give --budget iters=N or tokens=N with it, against a file's budget in iters or tokens",
        )
    for key in given:  # each option on its own first, so that a refusal names the one at fault
        read_model(
            SweepFile,
            {**(data if isinstance(data, dict) else {}), key: given[key]},
            "{path}: {why}",
            path=f"--{key}",
        )
    spec = read_model(
        SweepFile,
        {**(data if isinstance(data, dict) else {}), **given},
        "{path}: {why}",
        path=" and ".join(f"--{key}" for key in given) or p,
    )
    sweep_name = runs.check_name(
        spec.name or p.stem, f"{p}: name:"
    )  # the sweep's folder: never a path out of out_dir
    variants = _variants(spec)
    for variant, _ in variants:
        runs.check_name(variant, f"{p}: variants:")
    names = [v for v, _ in variants]
    same = next((v for i, v in enumerate(names) if v in names[:i]), None)
    near = p.parent / spec.base
    # Beside the sweep file, then a shipped experiment's (a copied sweep file's base.yaml), then a
    # shipped config.
    base = near if near.is_file() else _shipped(spec.base) or resolve_config(Path(spec.base), echo)
    overriding = [
        ("set", [item.split("=", 1)[0].strip() for item in spec.set]),
        ("--set", [item.split("=", 1)[0].strip() for item in overrides.set]),
        ("grid", list(spec.grid)),
        *((f"variants.{v}", list(o)) for v, o in spec.variants.items()),
    ]
    where = next((where for where, keys in overriding if OUT_DIR in keys), None)
    seeds = spec.seeds if isinstance(spec.seeds, list) else None
    searched = set(spec.search.params) if spec.search else set()
    # A folder is refused by read_yaml; what is not there is looked for among the shipped configs.
    base_data = read_yaml(base, f"{p}: base: config") if base.exists() else {}
    if sum(v is not None for v in spec.budget.model_dump().values()) != 1:
        raise MinigptError(f"{p}: budget: give exactly one of iters, tokens or seconds")
    if seeds and len(set(seeds)) != len(seeds):
        raise MinigptError(f"{p}: seeds: the list must be without repeats")
    if not variants and not spec.search:
        raise MinigptError(f"{p}: give grid: or variants: (at least one variant to run)")
    if searched & set(spec.grid):
        key = min(searched & set(spec.grid))
        raise MinigptError(f"{p}: search.params and grid both set {key}; give it in one of them")
    if spec.search and spec.variants:
        raise MinigptError(
            f"{p}: search: and variants: cannot go together; give the variants' keys as lists of "
            "choices under search.params"
        )
    if same:
        a, b = dict(variants[::-1])[same], dict(variants)[same]
        raise MinigptError(
            f"{p}: variants {a!r} and {b!r} get the same name {same!r}; name them under variants: "
            "instead"
        )
    if where:
        raise MinigptError(
            f"{p}: {where}: train.out_dir cannot be set in a sweep: its runs go in the sweep's "
            f"folder, {Path(spec.out_dir) / sweep_name}; choose that folder with out_dir: (and "
            "name:) in the sweep file"
        )
    if not base.exists():
        shipped = ", ".join(["base", *list_configs()])
        raise MinigptError(
            f"{p}: base: config file {spec.base!r} not found, neither beside the sweep file "
            f"({near}) nor among the shipped configs; give a config's path relative to the sweep "
            f"file, or one of {shipped}"
        )
    if not isinstance(base_data, (dict, type(None))):
        raise MinigptError(f"{p}: base: {base} must hold a mapping of config sections")
    sweep = Sweep(p, spec, recorded, overrides, Path(base), base_data or {})
    if spec.search:
        # The grid's keys are searched as lists of choices; every value a trial may get is validated
        # now.
        spec.search = spec.search.model_copy(update={"params": {**spec.grid, **spec.search.params}})
        for key in spec.search.params:
            for value in spec.search.values(key):
                sweep.runs_of(f"search.params.{key}={value_text(value)}", {key: value})
        spec.grid = {}
    else:
        sweep.runs = [run for variant, values in variants for run in sweep.runs_of(variant, values)]
    return sweep


def schedule_note(sweep: Sweep) -> Optional[str]:
    """One line, when the budget leaves the sweep's runs without part of their schedule
    (:func:`schedule_problems`), naming the keys to scale; None when it fits (or the budget is in
    seconds)."""
    if sweep.spec.budget.seconds is not None:
        return None
    problems: dict[str, str] = {}
    for run in sweep.runs or sweep.runs_of(
        "search", {}
    ):  # a search's: the base's, before its values
        problems = {**schedule_problems(run.cfg.train), **problems}
    if not problems:
        return None
    scaled = "" if sweep.overrides.scale_schedule else ", or add --scale-schedule"
    keys, *said = sorted(problems), *problems.values()
    what = " and ".join([", ".join(said[:-1]), said[-1]] if len(said) > 1 else said)
    return (
        f"note: with budget {sweep.spec.budget.text()} a run {what}: "
        f"scale {' and '.join(keys)} with the budget{scaled}"
    )


def plan(sweep: Sweep) -> dict:
    """What the sweep would run (a search: its base, before the trials' values), with each run's
    schedule in steps, and the :func:`schedule_note`: ``minigpt sweep --dry-run``."""
    runs_ = sweep.runs or sweep.runs_of("trial", {})
    return {
        "sweep": sweep.name,
        "folder": str(sweep.folder),
        "trials": sweep.spec.search.trials if sweep.spec.search else None,
        "note": schedule_note(sweep),
        "runs": [
            {
                "run": r.name,
                "variant": r.variant,
                "seed": r.seed,
                **{
                    k: getattr(r.cfg.train, k)
                    for k in ("max_iters", "max_seconds", "warmup_iters", "eval_interval")
                },
            }
            for r in runs_
        ],
    }


def format_plan(planned: dict) -> str:
    """:func:`plan` as the lines ``--dry-run`` prints."""
    what = (
        f"a search of {planned['trials']} trials, each run as this one (before its values)"
        if planned["trials"]
        else f"{len(planned['runs'])} runs"
    )
    lines = [f"sweep {planned['sweep']}: {what}, in {planned['folder']}; nothing trained:"]
    for r in planned["runs"]:
        budget = f"{r['max_seconds']:g} s" if r["max_seconds"] else f"{r['max_iters']:,} steps"
        lines.append(
            f"  {r['run']}: {budget}, warmup {r['warmup_iters']:,}, "
            f"an eval every {r['eval_interval']:,} steps"
        )
    return "\n".join(lines) + "\n"


def _difference(old: Any, new: Any, where: str = "") -> Optional[str]:
    """The first place two parsed documents differ, as ``key: old -> new``."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            found = _difference(old.get(key), new.get(key), f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    return None if old == new else f"{where or 'the file'}: {json.dumps(old)} -> {json.dumps(new)}"


def _settings(sweep: Sweep) -> dict[str, Any]:
    """What a sweep's runs depend on: the sweep file and base config as read, and the command line's
    overrides."""
    return {"sweep": sweep.recorded, "base": sweep.base_data, "overrides": sweep.overrides.record()}


def _check_study(study: "optuna.Study", sweep: Sweep, storage: str) -> None:
    """Record the sweep's settings in the study its first worker opens; refuse a worker whose sweep
    file, base or overrides differ (its runs would mix with the study's as seeds or trials of other
    settings)."""
    record = json.loads(json.dumps(_settings(sweep)))  # as the study's JSON attribute holds it
    held = study.user_attrs.get("minigpt_sweep")
    if held is None:
        study.set_user_attr("minigpt_sweep", record)
    what = held is not None and _difference(held, record)
    if what:
        raise MinigptError(
            f"the study {sweep.name!r} in {storage} was started with other settings ({what}); join "
            "it with the same sweep file and --set/--seeds/--budget/--scale-schedule, or give the "
            "sweep another name:"
        )


def _read_state(
    sweep: Sweep,
    jobs: int,
    worker: bool = False,
    storage: Optional[str] = None,
    write: bool = True,
) -> dict:
    """The sweep's state, created on the first start; refuses a changed sweep or other overrides
    once a run saved a checkpoint. Workers share the folder: another one may be writing it as this
    one starts."""
    path = sweep.folder / runs.SWEEP
    record = {**_settings(sweep), "storage": storage}
    state = (
        read_model(
            _State,
            path,
            "{path} is damaged ({why}); restore it, or move the sweep's folder away to start anew",
            path=path,
        ).model_dump()
        if path.is_file()
        else None
    )
    changed = [
        (part, source, what)
        for part, source in (("sweep", sweep.path), ("base", sweep.base), ("overrides", None))
        if state and (what := _difference(state[part], record[part]))
    ]
    # No run has a checkpoint yet (e.g. a failed download): the edited sweep replaces the record.
    trained = changed and (
        state["done"] or any(runs.has_checkpoint(d) for d in sweep.folder.iterdir() if d.is_dir())
    )
    cores = os.cpu_count() or 1
    other_study = (
        state
        and state.get("storage") != storage
        and (
            state["done"]
            or any(runs.has_checkpoint(d) for d in sweep.folder.iterdir() if d.is_dir())
        )
    )
    folder = sweep.folder
    if not 1 <= jobs <= cores:
        raise MinigptError(
            f"--jobs {jobs}: use 1 to {cores} (this machine's cores); more jobs than cores only "
            "share them"
        )
    if state is None and not worker and folder.is_dir() and any(folder.iterdir()):
        raise MinigptError(
            f"{folder} exists and is not a sweep's folder (no sweep.json); give the sweep in "
            f"{sweep.path} another name:"
        )
    if other_study:
        held = state.get("storage") or "the folder's own study.journal"
        given = storage or "the folder's own study.journal"
        raise MinigptError(
            f"{folder} holds the runs of the study in {held}, not {given}: its trials would be "
            "scored under another study's settings; pass that storage, or give the sweep another "
            "name:"
        )
    if trained:
        part, source, what = changed[0]
        what = (
            f"the command line's --set/--seeds/--budget/--scale-schedule changed since this sweep "
            f"started in {folder} ({what}); give the ones it started with"
            if part == "overrides"
            else f"{source} changed since this sweep started in {folder} ({what}); restore it"
        )
        raise MinigptError(f"{what}, or move {folder} away to start it afresh")
    if state is not None and not changed:
        return state
    state = {**record, "done": []}
    if not write:  # a dry run: every refusal above, nothing written
        return state
    sweep.folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(state, indent=1) + "\n")
    return state


def _mark_done(sweep: Sweep, state: dict, run: Run) -> None:
    done = set(state["done"]) | {run.name}
    state["done"] = [
        r.name for r in sweep.runs if r.name in done
    ]  # the file's order, which compare keeps
    atomic_write_text(sweep.folder / runs.SWEEP, json.dumps(state, indent=1) + "\n")


def _resumable(sweep: Sweep, run: Run) -> bool:
    """Whether ``run`` resumes a checkpoint a killed sweep left; a folder without one is emptied to
    start afresh."""
    folder = sweep.folder / run.name
    if folder.is_dir() and runs.has_checkpoint(folder):
        return True
    if folder.is_dir():
        runs.clear_unsaved(folder)
    return False


def _run_in_process(
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
        *[w for item in [*run.overrides, f"train.out_dir={sweep.folder}"] for w in ("--set", item)],
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

    prctl = ctypes.CDLL(
        None, use_errno=True
    ).prctl  # every Linux C library has had it since Linux 2.1.57
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


class _Processes:
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
            ended = (
                proc.poll() is not None
            )  # asked before reading: an ended run's last evals are heard too
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


def _parallel(
    procs: Optional[_Processes], tasks: list[Callable[[], Any]], done: Callable[[Any], None]
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


def run_sweep(
    path: str | Path,
    *,
    jobs: Optional[int] = None,
    progress: Optional[bool] = None,
    overrides: Overrides = Overrides(),
    storage: Optional[str] = None,
    worker: bool = False,
    dry_run: bool = False,
    echo: Callable[[str], None] = lambda m: None,
) -> dict:
    """Run (or finish) a sweep (a search: its trials), then write its summary; with ``worker``, as
    one of the processes sharing the study in ``storage``; ``dry_run``: check everything, say what
    would run (:func:`plan`) and write nothing. Raises MinigptError (a bad kernel setting, sweep
    file, state or storage, a failed run) and Interrupted (Ctrl-C: checkpoints saved, the same
    command goes on)."""
    from tqdm.auto import tqdm

    check_settings()  # the runs would each refuse a bad MINIGPT_ONEDNN / MINIGPT_FAST_DROPOUT: refuse it once, first
    if worker and storage is None:
        raise MinigptError(
            "--worker joins a study in shared storage: give it with --storage URL (an RDB URL or a "
            "journal file)"
        )
    sweep = load_sweep(path, echo, overrides)
    if storage is not None and not (worker or sweep.spec.search):
        raise MinigptError(
            "--storage holds a search's study, or the runs --worker processes share: add --worker, "
            "or give the sweep file a search: section"
        )
    note = schedule_note(sweep)
    if (
        dry_run
    ):  # the refusals a start would make (a changed sweep, a foreign folder), then the plan
        _read_state(sweep, jobs if jobs is not None else 1, worker, storage, write=False)
        echo(note) if note else None
        return plan(sweep)
    # Shared storage is opened before the sweep's folder is made: one that cannot be is refused with
    # nothing written.
    store = optuna_search.open_storage(storage, sweep.folder) if storage else None
    jobs = jobs if jobs is not None else default_jobs(sweep, echo)
    state = _read_state(sweep, jobs, worker, storage)
    if note:  # before any run: a shrunk budget's curves and columns would mean little
        echo(note)
    procs = _Processes(sweep, jobs) if jobs > 1 else None
    train = procs.train if procs else lambda run, on_eval=None: _run_in_process(sweep, run, on_eval)
    bar = partial(
        tqdm,
        desc=f"sweep {sweep.name}",
        unit="run",
        dynamic_ncols=True,
        file=sys.stderr,
        disable=None if progress is None else not progress,
    )
    if sweep.spec.search:
        store = store or optuna_search.open_storage(
            None, sweep.folder
        )  # the study.journal beside the runs
        return _search(
            sweep,
            store,
            worker,
            train,
            procs,
            bar,
            echo,
            storage or "the sweep folder's study.journal",
        )
    if worker:
        return _grid_worker(sweep, store, train, procs, bar, echo, storage)
    gone = [
        r.name
        for r in sweep.runs
        if r.name in state["done"] and not runs.has_checkpoint(sweep.folder / r.name)
    ]
    if gone:  # a finished run's folder deleted (or its checkpoints): trained again, not refused by compare
        echo(
            f"note: {', '.join(gone)}: finished, but no longer in the sweep's folder (no "
            "checkpoint); training again"
        )
        state["done"] = [name for name in state["done"] if name not in gone]
    todo = [r for r in sweep.runs if r.name not in state["done"]]
    cut = [
        r.name for r in todo if runs.has_checkpoint(sweep.folder / r.name)
    ]  # what a stopped sweep left
    echo(
        f"sweep {sweep.name}: {len(sweep.runs)} runs ({len(sweep.runs) - len(todo)} done"
        f"{f', {len(cut)} to resume: ' + ', '.join(cut) if cut else ''}), "
        f"{len({r.variant for r in sweep.runs})} variants; runs in {sweep.folder}"
    )
    with bar(total=len(sweep.runs), initial=len(sweep.runs) - len(todo)) as progress_bar:

        def done(run: Run) -> None:
            _mark_done(sweep, state, run)
            progress_bar.update(1)
            _say_over(progress_bar, echo, _ran(run.name, run.seed, sweep.folder / run.name))

        _parallel(procs, [partial(lambda run: train(run) or run, run) for run in todo], done)
    return _summary(
        sweep,
        [sweep.folder / r.name for r in sweep.runs],
        {r.name: r.variant for r in sweep.runs},
        echo,
    )


def _ran(name: str, seed: int, folder: Path) -> str:
    """The line a finished run gets: its name, seed, last val loss and training time (evals
    included)."""
    evals = [e for e in read_events(folder / METRICS) if e["event"] == "eval"]
    last = evals[-1] if evals else {"val_loss": math.nan, "elapsed_s": 0.0, "step": 0}
    return (
        f"{name}: seed {seed}, val {last['val_loss']:.4f} at step {last['step']:,}, "
        f"{last['elapsed_s']:.1f} s"
    )


def _say_over(progress_bar: Any, echo: Callable[[str], None], line: str) -> None:
    """``echo`` a line with the progress bar (if shown) cleared around it, so that a log file or a
    pipe, which gets no bar, hears of every finished run as it ends."""
    with progress_bar.external_write_mode(file=sys.stderr):
        echo(line)


def _summary(
    sweep: Sweep,
    paths: Iterable[Path],
    variants: dict[str, str],
    echo: Callable[[str], None],
    stopped: Iterable[Path] = (),
    notes: Iterable[str] = (),
) -> dict:
    """The sweep's summary of the run folders ``paths`` (``variants``: folder name -> variant),
    written beside its runs; ``stopped``: runs cut short on purpose (pruned), which never set the
    target; ``notes`` go with it (said at once when there is no run to read)."""
    paths, notes = list(paths), list(notes)
    if not paths:
        for note in notes:
            echo(note)
        return {}
    return summarize(
        paths,
        out=sweep.folder,
        target=sweep.spec.target_loss,
        variants=variants,
        stopped=list(stopped),
        notes=notes,
        echo=echo,
    )


def _grid_worker(
    sweep: Sweep,
    storage: "optuna.storages.BaseStorage",
    train: Callable,
    procs: Optional[_Processes],
    bar: Callable,
    echo: Callable[[str], None],
    where: str,
) -> dict:
    """One worker of a grid shared by many through the study alone: each (variant, seed) is a trial
    enqueued once (:func:`.search.enqueue_runs`), and each worker trains the next waiting one
    (:func:`.search.next_run`) in its own sweep folder, telling the study its final val loss; then
    the summary of this worker's runs and the study's trials (:func:`.compare.study_trials`), every
    worker's."""
    from optuna.trial import TrialState

    study = optuna_search.open_study(storage, sweep.name, None, None)
    _check_study(study, sweep, where)
    optuna_search.enqueue_runs(study, [(r.name, r.variant, r.seed) for r in sweep.runs])
    by_name = {r.name: r for r in sweep.runs}
    echo(
        f"sweep {sweep.name}: worker {optuna_search.owner()} of {len(sweep.runs)} runs; runs in {sweep.folder}"
    )

    def runs_(progress_bar) -> None:
        while (trial := optuna_search.next_run(study, sweep.folder)) is not None:
            run = by_name[trial.user_attrs["run"]]
            trial.suggest_categorical("variant", sorted({r.variant for r in sweep.runs}))
            trial.suggest_categorical("seed", sorted({r.seed for r in sweep.runs}))
            try:
                train(run)
            except BaseException as exc:
                if isinstance(
                    exc, MinigptError
                ):  # a failed run fails its trial: the next start enqueues it again
                    trial.set_user_attr("error", str(exc))
                    study.tell(trial, state=TrialState.FAIL)
                else:  # Ctrl-C: the trial stays running, let go for the next start to resume
                    optuna_search.release(trial)
                raise
            study.tell(trial, _final_val(sweep.folder / run.name))
            progress_bar.update(1)
            _say_over(progress_bar, echo, _ran(run.name, run.seed, sweep.folder / run.name))

    with bar(total=len(sweep.runs)) as progress_bar:
        _parallel(
            procs, [partial(runs_, progress_bar)] * (procs.jobs if procs else 1), lambda ran: None
        )
    finished = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("run") in by_name
    ]
    found, notes = _study_runs(
        sweep, study, finished, lambda t: [t.user_attrs["run"]], lambda t: True
    )
    variants = {p.name: by_name[p.name].variant for p in found}
    return {**_summary(sweep, found, variants, echo, (), notes), "study": study_trials(study)}


def _search(
    sweep: Sweep,
    storage: "optuna.storages.BaseStorage",
    worker: bool,
    train: Callable,
    procs: Optional[_Processes],
    bar: Callable,
    echo: Callable[[str], None],
    where: str,
) -> dict:
    """The sweep's search: trials asked of Optuna's study (resumed where a killed worker left one)
    until it has ``trials``, each trained by ``train``; then the summary, a row per trial, and the
    search's report."""
    from optuna.trial import TrialState

    spec = sweep.spec.search
    # Workers seeded alike would ask the same first values: only a single process's search is
    # reproducible.
    seed = (
        None
        if worker
        else spec.seed
        if spec.seed is not None
        else validate(apply_overrides(sweep.base_data, sweep.sets), str(sweep.path)).seed
    )
    study = optuna_search.open_study(storage, sweep.name, spec, seed)
    _check_study(study, sweep, where)
    key = "final_val" if spec.objective == "val_loss" else "bits_per_byte"

    def objective(runs_: list[Run]) -> Optional[float]:
        return summarize(
            [sweep.folder / r.name for r in runs_], variants={r.name: r.variant for r in runs_}
        )["rows"][0].get(key)

    def trials(progress_bar) -> int:
        ran = 0
        while (trial := optuna_search.next_trial(study, spec.trials, sweep.folder)) is not None:
            outcome = None
            try:
                outcome = optuna_search.run_trial(
                    study, trial, spec, sweep.runs_of, train, objective
                )
            finally:
                if (
                    outcome is None
                ):  # Ctrl-C, a bug: the trial stays running, let go for the next start to resume
                    optuna_search.release(trial)
            progress_bar.update(1)
            progress_bar.set_postfix_str(f"{optuna_search.trial_name(trial.number)} {outcome}")
            for name in trial.user_attrs.get("runs", []):
                if (
                    sweep.folder / name / METRICS
                ).is_file():  # a pruned trial's later seeds never ran
                    seed = int(name.rpartition("-s")[2])
                    _say_over(
                        progress_bar, echo, f"{_ran(name, seed, sweep.folder / name)}, {outcome}"
                    )
            ran += 1
        return ran

    ended = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.number < spec.trials and t.state.is_finished()
    ]
    echo(
        f"sweep {sweep.name}: a {spec.method} search of {spec.trials} trials ({len(ended)} done), pruning: "
        f"{spec.prune}; runs in {sweep.folder}"
    )
    with bar(total=spec.trials, initial=len(ended)) as progress_bar:
        _parallel(
            procs, [partial(trials, progress_bar)] * (procs.jobs if procs else 1), lambda ran: None
        )
    ours = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.number < spec.trials and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
    ]
    if not ours:
        raise MinigptError(
            f"{sweep.folder}: no trial of the search completed (each failed or is still running); "
            "see its runs' train.log"
        )
    label = {
        t.number: optuna_search.trial_name(t.number)
        + (" (pruned)" if t.state == TrialState.PRUNED else "")
        for t in ours
    }
    found, notes = _study_runs(
        sweep,
        study,
        ours,
        lambda t: t.user_attrs.get("runs", []),
        lambda t: spec.objective == "val_loss" and t.state == TrialState.COMPLETE,
    )
    pruned = [path for path, t in found.items() if t.state == TrialState.PRUNED]
    # No run to read: a worker whose trials all ran where it cannot see them.
    result = _summary(
        sweep, found, {p.name: label[t.number] for p, t in found.items()}, echo, pruned, notes
    )
    result["search"] = optuna_search.report(study, spec.trials, sweep.folder)
    return {**result, "study": study_trials(study)} if worker else result


def _study_runs(
    sweep: Sweep,
    study: "optuna.Study",
    finished: list,
    names: Callable[[Any], list[str]],
    told_final: Callable[[Any], bool],
) -> tuple[dict[Path, Any], list[str]]:
    """The run folders of the study's ``finished`` trials, as the study records them (each trial's
    ``folder`` and its runs' ``names``), with the trial of each; and a note for every run folder of
    this sweep's that no finished trial owns (a worker killed mid-trial, whose trial another worker
    finished): it is unfinished and never scored. A trial for which ``told_final`` holds told the
    study its runs' mean final val loss: a folder whose evals end elsewhere (the same path on
    another machine) is not that trial's."""
    found: dict[Path, Any] = {}
    owner: dict[str, str] = {}  # run name -> where the trial that owns it finished
    for t in finished:
        folder = Path(t.user_attrs.get("folder") or sweep.folder)
        paths = [folder / name for name in names(t) if (folder / name / METRICS).is_file()]
        finals = [_final_val(p) for p in paths]
        if told_final(t) and paths and not math.isclose(sum(finals) / len(finals), t.value):
            paths = []
        for name in names(t):
            owner[name] = f"{optuna_search.trial_name(t.number)} finished in {folder / name}" + (
                f" on {t.user_attrs['host']}" if "host" in t.user_attrs else ""
            )
        found.update((p, t) for p in paths)
    ours = {p.resolve() for p in found}
    running = {
        name: f"{optuna_search.trial_name(t.number)} is still running"
        + (f" ({t.user_attrs['owner']})" if t.user_attrs.get("owner") else "")
        for t in study.get_trials(deepcopy=False)
        if not t.state.is_finished()
        for name in [*t.user_attrs.get("runs", []), t.user_attrs.get("run")]
        if name
    }
    notes = [
        f"note: {d} is unfinished and not scored: "
        + (owner.get(d.name) or running.get(d.name) or "no finished trial of the study owns it")
        for d in sorted(sweep.folder.iterdir() if sweep.folder.is_dir() else [])
        if (d / runs.CONFIG).is_file() and d.resolve() not in ours
    ]
    return found, notes


def _final_val(run: Path) -> float:
    """The val loss of a run's last eval (metrics.jsonl); NaN when it has none."""
    evals = [e for e in read_events(run / METRICS) if e["event"] == "eval"]
    return evals[-1]["val_loss"] if evals else math.nan
