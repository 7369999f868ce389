"""Experiment trackers (TensorBoard, Weights & Biases, MLflow) behind one small interface.

Each tracker gets what metrics.jsonl gets, at the same call: the same steps and values, named
``<event>/<field>`` (``train/loss``, ``train/lr``, ``train/tokens_per_sec``, ``train/elapsed_s``,
``eval/train_loss``, ``eval/val_loss``, ``eval/elapsed_s``); TensorBoard keeps the tags it always
wrote (``train/loss``, ``train/lr``, ``loss/train``, ``loss/val``). Each also gets the resolved
config as the run's parameters, the run's name, and in a sweep a group (the sweep's name, the
trial's name and settings). Its run id is kept in the run folder's ``trackers.json``, so a resume
continues the same tracker run.

:func:`check` (at plan time, ``--dry-run`` too; ``minigpt train`` calls it before PyTorch loads)
refuses a tracker whose package is missing;
:func:`start` (before step 1) refuses one that cannot start; both as one line, exit 2. A tracker
that fails later is dropped with one warning and the run goes on: its own files are written as
always.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.util
import json
import logging
import netrc
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from ..errors import MinigptError
from ..fileio import atomic_write_text

#: The trackers ``train.trackers`` may name, each with the package it needs.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
#: The run folder's record of each tracker's run id (what a resume continues).
STATE = "trackers.json"
#: The environment variable a sweep's ``--jobs`` processes receive their group in (JSON).
GROUP_ENV = "MINIGPT_TRACKER_GROUP"
#: The W&B project and MLflow experiment of a run outside a sweep (unless WANDB_PROJECT or
#: MLFLOW_EXPERIMENT_NAME says otherwise); a sweep's runs go in one named after the sweep.
PROJECT = "minigpt"


class Tracker(Protocol):
    """One experiment tracker's run: started once, fed each metrics.jsonl record, finished."""

    def start(
        self, config: dict[str, Any], name: str, group: Optional[dict], resume_id: Optional[str]
    ) -> Optional[str]:
        """Start (or with ``resume_id``, continue) a run; its id for :data:`STATE`.

        Raises:
            Exception: whatever the library raises when the run cannot start.
        """

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` (``<event>/<field>`` -> value) at optimizer step ``step``."""

    def finish(self) -> None:
        """End the run (its records flushed)."""


def requested(train_cfg: Any) -> list[str]:
    """The trackers a run's ``train`` section asks for: ``train.trackers``, and tensorboard where
    the older ``train.tensorboard: true`` asks for it, each once, in order."""
    names = list(train_cfg.trackers) + (["tensorboard"] if train_cfg.tensorboard else [])
    return list(dict.fromkeys(names))


def check(train_cfg: Any) -> list[str]:
    """Import each requested tracker's package now, before anything is written.

    Raises:
        MinigptError: a package is missing or fails to import; the message names the extra to
            install.
    """
    names = requested(train_cfg)
    for name in names:
        if name == "tensorboard":
            if importlib.util.find_spec("tensorboard") is None:
                if "tensorboard" in train_cfg.trackers:
                    raise MinigptError(
                        "train.trackers: tensorboard needs the tensorboard package",
                        "pip install tensorboard, or remove tensorboard from train.trackers",
                    )
                raise MinigptError(
                    "train.tensorboard: true needs the tensorboard package; pip install "
                    "tensorboard, or set train.tensorboard: false"
                )
            continue
        try:
            importlib.import_module(PACKAGES[name])
        except Exception as exc:  # ImportError, or a broken install failing as it imports
            why = (str(exc).splitlines() or [""])[0][:120]
            raise MinigptError(
                f"train.trackers: {name} needs the {PACKAGES[name]} package, which cannot be "
                f"imported ({type(exc).__name__}: {why})",
                f"pip install 'minigpt-cli[{name}]', or remove {name} from train.trackers",
            ) from None
    return names


def group_from_env() -> Optional[dict]:
    """The group a sweep passed a ``--jobs`` process in :data:`GROUP_ENV`, or None."""
    text = os.environ.get(GROUP_ENV)
    return json.loads(text) if text else None


class Trackers:
    """The run's trackers together: fed each metrics.jsonl record; a tracker that fails is dropped
    with one warning (``warn``), and the others go on."""

    def __init__(self, active: dict[str, Tracker], warn: Callable[[str], None]):
        self.active, self.warn = active, warn

    def log(self, record: dict[str, Any]) -> None:
        """Send one metrics.jsonl ``record`` to every tracker, as ``<event>/<field>`` names."""
        metrics = {
            f"{record['event']}/{k}": v
            for k, v in record.items()
            if k not in ("step", "event") and v is not None
        }
        for name in list(self.active):
            self._call(name, lambda t: t.log(record["step"], metrics))

    def finish(self) -> None:
        """Finish every tracker's run."""
        for name in list(self.active):
            self._call(name, lambda t: t.finish())
        self.active.clear()

    def _call(self, name: str, act: Callable[[Tracker], None]) -> None:
        try:
            act(self.active[name])
        except Exception as exc:  # a tracker's failure must not end the run
            del self.active[name]
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            self.warn(
                f"warning: the {name} tracker failed ({type(exc).__name__}: {first}); the run goes "
                "on without it (metrics.jsonl has every record)"
            )


def start(
    names: list[str],
    run_dir: Path,
    config: dict[str, Any],
    group: Optional[dict],
    say: Callable[[str], None],
    warn: Callable[[str], None],
) -> Trackers:
    """Start each named tracker's run for ``run_dir`` (continuing the one :data:`STATE` records);
    record the ids; ``say`` gets each tracker's one line of where it writes.

    Raises:
        MinigptError: a tracker cannot start (a server unreachable, a login refused).
    """
    state_path = run_dir / STATE
    state = json.loads(state_path.read_text(encoding="utf-8")) if state_path.is_file() else {}
    active: dict[str, Tracker] = {}
    for name in names:
        tracker = _CLASSES[name](run_dir, say)
        try:
            run_id = tracker.start(config, run_dir.name, group, state.get(name))
        except MinigptError:
            raise
        except Exception as exc:
            for started in active.values():
                started.finish()
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise MinigptError(
                f"the {name} tracker could not start ({type(exc).__name__}: {first})",
                f"fix that, or remove {name} from train.trackers",
            ) from None
        active[name] = tracker
        if run_id is not None:
            state[name] = run_id
    if state:
        atomic_write_text(state_path, json.dumps(state, indent=2) + "\n")
    return Trackers(active, warn)


# ----------------------------------------------------------------------------- TensorBoard


class TensorBoardTracker:
    """Event files in ``<run>/tensorboard``: ``train/loss`` and ``train/lr`` at each train record,
    ``loss`` (``train``, ``val``) at each eval."""

    def __init__(self, run_dir: Path, say: Callable[[str], None]):
        self.run_dir, self.writer = run_dir, None

    def start(self, config, name, group, resume_id) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for tag in ("train/loss", "train/lr"):
            if tag in metrics:
                self.writer.add_scalar(tag, metrics[tag], step)
        if "eval/val_loss" in metrics:
            losses = {"train": metrics["eval/train_loss"], "val": metrics["eval/val_loss"]}
            self.writer.add_scalars("loss", losses, step)

    def finish(self) -> None:
        self.writer.close()


# ----------------------------------------------------------------------------- Weights & Biases


def wandb_logged_in() -> bool:
    """Whether a W&B API key is at hand: ``WANDB_API_KEY``, or the netrc entry ``wandb login``
    writes for the W&B host (``WANDB_BASE_URL``, else api.wandb.ai)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    path = os.environ.get("NETRC") or Path.home() / ".netrc"
    try:
        return netrc.netrc(path).authenticators(host.split(":")[0]) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker:
    """A W&B run (project ``WANDB_PROJECT`` or :data:`PROJECT`, the sweep's name as its group), its
    files under ``WANDB_DIR`` or the run folder; offline when ``WANDB_MODE=offline`` or no login."""

    def __init__(self, run_dir: Path, say: Callable[[str], None]):
        self.run_dir, self.say, self.run = run_dir, say, None

    def start(self, config, name, group, resume_id) -> str:
        import wandb

        offline = os.environ.get("WANDB_MODE") == "offline" or not wandb_logged_in()
        root = Path(os.environ.get("WANDB_DIR") or self.run_dir)
        root.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or (group or {}).get("sweep") or PROJECT,
            name=name,
            group=(group or {}).get("sweep"),
            job_type=(group or {}).get("trial"),
            config={**config, **({"sweep": group} if group else {})},
            id=resume_id,
            resume="allow" if resume_id else None,
            dir=str(root),
            mode="offline" if offline else None,
            # W&B's own lines and its capture of the console would interleave with the trainer's.
            settings=wandb.Settings(silent=True, console="off"),
        )
        where = Path(self.run.dir).parent
        self.say(
            f"wandb: offline run {self.run.id} written to {where}; upload it with "
            f"wandb sync {where}"
            if offline
            else f"wandb: run {self.run.id} at {self.run.url}"
        )
        return self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def finish(self) -> None:
        self.run.finish()


# ----------------------------------------------------------------------------- MLflow


def mlflow_uri(run_dir: Path, group: Optional[dict]) -> str:
    """``MLFLOW_TRACKING_URI``, else a SQLite store ``mlflow.db`` beside the runs folder (the parent
    of ``train.out_dir``; a sweep's runs are one folder deeper)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    out_dir = run_dir.resolve().parent
    root = out_dir.parent.parent if group else out_dir.parent
    return f"sqlite:///{root / 'mlflow.db'}"


@contextmanager
def _sqlite_lock(uri: str):
    """Hold ``<store>-lock`` while a SQLite store is opened: MLflow makes a new store's tables, and
    an experiment, without one, so a sweep's ``--jobs`` processes starting together fail
    ("table tags already exists")."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / f"{db.name}-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        yield


class MlflowTracker:
    """An MLflow run in experiment ``MLFLOW_EXPERIMENT_NAME`` (else the sweep's name, else
    :data:`PROJECT`), through ``MlflowClient`` (no process-wide active run: a sweep trains many)."""

    #: MLflow's limit on the params of one ``log_batch`` call.
    BATCH = 100

    def __init__(self, run_dir: Path, say: Callable[[str], None]):
        self.run_dir, self.say, self.client, self.run_id = run_dir, say, None, None

    def start(self, config, name, group, resume_id) -> str:
        # MLflow's INFO lines (a new store's migrations) would come between the trainer's.
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        uri = mlflow_uri(self.run_dir, group)
        with _sqlite_lock(uri):
            return self._start(uri, config, name, group, resume_id)

    def _start(self, uri, config, name, group, resume_id) -> str:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        if resume_id is not None:
            self.run_id = self.client.get_run(resume_id).info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            self.say(f"mlflow: continuing run {self.run_id} in {uri}")
            return self.run_id
        experiment = (
            os.environ.get("MLFLOW_EXPERIMENT_NAME") or (group or {}).get("sweep") or PROJECT
        )
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        tags = {"minigpt.run_dir": str(self.run_dir.resolve())}
        if group:
            tags.update({f"minigpt.{k}": json.dumps(v) for k, v in group.items()})
        self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        params = [
            Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in config.items()
        ]
        params += [Param(f"sweep.{k}", json.dumps(v)) for k, v in (group or {}).items()]
        for i in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + self.BATCH])
        self.say(f"mlflow: run {self.run_id} in {uri}")
        return self.run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


_CLASSES = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}
