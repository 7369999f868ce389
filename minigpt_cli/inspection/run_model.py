"""A trained run's model, config and tokenizer for the inspect topics that read one (attention,
residual --run)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..run import folder as runs
from ..sample.load import load_run

UNTRAINED = (
    "note: {run}'s {which} checkpoint is untrained (saved at step 0, its weights are the random init); "
    "train the run further for maps worth reading"
)


def open_run(
    run: str | Path, checkpoint: str = runs.BEST, echo: Callable[[str], None] = lambda m: None
):
    """The model (eval mode, CPU), config and tokenizer of a run folder as ``minigpt generate``
    opens them, and the checkpoint used, described; MinigptError as
    :func:`~minigpt_cli.sample.load.load_run`."""
    loaded = load_run(run, checkpoint)
    if loaded.step == 0:
        echo(UNTRAINED.format(run=loaded.run_dir, which=loaded.checkpoint.name))
    return loaded.model, loaded.config, loaded.tokenizer, loaded.describe()
