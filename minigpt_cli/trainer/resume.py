"""Continuing a run: which folder, whether its config allows it, and what ``--dry-run`` says about it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from ..config.schema import Config
from ..data.corpus import Corpus
from ..data.pipeline import check_fingerprint, corpus_change, corpus_on_disk
from ..errors import MinigptError
from ..run import checkpoint
from ..run import folder as runs
from ..tokenizer.kinds import Tokenizer, check_run_tokenizer, load_tokenizer
from .schedule import schedule_note


def check_resume_config(cfg: Config, saved: Config) -> None:
    """Refuse to resume with another model, tokenizer or data than the run's own.

    Other keys may change. The ``train`` section in particular: a larger
    ``max_iters`` trains a finished run further; see :func:`schedule_note`
    for what that does to the learning rate. So may where files are:
    ``tokenizer.path`` (the tokenizer itself is compared by its fingerprint,
    :func:`~minigpt_cli.tokenizer.kinds.check_run_tokenizer`) and a fine-tuning run's ``model.init_from``
    (a resume loads its own weights; the architecture is compared key by key).

    Raises:
        MinigptError: a ``model``, ``tokenizer`` or ``data`` key differs; names the key.
    """
    for section in ("model", "tokenizer", "data"):
        a, b = getattr(cfg, section).model_dump(), getattr(saved, section).model_dump()
        if section == "model":
            a["vocab_size"] = b["vocab_size"] = None
            if a["init_from"] is not None and b["init_from"] is not None:  # fine-tuned: where from may move
                a["init_from"] = b["init_from"] = None
        if section == "tokenizer":
            a["path"] = b["path"] = None
        if section == "data":  # the corpus itself is checked against its files (check_resume_corpus)
            a["fingerprint"] = b["fingerprint"] = None
        diff = [k for k in a if a[k] != b.get(k)]
        if diff:
            raise MinigptError(
                f"--resume: {section}.{diff[0]} is {a[diff[0]]!r} here but {b.get(diff[0])!r} in the checkpoint "
                f"({runs.CHECKPOINTS}/{runs.LAST}/{runs.CONFIG}); model, tokenizer and data values cannot change "
                f"on a resume: resume with the config the run was trained with, or start a new run"
            )


def _named_tokenizer(cfg: Config) -> Optional[Tokenizer]:
    """The tokenizer in the file ``tokenizer.path`` names, when it is set and there; else None.

    Raises:
        MinigptError: a damaged file.
    """
    path = cfg.tokenizer.path
    return load_tokenizer(path, cfg.tokenizer.kind) if path and Path(path).is_file() else None


#: A resume whose corpus is not the one the run trained on.
_CORPUS_CHANGED = ("--resume: corpus file {path} was {what} since the run trained on it{detail}; resume with the "
                   "corpus as the run had it, or start a new run")


def check_resume_corpus(saved: Config, last: Path, corpus: Corpus) -> None:
    """Refuse to resume on a corpus other than the run's: compared by fingerprint, and the file that
    differs named from the checkpoint's ``meta.json``. Runs saved before fingerprints existed pass.

    Raises:
        MinigptError: a file edited, added, removed or reordered since the run's checkpoint.
    """
    want = saved.data.fingerprint
    if want is None or corpus.matches(want):
        return
    try:
        before = runs.read_meta(last).get("corpus", {}).get("files") or []
    except (OSError, ValueError):
        before = []
    path, what, detail = corpus_change(before, corpus)
    raise MinigptError(_CORPUS_CHANGED.format(path=path, what=what, detail=detail))


def check_resume_early(cfg: Config, resume: Optional[str]) -> None:
    """Before the corpus is read or downloaded: refuse a ``--resume`` whose run has another model, tokenizer
    or data config (:func:`check_resume_config`), so that a missing ``data.path`` is named, not downloaded
    around, or whose ``tokenizer.path`` names another tokenizer (:func:`~minigpt_cli.tokenizer.kinds.check_run_tokenizer`). A run
    that does not exist is left to :func:`open_resume`.

    Raises:
        MinigptError: as :func:`check_resume_config` and :func:`~minigpt_cli.tokenizer.kinds.check_run_tokenizer`.
    """
    run_dir = runs.find_resume_dir(cfg.train.out_dir, cfg.name, resume) if resume is not None else None
    if run_dir is not None:
        saved = checkpoint.saved_config(runs.checkpoint_dir(run_dir, runs.LAST))
        check_resume_config(cfg, saved)
        check_run_tokenizer(run_dir, saved, _named_tokenizer(cfg))


def check_corpus(cfg: Config, resume: Optional[str], corpus: Corpus) -> None:
    """Before anything is prepared: refuse a corpus other than the resumed run's (:func:`check_resume_corpus`)
    or than ``data.fingerprint`` names (:func:`~minigpt_cli.data.pipeline.check_fingerprint`).

    Raises:
        MinigptError: as those do; a ``--resume`` run that does not exist is left to :func:`open_resume`.
    """
    run_dir = runs.find_resume_dir(cfg.train.out_dir, cfg.name, resume) if resume is not None else None
    if run_dir is not None:
        last = runs.checkpoint_dir(run_dir, runs.LAST)
        check_resume_corpus(checkpoint.saved_config(last), last, corpus)
    check_fingerprint(cfg, corpus)


#: What a resume reads from ``trainer_state.pt`` (the trainer's snapshot, :meth:`~.loop.Trainer.snapshot`):
#: entry (``a.b``: entry b of the dict at a) -> the types it may have.
STATE_ENTRIES = {
    "step": int, "evaluated": bool, "best_val_loss": (float, int), "bad_evals": int,
    "optimizer": dict, "optimizer.state": dict, "optimizer.param_groups": list, "scaler": dict,
    "rng": dict, "rng.python": list, "rng.numpy": list, "rng.torch": torch.Tensor,
    "data_rng": dict, "data_rng.train": torch.Tensor,
}
#: A trainer state that loads but is not one: what is wrong with it.
_STATE_WRONG = ("trainer state {path!r} is not a minigpt trainer state ({problem}); use another checkpoint or "
                "start a new run")


def load_resume_state(last: Path) -> dict[str, Any]:
    """The trainer state of checkpoint ``last`` (:func:`~minigpt_cli.run.checkpoint.load_trainer_state`), checked
    to hold every entry a resume reads, of its type (:data:`STATE_ENTRIES`).

    Raises:
        MinigptError: a missing, truncated or unsafe file, or one whose entries are not the trainer's,
            naming the first entry missing or of another type.
    """
    state = checkpoint.load_trainer_state(last)
    problem = None if isinstance(state, dict) else f"it holds a value of type {type(state).__name__}, not a dict"
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
        raise MinigptError(_STATE_WRONG.format(path=str(runs.resolve(last) / runs.STATE), problem=problem))
    return state


def describe_resume(cfg: Config, resume: str, corpus: Optional[Corpus] = None) -> list[str]:
    """What ``--resume`` would do, for ``--dry-run``: the run, its step, and the schedule note if any.

    ``corpus``: the corpus to check against the run's; None: the config's, when it is on disk
    (:func:`~minigpt_cli.data.pipeline.corpus_on_disk`).

    Raises:
        MinigptError: as :func:`train` would: no such run, or one with another model, tokenizer, data or corpus.
    """
    run_dir = runs.find_resume_dir(cfg.train.out_dir, cfg.name, resume)
    if run_dir is None:
        return [f"--resume auto: no run named {cfg.name!r} under {cfg.train.out_dir}/ yet; a new run would start"]
    last = runs.resolve(runs.checkpoint_dir(run_dir, runs.LAST))
    saved = checkpoint.saved_config(last)
    check_resume_config(cfg, saved)
    check_run_tokenizer(run_dir, saved, _named_tokenizer(cfg))
    corpus = corpus if corpus is not None else corpus_on_disk(cfg)
    if corpus is not None:
        check_resume_corpus(saved, last, corpus)
    state = load_resume_state(last)
    step, n = state["step"], cfg.train.max_iters
    if step > n or (step == n and state["evaluated"]):
        return [f"--resume: {run_dir} is at step {step}, train.max_iters is {n}: nothing would be trained"]
    lines = [f"--resume: would continue {run_dir} from step {step} to train.max_iters {n}"]
    note = schedule_note(cfg, saved, step)
    return lines + ([note] if note else [])


@dataclass
class Resumed:
    """A run folder being continued: its trainer state, the schedule note, the temporary files swept."""

    run_dir: Path
    state: dict[str, Any]
    max_iters: int
    note: Optional[str] = None
    swept: list[Path] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Whether the run already reached ``train.max_iters`` (and ran its final eval): nothing to train."""
        step = self.state["step"]
        return step > self.max_iters or (step == self.max_iters and self.state["evaluated"])

    def result(self) -> dict[str, Any]:
        """The fields of a finished run's :class:`~.loop.TrainResult`: its step and last eval's losses."""
        try:
            meta = runs.read_meta(runs.checkpoint_dir(self.run_dir, runs.LAST))
        except (OSError, ValueError):
            meta = {}
        best = self.state["best_val_loss"]
        return {"run_dir": self.run_dir, "step": self.state["step"], "train_loss": meta.get("train_loss"),
                "val_loss": meta.get("val_loss"), "best_val_loss": best if math.isfinite(best) else None}


def open_resume(cfg: Config, resume: str, tok: Tokenizer, corpus: Corpus, main: bool, claim) -> Optional[Resumed]:
    """Find, lock (on rank 0) and check the run ``--resume`` names; None for ``auto`` with no run yet.

    The run's ``model``, ``tokenizer`` and ``data`` values must be the
    config's (:func:`check_resume_config`), its corpus ``corpus``
    (:func:`check_resume_corpus`), and its ``tokenizer.json`` the tokenizer
    file the config names. Temporary folders a killed save left are
    swept, safely under the lock.

    Raises:
        MinigptError: no such run, a run in use, another model/tokenizer/data or corpus, a damaged checkpoint.
    """
    run_dir = runs.find_resume_dir(cfg.train.out_dir, cfg.name, resume)
    if run_dir is None:
        return None
    last = runs.checkpoint_dir(run_dir, runs.LAST)
    swept = []
    if main:
        claim.folder = runs.RunFolder(run_dir, runs.RunLock(run_dir).acquire("wait for it to finish before resuming"))
        swept = checkpoint.sweep_stale_temps(last.parent)  # safe under the lock: no other process is saving here
    saved = checkpoint.saved_config(last)
    check_resume_config(cfg, saved)
    check_resume_corpus(saved, last, corpus)
    check_run_tokenizer(run_dir, saved, tok)
    state = load_resume_state(last)
    resumed = Resumed(run_dir, state, cfg.train.max_iters, swept=swept)
    if not resumed.done:
        resumed.note = schedule_note(cfg, saved, state["step"])
    return resumed
