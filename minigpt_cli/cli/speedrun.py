"""``speedrun``: a track's recipe at several seeds, the record rule, and the ledger."""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path
from typing import Optional

import typer

from .base import Command, JsonOption, SetOption, app, echo

#: The most seeds one speedrun runs (each is a training run of the recipe: minutes).
MAX_SEEDS = 1000


@app.command(cls=Command)
def speedrun(
    track: str = typer.Option(
        "nanogpt-cpu",
        "--track",
        metavar="NAME",
        help="nanogpt-cpu (val <= 1.886) or nanogpt-gpu (val <= 1.47).",
    ),
    seeds: int = typer.Option(
        5,
        "--seeds",
        min=1,
        max=MAX_SEEDS,
        metavar="N",
        help="Runs of the recipe, seeds seed, seed+1, ...",
    ),
    threads: Optional[int] = typer.Option(
        None,
        "--threads",
        min=1,
        metavar="N",
        show_default=False,
        help="OpenMP/torch threads of every run (and of nanoGPT's); default: the machine's "
        "physical cores.",
    ),
    recipe: Optional[str] = typer.Option(
        None,
        "--recipe",
        metavar="CONFIG",
        show_default=False,
        help="The recipe to run instead of the track's record recipe: a YAML config, or a "
        "shipped config's name.",
    ),
    set_: SetOption = [],
    record: bool = typer.Option(
        False,
        "--record",
        help="If the rule is met, append the result to speedrun/records.md of the git checkout "
        "you run in (which must be clean) and keep the recipe in speedrun/recipes/.",
    ),
    baseline_seconds: Optional[float] = typer.Option(
        None,
        "--baseline-seconds",
        min=0.001,
        metavar="S",
        show_default=False,
        help="nanoGPT's wall time measured by hand in this sitting, for the ratio.",
    ),
    baseline_nanogpt: Optional[Path] = typer.Option(
        None,
        "--baseline-nanogpt",
        metavar="NANOGPT_GIT_DIR",
        show_default=False,
        help="First run nanoGPT's CPU recipe from this clone or git snapshot (1.5 to 4 minutes "
        "on 2 cores), for the ratio and the ledger's baseline row.",
    ),
    baseline_script: Optional[Path] = typer.Option(
        None,
        "--baseline-script",
        metavar="PATH",
        show_default=False,
        help="The script --baseline-nanogpt runs; default: ../shared/tools/nanogpt-reference.sh "
        "from the checkout.",
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        metavar="DIR",
        show_default=False,
        help="A new folder for the runs and speedrun.json; default: "
        "runs/speedrun-<track>-<date>-<time>.",
    ),
    as_json: JsonOption = False,
) -> None:
    """Run a speedrun track: train its record recipe at N seeds and test the record rule.

    A track is a val loss to reach on Tiny Shakespeare's character-level val
    split: nanogpt-cpu, 1.886 (nanoGPT's CPU recipe's final val), and
    nanogpt-gpu, 1.47 (what nanoGPT's GPU recipe reaches), both on the CPU.
    Each seed is a real `minigpt train` process, one after another, all with
    the same --threads. The recipe runs its fixed number of steps. Tiny
    Shakespeare is downloaded first if it is missing (never the fallback
    corpus). On a CPU without bfloat16 units (AVX2 only) a bfloat16 recipe
    runs in float32, and the command says so; --set dtype=bfloat16 keeps it.

    Per seed: the time to target is the run's elapsed_s at its first eval
    with val <= target. The clock starts before the first step, and every
    eval (with its checkpoint save) before that point counts as training
    time; process start-up and data preparation do not. The nanogpt-cpu
    record recipe evaluates once, at its last step (an eval there costs some
    10 steps); nanogpt-gpu's every 260 steps, scoring the whole val split
    (train.eval_full_val: a sample's lucky readings would win time); no
    eval at step 0, no text sample. The stop val is the last checkpoint's loss over the
    whole val split (every character scored once, not a sample). A seed that
    never reaches the target is a miss: it keeps its val in the statistics
    and counts as never in the median time.

    The rule (modded-nanogpt's): a one-sided t-test that the mean stop val is
    below the target, p < 0.01. The report gives each seed, the median time,
    the mean val, p, the CPU, the threads and the torch version, and lands in
    speedrun.json beside the runs. --record then appends a row to the ledger
    (date, commit, change from the previous record's recipe, CPU, seeds,
    median time, mean val, p, ratio to a baseline of this sitting).

    \b
    Examples:
      minigpt speedrun --track nanogpt-cpu --seeds 5
      minigpt speedrun --set dtype=bfloat16 --seeds 5     # a change to try
      minigpt speedrun --recipe my-recipe.yaml --baseline-nanogpt ../nanoGPT --record
    """
    from ..config.schema import load_config, text_override
    from ..errors import MinigptError
    from ..paths import resolve_config
    from ..run.env import git_commit
    from ..runtime.device import emulated_bfloat16_note, resolve_device, resolve_dtype
    from ..speedrun import baseline as baselines
    from ..speedrun import ledger
    from ..speedrun.runner import (
        baseline_busy_line,
        contended,
        format_report,
        logical_cpus,
        physical_cores,
        run_speedrun,
        write_report,
    )
    from ..speedrun.tracks import check_recipe, fetch_corpus, get_track, load_tracks

    t = get_track(track)
    cpus = os.cpu_count() or 1
    if threads is not None and threads > cpus:
        raise MinigptError(
            f"--threads {threads}: this machine has {cpus} CPUs",
            f"give at most {cpus}; the default is its physical cores ({physical_cores()})",
        )
    if baseline_seconds is not None and not math.isfinite(baseline_seconds):
        raise MinigptError(
            f"--baseline-seconds {baseline_seconds}: not a number of seconds",
            "give nanoGPT's measured wall time, e.g. --baseline-seconds 64.0",
        )
    if record and seeds < 2:
        raise MinigptError(
            f"--record needs at least 2 seeds for its t-test (--seeds {seeds})",
            "use --seeds 5, the rule's default",
        )
    if baseline_seconds is not None and baseline_nanogpt is not None:
        raise MinigptError(
            "--baseline-seconds and --baseline-nanogpt both give the baseline; keep one"
        )
    if baseline_script is not None and baseline_nanogpt is None:
        raise MinigptError(
            "--baseline-script names the script --baseline-nanogpt runs; give "
            "--baseline-nanogpt NANOGPT_GIT_DIR too, or drop it"
        )
    root = commit = None
    if record:  # before any training: a refused record costs nothing
        root = ledger.checkout(Path.cwd())
        commit = ledger.clean_commit(root)
    recipe_name = recipe or t.recipe
    recipe_path = resolve_config(recipe_name, note=echo)
    cfg = load_config(recipe_path, set_)
    check_recipe(cfg, recipe_name, set_)
    for other in load_tracks().values():  # another track's record recipe, on this track
        if recipe is not None and other != t and Path(recipe).stem == other.recipe:
            echo(
                f"note: {recipe} is track {other.name}'s recipe (val <= {other.target}); this "
                f"runs it on track {t.name} (val <= {t.target}); --track {other.name} for its own"
            )
    if cfg.seed + seeds - 1 >= 2**32:
        raise MinigptError(
            f"--seeds {seeds} from seed {cfg.seed} would run seeds up to {cfg.seed + seeds - 1}, "
            f"past the largest, {2**32 - 1}",
            "give a smaller seed (--set seed=N) or fewer seeds",
        )
    script = None
    if baseline_nanogpt is not None:
        baselines.check_nanogpt(baseline_nanogpt)
        here = [Path.cwd(), *([root] if root else []), Path(__file__).resolve().parents[2]]
        script = baselines.find_script(baseline_script, here)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = out or Path(cfg.train.out_dir) / f"speedrun-{t.name}-{stamp}"
    if out.exists() and not out.is_dir():
        raise MinigptError(f"--out {out} is a file", "give a new or empty folder")
    if out.exists() and any(out.iterdir()):
        raise MinigptError(f"--out {out} already holds files", "give a new or empty folder")
    fetch_corpus(cfg)  # after the refusals, before the baseline's minutes: never the fallback
    device = resolve_device(cfg.device)
    if note := emulated_bfloat16_note(device, resolve_dtype(cfg.dtype, device)):
        if any(s.partition("=")[0].strip() == "dtype" for s in set_):
            echo(note)  # the user's own --set dtype=bfloat16
        else:  # a default that works: the recipe as run, and the ledger's diff, say float32
            set_ = [*set_, "dtype=float32"]
            cfg = load_config(recipe_path, set_)
            echo(
                "note: this CPU has no bfloat16 units, so PyTorch would emulate the recipe's "
                "bfloat16 products (25x float32's step on an AMD Zen 3): the seeds run with --set "
                "dtype=float32, which the report and a ledger row name; --set dtype=bfloat16 keeps it"
            )
    # Everything a seed's `minigpt train` checks before it writes (the vocabulary, model.init_from,
    # the memory, train.trackers' packages, the folder), checked once before --out is made: a
    # recipe a seed would refuse is refused here, with nothing written. Its notes are said here too
    # (each seed's own go to its log only).
    from ..trainer.setup import plan

    first = plan(
        load_config(recipe_path, [*set_, text_override("train.out_dir", str(out))]),
        f"seed-{cfg.seed}",
        None,
        lambda message: None,
        False,
    )
    for said in first.notes:
        if said != note:
            echo(said)
    if first.estimate:  # train's own estimate of one run, from a few timed steps
        echo(f"each seed: {first.estimate[0]}")
    threads = threads or physical_cores()
    base = (  # before --out is made: a baseline that fails leaves nothing behind
        baselines.run_nanogpt(script, baseline_nanogpt, threads, echo)
        if script is not None
        else baselines.by_hand(baseline_seconds)
        if baseline_seconds is not None
        else None
    )
    if base is not None and contended(base, threads, logical_cpus()):
        if record:  # the ledger's ratio would be the busy machine's: refused before the seeds
            raise MinigptError(
                f"--record: other processes kept {base['other_cores_busy']:.1f} of "
                f"{logical_cpus()} CPU cores busy during nanoGPT's baseline, so its "
                f"{base['seconds']:.1f} s is not this machine's time and the ledger's ratio would "
                "flatter the record",
                "run the speedrun again on a quiet machine (nothing was written)",
            )
        echo(baseline_busy_line(base, logical_cpus()))
    out.mkdir(parents=True, exist_ok=True)
    if set_:  # the recipe as run, so the seeds, the report and the ledger name one file
        recipe_path = _write_recipe(recipe_path, set_, out / "recipe.yaml")
    report = run_speedrun(
        t, recipe_path, cfg, [cfg.seed + i for i in range(seeds)], threads, out, echo, set_
    )
    median = report["median_time_s"]
    report["baseline"] = base
    report["ratio"] = median / base["seconds"] if base and median is not None else None
    report["commit"] = commit or git_commit()
    path = write_report(out, report)
    print(json.dumps(report, indent=1) if as_json else format_report(report), end="")
    echo(f"report written to {path}")
    if not report["hits"]:
        best = min(s["stop_val"] for s in report["seeds"])
        which = f"all {seeds} seeds" if seeds > 1 else "its one seed"
        raise MinigptError(
            f"recipe {report['recipe']} never reached track {t.name}'s val {t.target} within its "
            f"budget of {report['budget_iters']} steps: {which} missed (best stop val {best:.4f}; "
            f"report and runs in {out})",
            "give the recipe more steps (train.max_iters) or a faster schedule",
        )
    if not record:
        return
    if not report["record_rule_met"]:
        p = report["p"]
        raise MinigptError(
            f"not a record: p = {p:.3g} is not below {report['p_record']} (mean val "
            f"{report['mean_val']:.4f} against {t.target}); nothing written to the ledger"
            if p is not None
            else "not a record: p is undefined (every seed gave the same val); nothing written "
            "to the ledger",
            "more seeds or a lower val make the t-test surer",
        )
    written, number = ledger.record(root, report, recipe_path, commit)
    echo(f"record {number} of track {t.name} written to {written}; commit it with the recipe kept")


def _write_recipe(recipe: Path, overrides: list[str], path: Path) -> Path:
    """``recipe`` with ``--set`` ``overrides`` applied, written to ``path`` (through a temporary
    file); returns ``path``."""
    from ..config.schema import apply_overrides
    from ..config.yaml_io import dump_yaml, read_yaml

    data = apply_overrides(read_yaml(recipe, "config") or {}, overrides)
    text = f"# {recipe.name} with --set {' --set '.join(overrides)}\n" + dump_yaml(data)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
