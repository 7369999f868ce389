"""Training: :func:`train` runs a config to a run folder (:mod:`.setup` prepares it, :mod:`.loop`
trains)."""

from .loop import Trainer, TrainResult, train
from .optim import make_optimizer
from .schedule import lr_at, schedule_note, should_eval
from .step import estimate_loss, train_step

__all__ = [
    "TrainResult",
    "Trainer",
    "estimate_loss",
    "lr_at",
    "make_optimizer",
    "schedule_note",
    "should_eval",
    "train",
    "train_step",
]
