"""Where corpora, tokenizers, prepared data, presets and runs live (a config's paths: from the
current folder)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .errors import MinigptError

if TYPE_CHECKING:  # importlib.resources.abc from Python 3.11 on
    from importlib.abc import Traversable

#: Name of the file a dataset is downloaded to, inside ``data/<dataset>/``.
CORPUS_FILE = "input.txt"
#: The registry of named corpora (package data): name -> url, sha256, size in bytes, description
#: (:func:`dataset_registry`).
DATASETS_FILE = "datasets.json"


def _shipped() -> Traversable:
    """``minigpt_cli/config/``: the package data (presets, example configs, the dataset
    registry)."""
    return resources.files(__package__) / "config"


@functools.cache
def dataset_registry() -> dict[str, dict]:
    """The named corpora ``data.dataset`` and ``minigpt download`` know, from the package's
    :data:`DATASETS_FILE`: each name maps to its ``url``, ``sha256``, ``size`` (bytes) and
    ``description``; optionally the ``archive`` the url serves (its ``sha256``, ``size`` and the
    ``members`` the corpus is built from) and the ``fallback`` corpus to use where the url cannot be
    reached. A new corpus is a new entry there, no code; its mirror variable is
    ``MINIGPT_<NAME>_URL``."""
    return json.loads((_shipped() / DATASETS_FILE).read_text(encoding="utf-8"))


def check_dataset_name(name: str) -> str:
    """``name`` when the registry (:func:`dataset_registry`) has it.

    Raises:
        ValueError: an unknown name; the message lists the known ones (the config reports it as a
        schema error).
    """
    known = dataset_registry()
    if name not in known:
        raise ValueError(
            f"data.dataset: unknown dataset {name!r}; known datasets: {', '.join(known)} "
            "(for your own text, set data.path)"
        )
    return name


def dataset_dir(data_dir: str | Path, dataset: str) -> Path:
    """``data/<dataset>/``: the corpus and everything derived from it."""
    return Path(data_dir) / dataset


def corpus_path(data_dir: str | Path, dataset: str) -> Path:
    """``data/<dataset>/input.txt``."""
    return dataset_dir(data_dir, dataset) / CORPUS_FILE


def default_tokenizer_path(
    data_dir: str | Path,
    dataset: str,
    kind: str,
    vocab_size: int | None = None,
    special_tokens: Sequence[str] = (),
) -> Path:
    """Where a trained tokenizer is kept:
    ``data/<dataset>/tokenizer-<kind>[-<vocab_size>][-special-<hash>].json``.

    Configs that differ in a trained kind's size or in their special tokens (``<hash>``: 8 hex
    digits of the sha256 of their list, in order) get files of their own; ``char`` has no size (its
    alphabet decides).
    """
    suffix = f"-{vocab_size}" if vocab_size is not None and kind != "char" else ""
    if special_tokens:
        digest = hashlib.sha256(json.dumps(list(special_tokens)).encode("utf-8")).hexdigest()
        suffix += f"-special-{digest[:8]}"
    return dataset_dir(data_dir, dataset) / f"tokenizer-{kind}{suffix}.json"


#: The package folder of the example run configs (``configs/`` in the repository is a link to it).
CONFIGS_PACKAGE_DIR = "configs"


def presets_dir() -> Traversable:
    """``minigpt_cli/config/presets/``: one YAML per named model size (package data, there in a
    wheel too)."""
    return _shipped() / "presets"


def _yaml_names(folder: Traversable) -> list[str]:
    """The names of the ``.yaml`` files in a shipped folder, sorted, without the suffix."""
    if not folder.is_dir():
        return []
    return sorted(
        p.name[: -len(".yaml")]
        for p in folder.iterdir()
        if p.name.endswith(".yaml") and p.is_file()
    )


def list_presets() -> list[str]:
    """Names of the presets shipped in ``minigpt_cli/config/presets/``, sorted."""
    return _yaml_names(presets_dir())


def list_configs() -> list[str]:
    """Names of the example run configs shipped in ``minigpt_cli/config/configs/`` (``tiny``, ...),
    sorted."""
    return _yaml_names(_shipped() / CONFIGS_PACKAGE_DIR)


def resolve_config(path: str | Path, note=lambda message: None) -> Path:
    """The config file ``path`` names: the file itself, else the shipped example of that name.

    ``shakespeare-cpu`` names the shipped ``shakespeare-cpu.yaml``; so does
    ``configs/shakespeare-cpu.yaml`` where no such file exists (a wheel install), with a note
    through ``note``. Anything else is returned as given.
    """
    p = Path(path)
    # A link is the user's file, even one that leads nowhere (which its reading names).
    if p.exists() or p.is_symlink() or p.parent not in (Path("."), Path(CONFIGS_PACKAGE_DIR)):
        return p
    name = p.name[: -len(".yaml")] if p.name.endswith(".yaml") else p.name
    res = _shipped() / CONFIGS_PACKAGE_DIR / f"{name}.yaml"
    if name not in list_configs() or not isinstance(res, Path):
        return p
    if p.suffix == ".yaml":
        note(f"note: {p} is not in this folder; using the copy shipped with minigpt ({res})")
    return res


def preset_path(name: str) -> Path:
    """The YAML file of preset ``name``, as a path on disk.

    Raises:
        MinigptError: unknown preset; the message lists the known ones.
    """
    res = presets_dir() / f"{name}.yaml"
    if "/" in name or "\\" in name or not res.is_file():
        known = ", ".join(list_presets()) or f"none found in {presets_dir()}"
        raise MinigptError(f"unknown preset {name!r}; known presets: {known}")
    if isinstance(res, Path):
        return res
    # A package imported from a zip: a temporary copy, kept until the process exits.
    return _KEEP_FILES.enter_context(resources.as_file(res))


_KEEP_FILES = contextlib.ExitStack()
atexit.register(_KEEP_FILES.close)
