"""The sweep file: its schema, the shipped experiments, reading one into its runs, and its plan.

A sweep file (docs/experiments.md) names a ``base:`` config, ``set:`` values for every run, its
variants (a ``grid:`` of values, or named ``variants:``) or a ``search:`` (:mod:`.search`), the
``seeds:`` and each run's ``budget:``, and optionally ``target_loss:``, ``name:`` and ``out_dir:``.
:func:`load_sweep` reads one with the command line's :class:`Overrides` into a :class:`Sweep`, every
run's config validated; :func:`plan` is what ``minigpt sweep --dry-run`` says would run."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..config.schema import Config, ConfigError, TrainConfig, apply_overrides, validate
from ..config.yaml_io import parse_yaml, read_yaml
from ..errors import MinigptError
from ..paths import list_configs, resolve_config
from ..run import folder as runs
from .compare import read_model, value_text
from .search import Key, Scalar, SearchSpec, Seed

#: The key a sweep sets itself: its runs go in ``<out_dir>/<name>/``.
OUT_DIR = "train.out_dir"


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
    # key=value
    set: list[Annotated[str, Field(pattern=r"^\s*[^=\s][^=]*=")]] = Field(default_factory=list)
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
                f"{runs_:,} runs ({variants:,} variants x seeds) is more than one sweep may ask "
                f"for ({MAX_RUNS:,}); split it into several sweep files"
            )
        return self


@dataclass(frozen=True)
class Overrides:
    """What the command line changes in a sweep file: ``--set`` (after its ``set:``, before the
    variants' values), ``--seeds`` and ``--budget`` (``iters=50``: in place of the file's)."""

    set: tuple[str, ...] = ()
    seeds: Optional[int] = None
    budget: Optional[str] = None
    # Scale the schedule's steps with the budget (:func:`scaled_schedule`).
    scale_schedule: bool = False

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
    # A dangling link is the file: read_yaml names it.
    found = p if p.exists() or p.is_symlink() else _shipped(p)
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
            # The file's budget, which its schedule fits.
            given = Budget.model_validate(self.recorded["budget"])
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
    # The sweep's folder: never a path out of out_dir.
    sweep_name = runs.check_name(spec.name or p.stem, f"{p}: name:")
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
    # A search's run: the base's, before its trials' values.
    for run in sweep.runs or sweep.runs_of("search", {}):
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
    schedule in steps, the :func:`schedule_note`, and the time it would take one run at a time
    (:func:`estimated_seconds`): ``minigpt sweep --dry-run``."""
    runs_ = sweep.runs or sweep.runs_of("trial", {})
    trials = sweep.spec.search.trials if sweep.spec.search else None
    return {
        "sweep": sweep.name,
        "folder": str(sweep.folder),
        "trials": trials,
        "pruned": bool(sweep.spec.search and sweep.spec.search.prune != "none"),
        "note": schedule_note(sweep),
        "seconds": estimated_seconds(runs_) * (trials or 1),
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


def estimated_seconds(runs_: list[Run]) -> float:
    """Seconds to train ``runs_`` one after another on this machine: each variant's run timed as
    ``train --dry-run`` times it (a few steps of a throwaway model, every eval counted), at every
    seed; a run with a seconds budget counts its budget."""
    from ..trainer.setup import plan as train_plan

    by_variant: dict[str, float] = {}
    for r in runs_:
        if r.variant not in by_variant:
            budget = r.cfg.train.max_seconds
            by_variant[r.variant] = (
                budget
                if budget is not None
                else train_plan(r.cfg, None, None, lambda message: None, False).seconds or 0.0
            )
    return sum(by_variant[r.variant] for r in runs_)


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
    from ..trainer.estimate import human_seconds

    runs_ = (
        f"{planned['trials']} trials" if planned["trials"] else f"the {len(planned['runs'])} runs"
    )
    lines.append(
        f"time: {'at most' if planned.get('pruned') else 'about'} "
        f"{human_seconds(planned['seconds'])} for {runs_}, one at a time ("
        + ("the base's steps" if planned["trials"] else "each variant's steps")
        + " timed as train --dry-run times them"
        + ("; a pruned trial ends sooner)" if planned.get("pruned") else ")")
    )
    return "\n".join(lines) + "\n"
