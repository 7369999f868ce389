"""``minigpt launch TARGET``: a batch script that trains a config on a cluster (Typer sub-app).

One command per scheduler (``slurm``); each checks its inputs and the config, then writes the
script (:mod:`minigpt_cli.launch`) to ``--output`` or prints it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from ..errors import MinigptError
from .base import TYPER_SETTINGS, Command, Group, SetOption, echo

app = typer.Typer(
    name="launch",
    cls=Group,
    help="Write a batch script that trains a config on a cluster's machines with torchrun: "
    "slurm (an sbatch script).",
    **TYPER_SETTINGS,
)


@app.command(cls=Command)
def slurm(
    config: str = typer.Argument(
        ..., metavar="CONFIG", help="YAML config (or a shipped config's name), as for train."
    ),
    nodes: int = typer.Option(..., "--nodes", min=1, metavar="N", help="Machines (Slurm nodes)."),
    gpus_per_node: int = typer.Option(
        ...,
        "--gpus-per-node",
        min=0,
        metavar="G",
        help="GPUs of each node, one training process each; 0 trains on CPUs (gloo) with "
        "--procs-per-node processes.",
    ),
    procs_per_node: Optional[int] = typer.Option(
        None,
        "--procs-per-node",
        min=1,
        metavar="P",
        help="With --gpus-per-node 0: training processes per node (default 1).",
    ),
    cpus_per_node: Optional[int] = typer.Option(
        None,
        "--cpus-per-node",
        min=1,
        metavar="C",
        help="CPU cores to ask for on each node (default: one per process); the processes share "
        "them as threads (OMP_NUM_THREADS).",
    ),
    time: Optional[str] = typer.Option(
        None,
        "--time",
        metavar="HH:MM:SS",
        help="Time limit, in any of sbatch's forms (MM, HH:MM:SS, D-HH:MM:SS, ...); the run is "
        "sent SIGTERM 2 minutes before it and saves checkpoints/last (default: the "
        "partition's limit).",
    ),
    partition: Optional[str] = typer.Option(
        None, "--partition", metavar="P", help="Slurm partition (default: the cluster's default)."
    ),
    port: Optional[int] = typer.Option(
        None,
        "--port",
        metavar="PORT",
        help="Rendezvous port on the first node (default: 20000 + the job id modulo 10000).",
    ),
    resume: Optional[str] = typer.Option(
        None,
        "--resume",
        metavar="auto|DIR",
        help="Passed to train: auto continues the newest run of this config's name from its "
        "checkpoints/last (a new run when there is none), so the same script can be submitted "
        "again after a time limit; DIR continues that run folder.",
    ),
    max_restarts: int = typer.Option(
        0,
        "--max-restarts",
        metavar="K",
        help="torchrun restarts the group up to K times after a worker is lost; each restart "
        "resumes the same run folder from its checkpoints/last (docs/gpu.md).",
    ),
    output: Optional[Path] = typer.Option(
        None,
        "--output",
        "-o",
        metavar="FILE",
        help="Write the script here (atomically) instead of printing it; an existing file is "
        "replaced only if this command wrote it.",
    ),
    set_: SetOption = [],
) -> None:
    """Write an sbatch script that trains CONFIG on N nodes with torchrun.

    The script asks for N nodes with one task each; srun starts one
    torchrun per node, which starts one training process per GPU (or
    --procs-per-node on CPUs), all meeting at a c10d rendezvous on the
    first node (scontrol show hostnames $SLURM_JOB_NODELIST, the job id as
    its id). It prepares the data once before training; the run lands in
    runs/ under the folder this command runs in (the job's --chdir), which
    every node must see. The config and --set items are checked now, as
    train would check them.

    \b
    Examples:
      minigpt launch slurm configs/shakespeare.yaml --nodes 2 --gpus-per-node 8 \\
          --time 04:00:00 --partition gpu --output train.sbatch && sbatch train.sbatch
      minigpt launch slurm configs/tiny.yaml --nodes 1 --gpus-per-node 0 --procs-per-node 2
    """
    from ..fileio import atomic_write_text, check_writable
    from ..launch.slurm import is_ours, plan_job, sbatch_script

    job = plan_job(
        config,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        procs_per_node=procs_per_node,
        cpus_per_node=cpus_per_node,
        time=time,
        partition=partition,
        port=port,
        overrides=set_,
        resume=resume,
        max_restarts=max_restarts,
        note=echo,
    )
    words = [config, "--nodes", str(nodes)]
    words += ["--gpus-per-node", str(gpus_per_node)]
    given = {
        "--procs-per-node": procs_per_node,
        "--cpus-per-node": cpus_per_node,
        "--time": time,
        "--partition": partition,
        "--port": port,
        "--resume": resume,
        "--max-restarts": max_restarts or None,
    }
    words += [w for flag, value in given.items() if value is not None for w in (flag, str(value))]
    words += [w for item in set_ for w in ("--set", item)]
    text = sbatch_script(job, shlex.join(words))
    if output is None:
        print(text, end="")
        return
    if output.is_file() and not is_ours(output):
        raise MinigptError(
            f"--output {output} exists and is not a script minigpt launch slurm wrote; "
            "name a new file, or remove it first"
        )
    check_writable(output, folder=False)
    atomic_write_text(output, text)
    echo(f"wrote {output}: submit it with sbatch {shlex.quote(str(output))}")
