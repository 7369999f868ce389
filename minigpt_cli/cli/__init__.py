"""The ``minigpt`` command (Typer): one module per command family, each function thin.

Each command parses its options, loads the config, calls one library function
and prints the result. torch is imported inside the commands that need it, so
``minigpt --help`` answers at once. Errors become one line and an exit status
in :mod:`.base`, which also holds the app.

- :mod:`.data`: ``download``, ``train-tokenizer``;
- :mod:`.train`: ``train``, ``prepare``;
- :mod:`.config`: ``config-keys``, ``count-params``;
- :mod:`.runs`: ``generate``, ``evaluate``, ``export``;
- :mod:`.bench`: ``bench``;
- :mod:`.experiments`: ``sweep``, ``compare``;
- :mod:`.inspect`: ``inspect TOPIC``.
"""

from __future__ import annotations

# Importing a family adds its commands to the app, in this order in --help.
from . import data, train, config, runs, bench, experiments, inspect  # noqa: F401, I001  isort: skip
from .base import app, run_and_exit

app.add_typer(inspect.app, name="inspect")


def main() -> None:
    """Console-script entry point: runs the CLI and ends the process (:func:`~.base.run_and_exit`)."""
    run_and_exit(app)


if __name__ == "__main__":
    main()
