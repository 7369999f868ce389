"""The ``minigpt`` command (Typer): one module per command family, each function thin (parse, call
one library function, print). torch is imported inside the commands, so ``minigpt --help`` answers
at once; :mod:`.base` holds the app and turns errors into one line and an exit status.
"""

from __future__ import annotations

# Importing a family adds its commands to the app, in this order in --help.
from . import data, train, config, runs, bench, experiments, speedrun, plot, inspect, launch  # noqa: F401, I001  isort: skip
from .base import app, run_and_exit

app.add_typer(inspect.app, name="inspect")
app.add_typer(launch.app, name="launch")


def main() -> None:
    """Console-script entry point: runs the CLI and ends the process
    (:func:`~.base.run_and_exit`)."""
    run_and_exit(app)


if __name__ == "__main__":
    main()
