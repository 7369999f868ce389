"""What ``train`` and ``train --dry-run`` both refuse before anything is downloaded or written: paths
``train`` would write that cannot be written, and a ``sample.prompt`` the tokenizer cannot encode.

One check for both, so that the dry run refuses with the very line ``train``
gives: :func:`check_paths` (``train`` runs it before its first download or
write, the dry run before it describes the run) and
:func:`~minigpt_cli.sample.sampling.encode_prompt` (``train`` once its tokenizer is
ready, the dry run once :func:`~.describe.preview` has it; ``generate`` gives
the same line for the same prompt).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..config.schema import Config
from ..fileio import check_writable
from ..paths import corpus_path, dataset_dir
from ..run.folder import CHECKPOINTS, CONFIG, ENV, LOCK, newest_run
from ..run.metrics import RunLogger


def run_files(run_dir: Path) -> tuple[list[Path], set[Path]]:
    """The files ``train`` writes in the folder of a run it resumes (its lock, config.yaml, the logs of
    :class:`~minigpt_cli.run.metrics.RunLogger`, env.json), and those of them it appends to (opens in place)
    rather than replaces."""
    log = RunLogger(run_dir, enabled=False)
    appended = [run_dir / LOCK, log.metrics_path, log.log_path, log.samples_path]
    return appended + [run_dir / CONFIG, run_dir / ENV, log.plot_path], set(appended)


def _resumed(cfg: Config, resume: Optional[str]) -> Optional[Path]:
    """The run folder ``resume`` continues, when it is there (``auto``: the newest run of the config's name)."""
    if resume == "auto":
        resume = newest_run(cfg.train.out_dir, cfg.name)
    return Path(resume) if resume is not None and Path(resume).is_dir() else None


def paths_to_write(cfg: Config, resume: Optional[str] = None) -> list[tuple[Path, bool]]:
    """The paths ``train`` will write, as ``(path, is_folder)``, in the order it writes them.

    - the named dataset's folder, when its corpus is missing or fails its checksum (the download);
    - the tokenizer file, when it is missing (trained and saved);
    - the named dataset's folder again, when no token files of the tokenizer's kind are there yet
      (prepared; token files of another tokenizer of that kind may make ``train`` prepare as well);
    - ``data.data_dir``, for a ``data.path`` corpus, when it is not a folder yet (its corpus folder goes in it);
    - ``train.out_dir``, for a new run; with ``resume``, the run folder, its checkpoints folder and the
      files :func:`run_files` names, when the run folder is there (a missing one is ``--resume``'s own
      refusal). For ``auto``, that is the newest run of the config's name, or ``train.out_dir`` while there
      is none.
    """
    from ..data.download import file_ok
    from ..data.pipeline import tokenizer_path

    if resume == "auto":  # the run auto continues, if there is one yet
        found = newest_run(cfg.train.out_dir, cfg.name)
        resume = None if found is None else str(found)
    dc, out = cfg.data, []
    folder = dataset_dir(dc.data_dir, dc.dataset)
    own_text = getattr(dc, "path", None) is not None
    corpus_ok = own_text or file_ok(corpus_path(dc.data_dir, dc.dataset), dc.dataset)
    if not corpus_ok:
        out.append((folder, True))
    if own_text:
        if not Path(dc.data_dir).is_dir():
            out.append((Path(dc.data_dir), True))
        if cfg.tokenizer.path and not Path(cfg.tokenizer.path).is_file():
            out.append((Path(cfg.tokenizer.path), False))
    else:
        tok = tokenizer_path(cfg)
        if not tok.is_file():
            out.append((tok, False))
        elif corpus_ok and not any(folder.glob(f"{cfg.tokenizer.kind}-*/meta.json")):
            out.append((folder, True))
    if resume is None:
        out.append((Path(cfg.train.out_dir), True))
    elif Path(resume).is_dir():
        run = Path(resume)
        out += [(run, True), (run / CHECKPOINTS, True)] + [(path, False) for path in run_files(run)[0]]
    return out


def check_paths(cfg: Config, resume: Optional[str] = None) -> None:
    """Refuse a path :func:`paths_to_write` names that cannot be written (a file in the way of a folder, a
    folder that cannot be written into, a name too long for the file system; in a resumed run, a folder in
    the way of one of its files, or a file it appends to that is read-only), writing nothing.

    Raises:
        MinigptError: ``cannot write PATH: <reason>; <fix>``, the line the write itself would end with
            (:func:`~minigpt_cli.fileio.check_writable`).
    """
    run = _resumed(cfg, resume)
    appended = run_files(run)[1] if run is not None else set()
    for path, folder in paths_to_write(cfg, resume):
        check_writable(path, folder, append=path in appended, in_run=run is not None and run in path.parents)
