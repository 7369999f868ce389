"""A trained run's model, config and tokenizer for the inspect topics that read one (attention, residual --run).

Loaded as ``minigpt generate`` loads it (:func:`~minigpt_cli.sample.generate.load_run`):
the ``best`` checkpoint, else ``last``, on the CPU, checked against its tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..run import folder as runs
from ..sample.generate import checkpoint_step, describe_checkpoint, load_run

_MESSAGES = {
    "untrained": ("note: {run}'s {which} checkpoint is untrained (saved at step 0, its weights are the random "
                  "init); train the run further for maps worth reading"),
}


def open_run(run: str | Path, checkpoint: str = runs.BEST, echo: Callable[[str], None] = lambda m: None):
    """The model (eval mode, CPU), config and tokenizer of a run folder, and the checkpoint used.

    Raises:
        MinigptError: no such folder or checkpoint, a damaged checkpoint, a tokenizer that is not the run's.
    """
    run_dir, ckpt = runs.open_checkpoint(run, checkpoint)
    import torch

    model, cfg, tok = load_run(run_dir, ckpt, torch.device("cpu"))
    model.eval()
    if checkpoint_step(ckpt) == 0:
        echo(_MESSAGES["untrained"].format(run=run_dir, which=ckpt.name))
    return model, cfg, tok, describe_checkpoint(ckpt)
