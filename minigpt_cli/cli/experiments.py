"""Many runs: ``sweep`` trains the variants of a sweep file, ``compare`` puts runs side by side."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import List, Optional

import typer

from .base import Command, JsonOption, app, echo, fix_when_interrupted


@app.command(cls=Command)
def sweep(
    file: Path = typer.Argument(
        ..., metavar="SWEEP", help="A sweep file, or a shipped experiment's name (ffn, ...)."
    ),
    sets: List[str] = typer.Option(
        [],
        "--set",
        metavar="KEY=VALUE",
        help="Override a config key in every run, after the file's set: (repeatable).",
    ),
    seeds: Optional[int] = typer.Option(
        None, "--seeds", min=1, metavar="N", help="Seeds per variant or trial."
    ),
    budget: Optional[str] = typer.Option(
        None,
        "--budget",
        metavar="KIND=N",
        help="Each run's budget instead of the file's: iters=N, tokens=N or seconds=S.",
    ),
    scale_schedule: bool = typer.Option(
        False,
        "--scale-schedule",
        help="With --budget: scale the warmup, the decay's end (lr_decay_iters) and the eval and "
        "log intervals by the budget's steps over the sweep file's, so a shrunk sweep keeps the "
        "shape of its schedule (recorded in sweep.json).",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Check the sweep file and overrides, print the runs with their schedules and any "
        "note on the budget, and train nothing.",
    ),
    jobs: Optional[int] = typer.Option(
        None,
        "--jobs",
        min=1,
        metavar="N",
        show_default=False,
        help="Runs at a time, each in its own process with 1/N of the cores and, on a machine "
        "with GPUs, a GPU of its own (CUDA_VISIBLE_DEVICES). Default: the GPU count where the "
        "runs train on CUDA, else 1.",
    ),
    storage: Optional[str] = typer.Option(
        None,
        "--storage",
        metavar="URL",
        help="Where the study lives: an RDB URL (sqlite:///s.db, postgresql://...) "
        "or a journal file (default: the sweep folder's study.journal).",
    ),
    worker: bool = typer.Option(
        False, "--worker", help="Join the study in --storage as one of many workers."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the summary as JSON instead of a table."
    ),
    progress: Optional[bool] = typer.Option(
        None,
        "--progress/--no-progress",
        help="Show a progress bar over the sweep (default: only when stderr is a terminal).",
    ),
) -> None:
    """Train every variant of a sweep file at every seed, then compare them.

    A sweep file names a base config, a grid and/or named variants of --set
    overrides, seeds, and a budget per run: optimizer steps (iters), tokens,
    or wall-clock seconds, so that the comparison is fair. Runs land in
    runs/<sweep>/<variant>-s<seed>/ as ordinary runs; the summary (a table in
    summary.md, .csv and .json, and summary.png) lands beside them. --set,
    --seeds and --budget override the file (recorded in sweep.json). A budget
    that leaves a run inside its warmup, with fewer than 3 evals or before its
    decay starts gets a note naming the keys to scale; --scale-schedule scales
    them with the budget. Each finished run gets a line: name, seed, val loss,
    time.

    A search: section has Optuna suggest each trial's values (TPE or
    random), prune bad trials at their evals (median or ASHA) and keep the
    study in the sweep folder; with --storage and --worker, processes on
    many machines share one study (or one grid) and no run is done twice.

    Started again after a kill, a sweep skips the finished runs and resumes
    the interrupted one from its checkpoint; a sweep file, base config or
    override changed in between is refused, naming the difference, once a
    run has saved a checkpoint (before that, the edited file is a new start).
    The runs' folder is the sweep's: train.out_dir may not be overridden. More
    --jobs than cores is slower than fewer: the runs then fight for the same
    cores, and each one's matmuls get less of them.

    \b
    Examples: minigpt sweep ffn --budget iters=50 --scale-schedule --seeds 1
              minigpt sweep optimizer --budget iters=80 --scale-schedule --dry-run
              minigpt sweep search.yaml --storage /shared/search.journal --worker
    """
    from ..experiments.compare import format_summary
    from ..experiments.search import format_report
    from ..experiments.sweep import Overrides, format_plan, run_sweep
    from ..experiments.trials import format_trials

    again = shlex.join(
        [
            "minigpt",
            "sweep",
            str(file),
            *(w for s in sets for w in ("--set", s)),
            *(["--seeds", str(seeds)] if seeds else []),
            *(["--budget", budget] if budget else []),
            *(["--scale-schedule"] if scale_schedule else []),
            *(["--storage", storage] if storage else []),
            *(["--worker"] if worker else []),
            *(["--jobs", str(jobs)] if jobs else []),
        ]
    )
    with fix_when_interrupted(lambda exc: f"continue the sweep with: {again}"):
        result = run_sweep(
            file,
            jobs=jobs,
            progress=progress,
            overrides=Overrides(tuple(sets), seeds, budget, scale_schedule),
            storage=storage,
            worker=worker,
            dry_run=dry_run,
            echo=echo,
        )
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        print(
            (format_plan(result) if dry_run else "")
            + (format_summary(result) if "rows" in result else "")
            + (format_report(result["search"]) if "search" in result else "")
            + ("\n" + format_trials(result["study"]) if "study" in result else ""),
            end="",
        )


@app.command(cls=Command)
def compare(
    paths: Optional[List[Path]] = typer.Argument(
        None, metavar="RUN_OR_SWEEP...", help="Run folders, or folders of runs (a sweep's)."
    ),
    output: Optional[Path] = typer.Option(
        None,
        "--output",
        "-o",
        metavar="DIR",
        help="Where summary.md/.csv/.json/.png go (default: the sweep folder when "
        "one is given, else ./comparison).",
    ),
    target: Optional[float] = typer.Option(
        None,
        "--target",
        metavar="LOSS",
        help="Val loss for the time-to-target column (default: the worst run's final val loss).",
    ),
    metric: Optional[str] = typer.Option(
        None,
        "--metric",
        metavar="val_loss|bits_per_byte",
        help="What the pairwise sentences and the plot compare (default: "
        "val_loss when the runs share corpus and tokenizer, else "
        "bits_per_byte).",
    ),
    storage: Optional[str] = typer.Option(
        None,
        "--storage",
        metavar="URL",
        help="Instead of run folders: list the trials of a study in this "
        "storage (an RDB URL or a journal file), every worker's.",
    ),
    study: Optional[str] = typer.Option(
        None,
        "--study",
        metavar="NAME",
        help="The study in --storage (default: its only one; a sweep's name).",
    ),
    as_json: JsonOption = False,
) -> None:
    """Put runs side by side: one row per variant, averaged over seeds.

    Runs whose configs differ only in the seed are one variant; runs of one
    config at one seed are repeats, noted and counted once. summary.md and
    .csv show the keys that differ, parameters, FLOPs per token, tokens/s,
    final and best val loss (mean ± standard deviation over seeds), the val
    loss at equal wall time, val bits per byte (the fair measure across
    tokenizers), and the time to a target loss; the terminal gets the keys
    that differ and the results, in 100 columns. A sentence per pair says
    whether the difference exceeds the seed noise, by Welch's t-test at
    p < 0.05, and while it does not, how many seeds per variant would resolve
    it (power 0.8). summary.png plots the table's metric.

    With --storage, the study's trials instead, as the workers of a sweep
    recorded them: trial, state, variant or params, seed, value, and the
    host and run folder of the worker that took it (summary.md, .csv and
    .json too, with --output).

    \b
    Examples:
      minigpt compare runs/ffn
      minigpt compare runs/quick runs/quick-rope --target 1.9
      minigpt compare --storage sqlite:///ffn.db --study ffn
    """
    from ..experiments.compare import expand, format_summary, summarize
    from ..experiments.trials import format_trials, load_trials, write_trials

    if storage is not None:
        trials = load_trials(storage, study, paths or [])
        if output is not None:
            write_trials(trials, output)
        print(
            json.dumps(trials, indent=1) if as_json else format_trials(trials),
            end="" if not as_json else "\n",
        )
        return
    runs_ = expand(paths or [])
    out = output or (paths[0] if len(paths) == 1 and runs_ != paths else Path("comparison"))
    result = summarize(runs_, out=out, target=target, metric=metric, echo=echo)
    print(
        json.dumps(result, indent=1) if as_json else format_summary(result),
        end="" if not as_json else "\n",
    )
    echo(f"summary written to {out}/summary.md, .csv, .json and .png")
