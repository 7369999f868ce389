"""Continuing a run: which folder (found once), whether its config and corpus allow it, its trainer
state."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from ..config.schema import Config
from ..data.corpus import Corpus
from ..data.pipeline import fallback_of, run_corpus_change
from ..errors import MinigptError
from ..run import checkpoint
from ..run import claim as claims
from ..run import folder as runs
from ..run.metrics import METRICS, read_events
from ..runtime.distributed import Elastic
from ..tokenizer.kinds import Tokenizer, check_run_tokenizer, load_tokenizer
from .schedule import schedule_note


def check_resume_config(cfg: Config, saved: Config) -> None:
    """Refuse to resume with another model, tokenizer or data than the run's own.

    Raises:
        MinigptError: a ``model``, ``tokenizer`` or ``data`` key differs; names the key.
    """
    # Keys not compared: derived, or (data.fingerprint) compared by the corpus's files
    # (Resumed.check_corpus).
    for section, free in (
        ("model", ["vocab_size"]),
        ("tokenizer", ["path"]),
        ("data", ["fingerprint"]),
    ):
        a, b = getattr(cfg, section).model_dump(), getattr(saved, section).model_dump()
        if section == "model" and a["init_from"] is not None and b["init_from"] is not None:
            free.append("init_from")  # fine-tuned: where from may move
        for key in free:
            a[key] = b[key] = None
        diff = [k for k in a if a[k] != b.get(k)]
        if diff:
            raise MinigptError(
                f"--resume: {section}.{diff[0]} is {a[diff[0]]!r} here but {b.get(diff[0])!r} in the checkpoint "
                f"({runs.CHECKPOINTS}/{runs.LAST}/{runs.CONFIG}); model, tokenizer and data values cannot change "
                f"on a resume: resume with the config the run was trained with, or start a new run"
            )


#: Keys a resume changes as a matter of course, said elsewhere or not at all: the new end of
#: training.
_EXPECTED_CHANGES = {"train.max_iters"}


def config_changes(cfg: Config, saved: Config) -> dict[str, list]:
    """The keys outside ``model``, ``tokenizer`` and ``data`` (which may not change) whose value
    ``cfg`` changes from the run's checkpoint ``saved``: key -> [old, new], in the schema's
    order."""
    old, new = saved.flat(), cfg.flat()
    return {
        k: [old.get(k), v]
        for k, v in new.items()
        if k.split(".")[0] not in ("model", "tokenizer", "data")
        and k not in _EXPECTED_CHANGES
        and old.get(k) != v
    }


def _named_tokenizer(cfg: Config) -> Optional[Tokenizer]:
    """The tokenizer in the file ``tokenizer.path`` names, when it is set and there; else None
    (raises MinigptError: a damaged file)."""
    path = cfg.tokenizer.path
    return load_tokenizer(path, cfg.tokenizer.kind) if path and Path(path).is_file() else None


#: A resume whose corpus is not the one the run trained on.
_CORPUS_CHANGED = (
    "--resume: corpus file {path} was {what} since the run trained on it{detail}; resume with the "
    "corpus as the run had it, or start a new run"
)


#: A resume under another train.optimizer: the checkpoint holds the moments of the run's own.
_OPTIMIZER_SWITCHED = (
    "--resume: train.optimizer is {new} here but {old} in the checkpoint; a run keeps its optimizer "
    "(its state is {old}'s): resume with --set train.optimizer={old}, or start a new run"
)


#: What a resume reads from ``trainer_state.pt`` (the trainer's snapshot, :meth:`~.loop.Trainer.snapshot`):
#: entry (``a.b``: entry b of the dict at a) -> the types it may have.
STATE_ENTRIES = {
    "step": int,
    "evaluated": bool,
    "best_val_loss": (float, int),
    "bad_evals": int,
    "optimizer": dict,
    "optimizer.state": dict,
    "optimizer.param_groups": list,
    "scaler": dict,
    "rng": dict,
    "rng.python": list,
    "rng.numpy": list,
    "rng.torch": torch.Tensor,
    "data_rng": dict,
    "data_rng.train": torch.Tensor,
}
#: A trainer state that loads but is not one: what is wrong with it.
_STATE_WRONG = (
    "trainer state {path!r} is not a minigpt trainer state ({problem}); use another checkpoint or "
    "start a new run"
)


def load_resume_state(last: Path) -> dict[str, Any]:
    """The trainer state of checkpoint ``last``, checked to hold every entry of
    :data:`STATE_ENTRIES`, of its type.

    Raises:
        MinigptError: a missing, truncated or unsafe file, or the first entry missing or of another
        type.
    """
    state = checkpoint.load_trainer_state(last)
    problem = (
        None
        if isinstance(state, dict)
        else f"it holds a value of type {type(state).__name__}, not a dict"
    )
    for entry, types in STATE_ENTRIES.items():
        if problem is not None:
            break
        *parents, key = entry.split(".")
        holder = state
        for name in parents:
            holder = holder[name]  # a dict: STATE_ENTRIES lists each dict before its entries
        if key not in holder:
            problem = f"no {entry!r} entry"
        elif not isinstance(holder[key], types):
            problem = f"{entry!r} is of type {type(holder[key]).__name__}"
    if problem is not None:
        raise MinigptError(
            _STATE_WRONG.format(path=str(runs.resolve(last) / runs.STATE), problem=problem)
        )
    return state


@dataclass
class Resumed:
    """The run ``--resume`` continues, found once: its folder, the checkpoint it loads and that
    checkpoint's config, and once checked and opened its trainer state and the schedule note.

    ``--resume RUN`` (or ``auto``) continues RUN in place from ``checkpoints/last``; ``--resume
    RUN/checkpoints/NAME`` (``branch``) starts a new run folder from that checkpoint, a WSD
    cool-down from a kept ``step-NNNNNNN`` say, and leaves RUN as it is (unlocked: a kept checkpoint
    never changes)."""

    run_dir: Path  # the run the checkpoint belongs to
    saved: Config
    checkpoint: Optional[Path] = None  # None: the run's last
    branch: bool = False  # a new run folder starts from ``checkpoint``
    state: dict[str, Any] = field(default_factory=dict)
    max_iters: int = 0
    note: Optional[str] = None
    changes: dict[str, list] = field(
        default_factory=dict
    )  # key -> [old, new] (:func:`config_changes`)
    # The torchrun restart that continues the run (its folder found by the job's run id); None: a
    # --resume.
    restart: Optional[Elastic] = None

    @classmethod
    def find(
        cls, cfg: Config, resume: str, restart: Optional[Elastic] = None
    ) -> Optional["Resumed"]:
        """The run ``resume`` names (``auto``: the newest of ``cfg.name`` on the same corpus; None:
        none yet); ``restart``: the torchrun restart that continues the run folder ``resume``.

        Raises:
            MinigptError: a path without a resumable checkpoint, a damaged checkpoint config.
        """

        def same_data(
            run: Path,
        ) -> bool:  # auto continues a run of this corpus, not any run of this name
            try:
                data = checkpoint.saved_config(cls.last_of(run)).data
            except MinigptError:
                return True  # a damaged run is found, and its damage said below, as before
            where = (cfg.data.dataset, cfg.data.path and Path(cfg.data.path))
            # A run that trained on the fallback (data.dataset unreachable then) is this corpus's.
            fell_back = data.path is None and data.dataset == fallback_of(cfg)
            return fell_back or (data.dataset, data.path and Path(data.path)) == where

        given = Path(resume)
        if resume != "auto" and given.parent.name == runs.CHECKPOINTS and given.is_dir():
            # A checkpoint folder: its own config, its run's tokenizer and corpus record.
            return cls(
                given.parent.parent, checkpoint.saved_config(given), checkpoint=given, branch=True
            )
        run_dir = runs.find_resume_dir(cfg.train.out_dir, cfg.name, resume, same_data)
        return (
            None
            if run_dir is None
            else cls(run_dir, checkpoint.saved_config(cls.last_of(run_dir)), restart=restart)
        )

    def __post_init__(self):
        self.checkpoint = self.checkpoint or self.last_of(self.run_dir)

    @staticmethod
    def last_of(run_dir: Path) -> Path:
        return runs.checkpoint_dir(run_dir, runs.LAST)

    def check(self, cfg: Config, claim=None) -> None:
        """Before the corpus is read or downloaded, and before any write (into the run folder or the
        data folder): lock the run (with ``claim``: rank 0 of a real run), then refuse another
        model, tokenizer or data config (:func:`check_resume_config`), another ``train.optimizer``
        (its state would not fit), a ``tokenizer.path`` naming another tokenizer than the run's, and
        damaged weights (or tensors other than the run's model's), metrics or trainer state. A dry
        run checks alike.

        Raises:
            MinigptError: a run in use, or any of those.
        """
        if claim is not None and not self.branch:  # a branch reads its checkpoint, writes elsewhere
            # The lock file keeps the last owner's pid until build() writes this one's.
            claim.folder = claims.RunFolder(
                self.run_dir,
                claims.RunLock(self.run_dir).acquire(
                    "wait for it to finish before resuming", mark=False
                ),
            )
        check_resume_config(cfg, self.saved)
        if cfg.train.optimizer != self.saved.train.optimizer:
            raise MinigptError(
                _OPTIMIZER_SWITCHED.format(new=cfg.train.optimizer, old=self.saved.train.optimizer)
            )
        check_run_tokenizer(self.run_dir, self.saved, _named_tokenizer(cfg))
        last = self.checkpoint
        # The checkpoint's own model config: equal to cfg's but for the vocabulary, resolved there.
        checkpoint.check_resume_weights(last, self.saved.model)
        read_events(self.run_dir / METRICS)
        self.state = load_resume_state(last)

    def check_corpus(self, corpus: Corpus) -> None:
        """Refuse a corpus other than the run's, naming the file that differs (runs saved before
        fingerprints existed pass)."""
        change = run_corpus_change(
            self.saved.data.fingerprint, corpus, self.run_dir, (self.checkpoint.name,)
        )
        if change is not None:
            path, what, detail = change
            raise MinigptError(_CORPUS_CHANGED.format(path=path, what=what, detail=detail))

    def open(self, cfg: Config, tok: Optional[Tokenizer]) -> None:
        """Once the data is prepared: check the run's tokenizer against ``tok``, and work out the
        keys this resume changes and the schedule note. Raises MinigptError: another tokenizer."""
        check_run_tokenizer(self.run_dir, self.saved, tok)
        self.max_iters = cfg.train.max_iters
        self.changes = config_changes(cfg, self.saved)
        if not self.done:
            self.note = schedule_note(cfg, self.saved, self.state["step"])

    @property
    def done(self) -> bool:
        """Whether the run already reached ``train.max_iters`` (and ran its final eval): nothing to
        train."""
        step = self.state["step"]
        return step > self.max_iters or (step == self.max_iters and self.state["evaluated"])

    def describe(self) -> list[str]:
        """What the resume would do, for ``--dry-run``: the run, its step, and the schedule note if
        any."""
        step, n = self.state["step"], self.max_iters
        if self.done:
            return [
                f"--resume: {self.source} is at step {step}, train.max_iters is {n}: nothing would be "
                "trained"
            ]
        where = f" in a new run folder ({self.run_dir} is left as it is)" if self.branch else ""
        return (
            [
                f"--resume: would continue {self.source} from step {step} to train.max_iters {n}{where}"
            ]
            + self.change_notes()
            + ([self.note] if self.note else [])
        )

    @property
    def position(self) -> tuple[int, bool]:
        """The step the run goes on from, and whether its eval at that step already ran."""
        return self.state["step"], self.state["evaluated"]

    @property
    def source(self) -> Path:
        """What the resume continues, as the user named it: the run, or a branch's checkpoint
        folder."""
        return self.checkpoint if self.branch else self.run_dir

    def change_notes(self) -> list[str]:
        """One note per key this resume changes, old -> new (train.log and env.json keep them
        too)."""
        return [
            f"note: --resume changes {key}: {old!r} -> {new!r}"
            for key, (old, new) in self.changes.items()
        ]

    def result(self) -> dict[str, Any]:
        """The fields of a finished run's :class:`~.loop.TrainResult`: its step and last eval's
        losses."""
        try:
            meta = runs.read_meta(self.checkpoint)
        except (OSError, ValueError):
            meta = {}
        best = self.state["best_val_loss"]
        return {
            "run_dir": self.source,
            "step": self.state["step"],
            "train_loss": meta.get("train_loss"),
            "val_loss": meta.get("val_loss"),
            "best_val_loss": best if math.isfinite(best) else None,
        }
