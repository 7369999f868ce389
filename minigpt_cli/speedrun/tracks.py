"""The speedrun's tracks (the shipped table ``tracks.yaml``) and the checks a recipe passes before
it may run on one: Tiny Shakespeare's genuine corpus, characters as tokens, the 10% val split."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

import yaml

from ..config.schema import Config
from ..errors import MinigptError
from ..paths import corpus_path, dataset_registry

#: The package file that holds the tracks.
TRACKS_FILE = "tracks.yaml"
#: The corpus every track trains and evaluates on.
DATASET = "tinyshakespeare"
#: The val split of every track: the last 10% of the text, as nanoGPT's prepare.py splits it.
VAL_FRACTION = 0.1


@dataclass(frozen=True)
class Track:
    """One track: a val loss to reach (nats per character), the record recipe and its budget."""

    name: str
    target: float
    recipe: str  # a shipped config's name (minigpt_cli/config/configs/<recipe>.yaml)
    budget_iters: int  # optimizer steps each seed runs: the recipe's train.max_iters
    about: str  # where the target comes from


def load_tracks() -> dict[str, Track]:
    """The shipped tracks by name, in the table's order (``minigpt_cli/speedrun/tracks.yaml``)."""
    text = (resources.files(__package__) / TRACKS_FILE).read_text(encoding="utf-8")
    return {name: Track(name=name, **fields) for name, fields in yaml.safe_load(text).items()}


def get_track(name: str) -> Track:
    """The track called ``name``.

    Raises:
        MinigptError: no such track; the message lists the tracks.
    """
    tracks = load_tracks()
    if name not in tracks:
        known = ", ".join(f"{t.name} (val <= {t.target})" for t in tracks.values())
        raise MinigptError(f"--track {name}: no such track; the tracks are {known}")
    return tracks[name]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_recipe(cfg: Config, recipe: str, overrides: Sequence[str] = ()) -> None:
    """Refuse a recipe whose val split is not a track's: another corpus than Tiny Shakespeare
    (sha256 of ``datasets.json``), another tokenizer than characters, another val fraction.
    ``overrides``: the ``--set`` values the recipe runs with (the messages name them).

    Raises:
        MinigptError: naming the key to change.
    """
    if overrides:
        recipe = f"{recipe} with --set {' --set '.join(overrides)}"
    want = dataset_registry()[DATASET]["sha256"]
    dc = cfg.data
    if dc.path is not None:
        corpus = Path(dc.path).expanduser()
        got = _sha256(corpus) if corpus.is_file() else None
        if got != want:
            what = f"sha256 {got[:12]}…" if got else "not a single file"
            raise MinigptError(
                f"recipe {recipe} trains on data.path {dc.path} ({what}), not Tiny Shakespeare "
                f"(sha256 {want[:12]}…): every speedrun track is scored on its val split; set "
                "data.path: null (data.dataset tinyshakespeare downloads it)"
            )
    elif dc.dataset != DATASET:
        raise MinigptError(
            f"recipe {recipe} trains on data.dataset {dc.dataset}, not {DATASET}: every speedrun "
            f"track is scored on Tiny Shakespeare's val split; set data.dataset: {DATASET}"
        )
    else:
        on_disk = corpus_path(dc.data_dir, dc.dataset)
        # Missing: fetch_corpus downloads it, checking the sha256.
        if on_disk.is_file() and (got := _sha256(on_disk)) != want:
            raise MinigptError(
                f"{on_disk} is not Tiny Shakespeare (sha256 {got[:12]}…, want {want[:12]}…), "
                f"so recipe {recipe} cannot run a speedrun track",
                "remove it (train downloads it again)",
            )
    if cfg.tokenizer.kind != "char":
        raise MinigptError(
            f"recipe {recipe} uses tokenizer.kind {cfg.tokenizer.kind}: the speedrun's targets are "
            "nats per character; set tokenizer.kind: char"
        )
    tc = cfg.train
    for key, value in (
        ("max_seconds", tc.max_seconds),
        ("early_stop_patience", tc.early_stop_patience),
    ):
        if value is not None:  # the rule: every seed runs the same fixed number of steps
            raise MinigptError(
                f"recipe {recipe} sets train.{key} ({value}): a speedrun's seeds each run the "
                f"recipe's fixed train.max_iters ({tc.max_iters}) steps; set train.{key}: null"
            )
    if dc.val_fraction != VAL_FRACTION:
        raise MinigptError(
            f"recipe {recipe} holds out data.val_fraction {dc.val_fraction}: the tracks' val split "
            f"is the last {VAL_FRACTION:g} of the text; set data.val_fraction: {VAL_FRACTION:g}"
        )


def fetch_corpus(cfg: Config) -> None:
    """Download Tiny Shakespeare where the recipe names it (``data.dataset``) and it is not on disk,
    before any training: a track is scored on this corpus alone, so the speedrun never takes the
    fallback corpus that ``train`` uses where GitHub cannot be reached.

    Raises:
        MinigptError: the download failed; unreachable, it names the mirror variable and the file
            to copy.
    """
    from ..data.download import Unreachable, download

    dc = cfg.data
    if dc.path is not None:
        return
    try:
        download(DATASET, dc.data_dir, dc.url)
    except Unreachable as exc:
        raise MinigptError(
            f"a speedrun trains on Tiny Shakespeare itself, never on its fallback corpus: {exc}"
        ) from None
