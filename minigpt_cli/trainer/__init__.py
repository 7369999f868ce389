"""Training: :func:`train` runs a config to a run folder.

- :mod:`.schedule`: the learning rate at each step, and when to evaluate;
- :mod:`.step`: the optimizer, one optimizer step, the loss estimate;
- :mod:`.evaluate`: the :class:`~.evaluate.Evaluator` (when, on which batches, the sample);
- :mod:`.setup`: everything built before the first step;
- :mod:`.loop`: the :class:`~.loop.Trainer` and :func:`train`;
- :mod:`.resume`: continuing a run; :mod:`.describe`: what ``--dry-run`` prints.
"""

from .describe import describe_schedule
from .loop import Trainer, TrainResult, train
from .resume import describe_resume
from .schedule import lr_at, schedule_note, should_eval
from .step import estimate_loss, make_optimizer, train_step

__all__ = ["TrainResult", "Trainer", "describe_resume", "describe_schedule", "estimate_loss", "lr_at",
           "make_optimizer", "schedule_note", "should_eval", "train", "train_step"]
