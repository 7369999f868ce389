"""``minigpt sweep``: many runs of one base config, compared fairly, resumable after a kill (the
README's sweep file); runs go in ``<out_dir>/<name>/<variant>-s<seed>/``, the state in
``sweep.json`` beside them. A grid or named variants, or a ``search:`` (:mod:`.search`: Optuna's
trials); ``--worker``: one of many on a shared study.

Here: the state (``sweep.json``), refusing a changed sweep, the grid, the search and the summary;
the sweep file is :mod:`.sweepfile`'s, training each run (``--jobs``) :mod:`.jobs`'s."""

from __future__ import annotations

import json
import math
import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from pydantic import BaseModel, ConfigDict, Field

from ..config.schema import apply_overrides, validate
from ..errors import MinigptError
from ..fileio import atomic_write_text
from ..run import folder as runs
from ..run.metrics import METRICS, read_events
from ..runtime.kernels import check_settings
from . import search as optuna_search
from .compare import read_model, summarize
from .jobs import Processes, default_jobs, parallel, run_in_process, visible_gpus
from .sweepfile import (
    SHIPPED,
    Budget,
    Overrides,
    Run,
    Sweep,
    format_plan,
    list_experiments,
    load_sweep,
    plan,
    schedule_note,
)
from .trials import study_trials

if TYPE_CHECKING:
    import optuna

#: ``minigpt sweep``'s Python API: :func:`run_sweep`, and the sweep file's names (:mod:`.sweepfile`)
#: and ``--jobs``'s (:mod:`.jobs`) importable from here too.
__all__ = [
    "SHIPPED",
    "Budget",
    "Overrides",
    "default_jobs",
    "format_plan",
    "list_experiments",
    "load_sweep",
    "plan",
    "run_sweep",
    "visible_gpus",
]


class _State(BaseModel):
    """``sweep.json``: the sweep file and base config as read, the command line's overrides, and the
    runs done."""

    model_config = ConfigDict(strict=True)
    sweep: dict[str, Any]
    base: dict[str, Any]
    overrides: dict[str, Any] = Field(default_factory=dict)
    # The --storage whose study the runs belong to (None: the folder's own).
    storage: Optional[str] = None
    done: list[str] = Field(default_factory=list)


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
    # The file's order, which compare keeps.
    state["done"] = [r.name for r in sweep.runs if r.name in done]
    atomic_write_text(sweep.folder / runs.SWEEP, json.dumps(state, indent=1) + "\n")


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

    # The runs would each refuse a bad MINIGPT_ONEDNN / MINIGPT_FAST_DROPOUT: refuse it once, first.
    check_settings()
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
    # A dry run: the refusals a start would make (a changed sweep, a foreign folder), then the plan.
    if dry_run:
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
    procs = Processes(sweep, jobs) if jobs > 1 else None
    train = procs.train if procs else lambda run, on_eval=None: run_in_process(sweep, run, on_eval)
    bar = partial(
        tqdm,
        desc=f"sweep {sweep.name}",
        unit="run",
        dynamic_ncols=True,
        file=sys.stderr,
        disable=None if progress is None else not progress,
    )
    if sweep.spec.search:
        # The study.journal beside the runs.
        store = store or optuna_search.open_storage(None, sweep.folder)
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
    # A finished run's folder deleted (or its checkpoints): trained again, not refused by compare.
    if gone:
        echo(
            f"note: {', '.join(gone)}: finished, but no longer in the sweep's folder (no "
            "checkpoint); training again"
        )
        state["done"] = [name for name in state["done"] if name not in gone]
    todo = [r for r in sweep.runs if r.name not in state["done"]]
    # What a stopped sweep left.
    cut = [r.name for r in todo if runs.has_checkpoint(sweep.folder / r.name)]
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

        parallel(procs, [partial(lambda run: train(run) or run, run) for run in todo], done)
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
    procs: Optional[Processes],
    bar: Callable,
    echo: Callable[[str], None],
    where: str,
) -> dict:
    """One worker of a grid shared by many through the study alone: each (variant, seed) is a trial
    enqueued once (:func:`.search.enqueue_runs`), and each worker trains the next waiting one
    (:func:`.search.next_run`) in its own sweep folder, telling the study its final val loss; then
    the summary of this worker's runs and the study's trials (:func:`.trials.study_trials`), every
    worker's."""
    from optuna.trial import TrialState

    study = optuna_search.open_study(storage, sweep.name, None, None)
    _check_study(study, sweep, where)
    optuna_search.enqueue_runs(study, [(r.name, r.variant, r.seed) for r in sweep.runs])
    by_name = {r.name: r for r in sweep.runs}
    echo(
        f"sweep {sweep.name}: worker {optuna_search.owner()} of {len(sweep.runs)} runs; "
        f"runs in {sweep.folder}"
    )

    def runs_(progress_bar) -> None:
        while (trial := optuna_search.next_run(study, sweep.folder)) is not None:
            run = by_name[trial.user_attrs["run"]]
            trial.suggest_categorical("variant", sorted({r.variant for r in sweep.runs}))
            trial.suggest_categorical("seed", sorted({r.seed for r in sweep.runs}))
            try:
                train(run)
            except BaseException as exc:
                # A failed run fails its trial: the next start enqueues it again.
                if isinstance(exc, MinigptError):
                    trial.set_user_attr("error", str(exc))
                    study.tell(trial, state=TrialState.FAIL)
                else:  # Ctrl-C: the trial stays running, let go for the next start to resume
                    optuna_search.release(trial)
                raise
            study.tell(trial, _final_val(sweep.folder / run.name))
            progress_bar.update(1)
            _say_over(progress_bar, echo, _ran(run.name, run.seed, sweep.folder / run.name))

    with bar(total=len(sweep.runs)) as progress_bar:
        parallel(
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
    procs: Optional[Processes],
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
                # Ctrl-C, a bug: the trial stays running, let go for the next start to resume.
                if outcome is None:
                    optuna_search.release(trial)
            progress_bar.update(1)
            progress_bar.set_postfix_str(f"{optuna_search.trial_name(trial.number)} {outcome}")
            for name in trial.user_attrs.get("runs", []):
                # A pruned trial's later seeds never ran.
                if (sweep.folder / name / METRICS).is_file():
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
        f"sweep {sweep.name}: a {spec.method} search of {spec.trials} trials ({len(ended)} done), "
        f"pruning: {spec.prune}; runs in {sweep.folder}"
    )
    with bar(total=spec.trials, initial=len(ended)) as progress_bar:
        parallel(
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
