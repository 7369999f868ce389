"""A sweep file's ``search:``: Optuna suggests each trial's values, prunes bad trials at their evals
and keeps the study (a journal file in the sweep's folder, or shared storage that many workers
join); minigpt trains the runs.

Optuna: Akiba et al. 2019 (KDD); TPE: Bergstra et al. 2011 (NeurIPS), Optuna's ``TPESampler``; ASHA:
Li et al. 2020 (MLSys), Optuna's ``SuccessiveHalvingPruner``; the median rule: Golovin et al. 2017
(Vizier), ``MedianPruner``.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import socket
import time
import warnings
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import MinigptError
from ..fileio import STUDY_BOUNDS, atomic_write_bytes, check_readable, errors_as, read_problem

if TYPE_CHECKING:
    import optuna

#: The study's journal in the sweep's folder when no ``--storage`` is given.
STUDY_FILE = "study.journal"
#: Where workers on one machine take turns to take a trial (an flock on it).
LOCK_FILE = "claims.lock"
#: The summary's Optuna plots (optuna.visualization.matplotlib).
PLOTS = ("search-history.png", "search-parallel.png", "search-importances.png")
#: How often a worker tries to open a new RDB storage that other workers are setting up at the same
#: moment.
SETUP_TRIES = 5
#: A claim's owner once it let go (Ctrl-C): any worker on any machine may take the trial or run
#: over.
RELEASED = ""

Choice = Union[bool, int, float, str, None]
Scalar = Union[bool, int, float, str, None, list]
Seed = Annotated[int, Field(ge=0, lt=2**32)]
Key = Annotated[str, Field(pattern=r"^\s*[^=\s]")]  # a config key, as --set spells it


class Range(BaseModel):
    """A parameter's range: integers when ``low`` and ``high`` are, else floats; ``log`` samples its
    logarithm."""

    model_config = ConfigDict(extra="forbid", strict=True)
    low: Union[int, float] = Field(allow_inf_nan=False)
    high: Union[int, float] = Field(allow_inf_nan=False)
    log: bool = False
    step: Optional[Union[int, float]] = Field(None, gt=0, allow_inf_nan=False)

    @property
    def integers(self) -> bool:
        return all(isinstance(v, int) for v in (self.low, self.high, self.step or 1))


class SearchSpec(BaseModel):
    """A sweep file's ``search:`` section (the README's sweep file)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    method: Literal["tpe", "random"] = "tpe"
    trials: int = Field(ge=1, le=10_000)
    prune: Literal["none", "median", "asha"] = "none"
    objective: Literal["val_loss", "bits_per_byte"] = "val_loss"
    seed: Optional[Seed] = None  # the sampler's; default: the base config's seed
    params: dict[Key, Union[Range, Annotated[list[Choice], Field(min_length=1)]]] = Field(
        min_length=1
    )

    @model_validator(mode="after")
    def _ranges(self) -> "SearchSpec":
        for key, r in self.params.items():
            if not isinstance(r, Range):
                continue
            if r.low > r.high:
                raise ValueError(
                    f"params.{key}: empty range (low {r.low} > high {r.high}); give low <= high"
                )
            if r.log and r.low <= 0:
                raise ValueError(
                    f"params.{key}: log: true needs low > 0 (got {r.low}); raise low, or drop log"
                )
            if r.log and r.step is not None:  # Optuna samples one or the other
                raise ValueError(f"params.{key}: give log: true or step:, not both")
        return self

    def values(self, key: str) -> list[Any]:
        """The values of parameter ``key`` a config must accept: its choices, or its range's
        ends."""
        p = self.params[key]
        return list(p) if isinstance(p, list) else [p.low, p.high]


def suggest(trial: "optuna.Trial", params: dict[str, Union[Range, list]]) -> dict[str, Any]:
    """The trial's value of each parameter (a trial that ran before gets back the values it had)."""
    out = {}
    for key, p in params.items():
        if isinstance(p, list):
            out[key] = trial.suggest_categorical(key, p)
        elif p.integers:
            out[key] = trial.suggest_int(key, p.low, p.high, step=p.step or 1, log=p.log)
        else:
            out[key] = trial.suggest_float(key, p.low, p.high, step=p.step, log=p.log)
    return out


def open_storage(
    url: Optional[str], folder: Optional[Path], existing: bool = False
) -> "optuna.storages.BaseStorage":
    """The study's storage: an RDB URL (``scheme://``), else a journal file (default: the sweep
    folder's :data:`STUDY_FILE`), as Optuna documents for distributed optimisation; ``existing``:
    only one already there (a journal file or SQLite database is never made). Raises MinigptError:
    it cannot be opened."""
    import sqlalchemy.exc
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend
    from sqlalchemy.engine import make_url

    target = url or str(folder / STUDY_FILE)

    file: Optional[str] = None
    what = "--storage study" if url else "study"

    def refused(exc: BaseException) -> MinigptError:
        there = file is not None and (existing or os.path.lexists(file))
        if there and isinstance(exc, (OSError, ValueError, sqlalchemy.exc.DatabaseError)):
            # The study's own file: unreadable, missing or a dangling link, or damaged.
            fix = "restore it from a copy, or move it away to start a new study"
            return read_problem(getattr(exc, "orig", None) or exc, file, what, fix)
        why = " ".join(
            (
                getattr(exc, "strerror", None) or str(exc).splitlines()[0] or type(exc).__name__
            ).split()
        )
        return MinigptError(_storage_problem(target, why[:200]))

    # A missing folder, a malformed URL, no such SQL dialect or driver, a database that does not
    # answer.
    with errors_as({(OSError, ValueError, ImportError, sqlalchemy.exc.SQLAlchemyError): refused}):
        rdb = "://" in target
        file = (
            make_url(target).database
            if rdb and target.startswith("sqlite")
            else None
            if rdb
            else target
        )
        if file is not None and (existing or os.path.lexists(file)):
            # Read before Optuna opens it, so that its cause is named: an OSError is the file's.
            check_readable(file, what, STUDY_BOUNDS)
        if not rdb:
            # Optuna replays the journal's records as it opens it: a record of the wrong shape (a
            # file damaged, or not a journal) fails there with the error of the field it lacks.
            with errors_as(
                {
                    (KeyError, TypeError, AttributeError, IndexError): lambda exc: refused(
                        ValueError(f"a record it cannot replay: {type(exc).__name__} {exc}")
                    )
                }
            ):
                return JournalStorage(JournalFileBackend(target))
        for attempt in range(SETUP_TRIES):
            try:
                storage = RDBStorage(target)
                if file is not None:
                    _immediate_transactions(storage.engine)
                return storage
            except sqlalchemy.exc.SQLAlchemyError as exc:
                # Workers starting together on a new database race to make its tables (Optuna's
                # setup is not atomic): the losers see "already exists" or alembic_version's unique
                # key, and try again.
                if attempt + 1 == SETUP_TRIES or not (
                    isinstance(exc, sqlalchemy.exc.IntegrityError) or "already exists" in str(exc)
                ):
                    raise
                time.sleep(0.2 * (attempt + 1))


def _immediate_transactions(engine: Any) -> None:
    """SQLite: every transaction takes the database's write lock as it begins (``BEGIN
    IMMEDIATE``, SQLAlchemy's pysqlite recipe). Optuna pops a waiting trial by reading its state
    and writing RUNNING in one transaction with ``SELECT ... FOR UPDATE``, which SQLite ignores:
    two workers could both read WAITING and both take one trial (seen as "Cannot tell a COMPLETE
    trial" in a two-worker grid). Connections opened before are closed, to reopen with it."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite's own deferred BEGIN off

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def _storage_problem(url: str, why: str) -> str:
    """What an unopenable ``--storage`` is told: its reason, and the storages that work for many
    workers."""
    return (
        f"--storage {url}: cannot open it ({why}); give an RDB URL (sqlite:///study.db, "
        "postgresql://user@host/db) or a journal file's path on a filesystem every worker sees"
    )


def open_study(
    storage: "optuna.storages.BaseStorage",
    name: str,
    spec: Optional[SearchSpec],
    seed: Optional[int],
) -> "optuna.Study":
    """The sweep's study in ``storage``, made by the first worker and joined by the others
    (minimised); the sampler's ``seed`` moves on by the trials the study holds, so a resumed search
    asks no values again."""
    import optuna

    optuna.logging.set_verbosity(
        optuna.logging.WARNING
    )  # our progress bar and summary say what happened
    if seed is not None:
        with suppress(KeyError):  # no such study yet
            seed += len(optuna.load_study(study_name=name, storage=storage).trials)
    method, prune = (spec.method, spec.prune) if spec else ("random", "none")
    sampler = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}[method](
        seed=seed
    )
    pruner = {
        "none": optuna.pruners.NopPruner,
        "median": optuna.pruners.MedianPruner,
        "asha": optuna.pruners.SuccessiveHalvingPruner,
    }[prune]()
    return optuna.create_study(
        storage=storage,
        study_name=name,
        direction="minimize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )


# ---------------------------------------------------------------------- claims: no trial or run
# twice


def owner() -> str:
    """This process, as a claim names it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def stale(who: Optional[str]) -> bool:
    """Whether a claim's owner let go (:data:`RELEASED`) or is a process of this machine that is
    gone (killed); a worker on another machine is never judged from here (None: a trial whose owner
    is being written)."""
    if who is None or who == RELEASED:
        return who == RELEASED
    host, _, pid = who.rpartition(":")
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
    except OSError as exc:
        return exc.errno == errno.ESRCH  # EPERM: another user's process of that number, alive
    return False


@contextmanager
def turn(folder: Path):
    """Hold the sweep folder's :data:`LOCK_FILE`: one worker (process or thread) of a machine at a
    time claims."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def enqueue_runs(study: "optuna.Study", runs: list[tuple[str, str, int]]) -> None:
    """Enqueue each grid run (name, variant, seed) the study lacks as a fixed trial
    (``study.enqueue_trial``): one with no trial, or whose trials all failed (started again, a
    failed run is tried again). Two workers starting at once may both enqueue a run:
    :func:`next_run` skips the later copy."""
    from optuna.trial import TrialState

    have = {
        t.user_attrs.get("run")
        for t in study.get_trials(deepcopy=False)
        if t.state != TrialState.FAIL
    }
    for name, variant, seed in runs:
        if name not in have:
            study.enqueue_trial(
                {"variant": variant, "seed": seed},
                user_attrs={"run": name, "variant": variant, "seed": seed},
            )


def take(trial: "optuna.Trial", folder: Path) -> "optuna.Trial":
    """Mark ``trial`` this worker's: its owner (:func:`owner`), host and the folder its runs go in,
    which ``minigpt compare --storage`` shows."""
    for key, value in (
        ("owner", owner()),
        ("host", socket.gethostname()),
        ("folder", str(folder.resolve())),
    ):
        trial.set_user_attr(key, value)
    return trial


def _resumed(
    study: "optuna.Study", folder: Path, ours: Callable[[Any], bool]
) -> Optional["optuna.Trial"]:
    """A trial (of those ``ours`` says) that a killed worker of this machine left running, taken
    over to resume."""
    import optuna
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if ours(t) and stale(t.user_attrs.get("owner")):
            # Optuna offers no public call to take over a running trial (its
            # RetryFailedTrialCallback re-enqueues a copy under a new number); Trial(study, id) is
            # how study.ask() builds one.
            return take(optuna.Trial(study, t._trial_id), folder)
    return None


def next_run(study: "optuna.Study", folder: Path) -> Optional["optuna.Trial"]:
    """The grid run this worker trains next (its name: the trial's user attr ``run``): one a killed
    worker of this machine left running, else the next waiting trial, which ``study.ask()`` hands to
    one worker only (RDB and journal storages pop it atomically); None when none is waiting. A copy
    of a run enqueued twice (a later trial of a run whose earlier one did not fail) and a fresh
    trial (the last waiting one went to another worker as this one asked) are failed unrun, marked
    ``duplicate`` and ``surplus``."""
    from optuna.trial import TrialState

    with turn(folder):
        resumed = _resumed(study, folder, lambda t: "run" in t.user_attrs)
        if resumed is not None:
            return resumed
        while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            trial = study.ask()
            run = trial.user_attrs.get("run")
            earlier = [
                t
                for t in study.get_trials(deepcopy=False)[: trial.number]
                if t.user_attrs.get("run") == run and t.state != TrialState.FAIL
            ]
            if run is not None and not earlier:
                return take(trial, folder)
            trial.set_user_attr("duplicate" if run is not None else "surplus", True)
            study.tell(trial, state=TrialState.FAIL)
        return None


def next_trial(study: "optuna.Study", trials: int, folder: Path) -> Optional["optuna.Trial"]:
    """The trial this worker runs next: one a killed worker of this machine left running (it
    resumes), else a new one while the study has fewer than ``trials``; None when none is left. A
    trial numbered past ``trials`` (two workers asked at once) is failed at once, unrun: trials 0 ..
    trials-1 are the search."""
    from optuna.trial import TrialState

    with turn(folder):
        resumed = _resumed(study, folder, lambda t: t.number < trials)
        if resumed is not None:
            return resumed
        if len(study.get_trials(deepcopy=False)) >= trials:
            return None
        trial = study.ask()
        if trial.number >= trials:
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=TrialState.FAIL)
            return None
        return take(trial, folder)


def release(trial: "optuna.Trial") -> None:
    """An interrupted trial stays running in the study, let go: the next start (here or elsewhere)
    resumes it."""
    trial.set_user_attr("owner", RELEASED)


def run_trial(
    study: "optuna.Study",
    trial: "optuna.Trial",
    spec: SearchSpec,
    runs_of: Callable[[str, dict], list],
    train: Callable[[Any, Callable[[int, float], bool]], bool],
    objective: Callable[[list], Optional[float]],
) -> str:
    """Train a trial's runs (one per seed) and tell the study how it ended: ``complete``, ``pruned``
    or ``failed``.

    ``train(run, on_eval)`` trains one run, stopping where ``on_eval`` says so. Each eval of seed
    ``i`` is reported at step ``i * max_iters + step``, so that trials compare at equal steps and
    seeds; a resumed trial reports only the evals its study lacks. Raises what ``train`` raises, but
    MinigptError (a diverged run: the trial failed).
    """
    from optuna.trial import TrialState

    runs_ = runs_of(trial_name(trial.number), suggest(trial, spec.params))
    trial.set_user_attr("runs", [r.name for r in runs_])
    seen = set(study.get_trials(deepcopy=False)[trial.number].intermediate_values)
    pruned: list[int] = []  # the step the pruner stopped the trial at
    for i, run in enumerate(runs_):
        offset = i * run.cfg.train.max_iters

        def report(step: int, value: float, offset: int = offset) -> bool:
            if offset + step not in seen:
                trial.report(value, offset + step)
                seen.add(offset + step)
            if trial.should_prune():
                pruned.append(offset + step)
            return bool(pruned)

        try:
            train(run, report)
        except MinigptError as exc:
            trial.set_user_attr("error", str(exc))
            study.tell(trial, state=TrialState.FAIL)
            return "failed"
        if pruned:
            study.tell(trial, state=TrialState.PRUNED)
            return "pruned"
    value = objective(runs_)
    if value is None:
        raise MinigptError(
            f"trial {trial.number}: no {spec.objective} to report (bits per byte could not be "
            "measured)"
        )
    study.tell(trial, value)
    return "complete"


def trial_name(number: int) -> str:
    """A trial's variant name: its runs are ``trial-0007-s1337``."""
    return f"trial-{number:04d}"


# ---------------------------------------------------------------------- the summary's part


def report(study: "optuna.Study", trials: int, folder: Path) -> dict:
    """The study's trials by state, the best trial, parameter importances (two completed trials or
    more) and :data:`PLOTS` written into ``folder`` with Optuna's matplotlib plots."""
    import optuna
    from optuna.trial import TrialState

    ours = [t for t in study.get_trials(deepcopy=False) if t.number < trials]
    complete = [t for t in ours if t.state == TrialState.COMPLETE]
    out: dict[str, Any] = {
        "trials": trials,
        **{
            s.name.lower(): sum(t.state == s for t in ours)
            for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
        },
    }
    if complete:
        best = min(complete, key=lambda t: t.value)
        out["best_trial"] = {
            "trial": trial_name(best.number),
            "value": best.value,
            "params": best.params,
        }
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    out["importances"] = (
        dict(optuna.importance.get_param_importances(study, evaluator=evaluator))
        if len(complete) >= 2
        else None
    )
    out["plots"] = _plots(study, folder, len(complete) >= 2, evaluator) if complete else []
    return out


def _plots(study: "optuna.Study", folder: Path, importances: bool, evaluator: Any) -> list[str]:
    """Draw :data:`PLOTS` (the importances only from two completed trials), each written
    atomically."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    drawn = {PLOTS[0]: plots.plot_optimization_history, PLOTS[1]: plots.plot_parallel_coordinate}
    if importances:
        drawn[PLOTS[2]] = lambda s: plots.plot_param_importances(s, evaluator=evaluator)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # optuna.exceptions.ExperimentalWarning: the plots are marked experimental
        for name, draw in drawn.items():
            fig = draw(study).figure
            fig.set_size_inches(10, 5)
            fig.tight_layout()
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=100)
            plt.close(fig)
            atomic_write_bytes(folder / name, png.getvalue())
    return list(drawn)


def format_report(search: dict) -> str:
    """The lines printed under the sweep's table."""
    lines = [
        f"search: {search['complete']} of {search['trials']} trials complete, {search['pruned']} pruned, "
        f"{search['fail']} failed" + (f", {search['running']} running" if search["running"] else "")
    ]
    if "best_trial" in search:
        best = search["best_trial"]
        values = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in best["params"].items()
        )
        lines.append(f"best: {best['trial']} ({best['value']:.4f}): {values}")
    if search["importances"]:
        lines.append(
            "importances: " + ", ".join(f"{k} {v:.2f}" for k, v in search["importances"].items())
        )
    if search["plots"]:
        lines.append("plots: " + ", ".join(search["plots"]))
    return "\n".join(lines) + "\n"
