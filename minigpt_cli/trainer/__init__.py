"""Training: :func:`train` runs a config to a run folder.

- :mod:`.setup`: :func:`~.setup.plan` resolves what a run will do (``--dry-run`` stops there), then
  :func:`~.setup.build` makes the run folder, the model and the optimizer;
- :mod:`.loop`: the :class:`~.loop.Trainer` and :func:`train`; :mod:`.evaluate`: the :class:`~.evaluate.Evaluator`;
- :mod:`.schedule`: the learning rate and when to evaluate; :mod:`.step`: one optimizer step, the loss estimate;
- :mod:`.resume`: continuing a run; :mod:`.describe`: what ``--dry-run`` prints.
"""

from .loop import Trainer, TrainResult, train
from .schedule import lr_at, schedule_note, should_eval
from .step import estimate_loss, make_optimizer, train_step

__all__ = ["TrainResult", "Trainer", "estimate_loss", "lr_at", "make_optimizer", "schedule_note", "should_eval",
           "train", "train_step"]
