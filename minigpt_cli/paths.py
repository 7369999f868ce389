"""Where corpora, tokenizers, prepared data, presets and runs live.

All paths in a config are relative to the current directory, so a user who
runs ``minigpt`` from the repository root gets ``data/`` and ``runs/`` there.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

from .errors import MinigptError

#: Name of the file a dataset is downloaded to, inside ``data/<dataset>/``.
CORPUS_FILE = "input.txt"


def dataset_dir(data_dir: str | Path, dataset: str) -> Path:
    """``data/<dataset>/``: the corpus and everything derived from it."""
    return Path(data_dir) / dataset


def corpus_path(data_dir: str | Path, dataset: str) -> Path:
    """``data/<dataset>/input.txt``."""
    return dataset_dir(data_dir, dataset) / CORPUS_FILE


def default_tokenizer_path(data_dir: str | Path, dataset: str, kind: str,
                           vocab_size: int | None = None, special_tokens: Sequence[str] = ()) -> Path:
    """Where a trained tokenizer is kept: ``data/<dataset>/tokenizer-<kind>[-<vocab_size>][-special-<hash>].json``.

    Trained kinds (bpe, wordpiece, unigram) carry their size in the name, so
    configs that differ only in ``tokenizer.vocab_size`` do not share a file;
    ``char`` has none (its alphabet decides). Special tokens, when there are
    any, add the first 8 hex digits of the sha256 of their list (in order:
    the order decides their ids), so configs that differ only in their
    special tokens do not share a file either.
    """
    suffix = f"-{vocab_size}" if vocab_size is not None and kind != "char" else ""
    if special_tokens:
        digest = hashlib.sha256(json.dumps(list(special_tokens)).encode("utf-8")).hexdigest()
        suffix += f"-special-{digest[:8]}"
    return dataset_dir(data_dir, dataset) / f"tokenizer-{kind}{suffix}.json"


def configs_dir() -> Path:
    """The shipped ``configs/`` folder.

    Looked up in order: ``$MINIGPT_CONFIGS_DIR``, ``./configs`` when it holds
    the presets, then the ``configs/`` beside the package (a source checkout or
    an editable install).
    """
    env = os.environ.get("MINIGPT_CONFIGS_DIR")
    if env:
        return Path(env)
    here = Path.cwd() / "configs"
    if (here / "presets").is_dir():
        return here
    return Path(__file__).resolve().parent.parent / "configs"


def presets_dir() -> Path:
    """``configs/presets/``: one YAML per named model size."""
    return configs_dir() / "presets"


def list_presets() -> list[str]:
    """Names of the presets shipped in ``configs/presets/``, sorted."""
    d = presets_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def preset_path(name: str) -> Path:
    """The YAML file of preset ``name``.

    Raises:
        MinigptError: unknown preset; the message lists the known ones.
    """
    path = presets_dir() / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(list_presets()) or f"none found in {presets_dir()}"
        raise MinigptError(f"unknown preset {name!r}; known presets: {known}")
    return path


def latest_run(runs_dir: str | Path = "runs") -> Path:
    """The most recently written run under ``runs_dir`` that has a checkpoint.

    Raises:
        MinigptError: no run with a checkpoint exists there.
    """
    root = Path(runs_dir)
    candidates = []
    if root.is_dir():
        for run in root.iterdir():
            ckpt = run / "checkpoints" / "last" / "model.safetensors"
            if ckpt.is_file():
                candidates.append((ckpt.stat().st_mtime, run))
    if not candidates:
        raise MinigptError(
            f"no trained run found under {str(root)!r}; train one first "
            f"(minigpt train configs/shakespeare-cpu.yaml) or pass --run runs/NAME"
        )
    return max(candidates)[1]
