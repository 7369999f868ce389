"""Slurm: an sbatch script that runs ``torchrun -m minigpt_cli train CONFIG`` on every node.

The script asks Slurm for ``nodes`` machines with one task each; ``srun`` starts one torchrun per
node, and torchrun starts that node's processes (one per GPU, or ``procs_per_node`` on CPUs). The
nodes meet at a c10d rendezvous on the allocation's first host (``scontrol show hostnames``), on a
port drawn from the job id, with the job id as the rendezvous id: torchtitan's
``multinode_trainer.slurm`` and torchrun's multi-node recipe, written from Slurm's variables
instead of by hand.

:func:`plan_job` checks what the user gave (the config loads and validates; the time is in
Slurm's format); :func:`sbatch_script` writes the text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..errors import MinigptError

#: The start of the script's second line (the command's arguments follow), which marks a file
#: this command wrote and may write again.
MARK = "# Made by: minigpt launch slurm"

#: Where the rendezvous ports start: the port is this plus the job id modulo :data:`PORT_SPAN`,
#: below Linux's ephemeral range (32768 on), so that two jobs sharing a first node rarely meet.
PORT_BASE, PORT_SPAN = 20000, 10000

#: Seconds before the time limit at which Slurm sends SIGTERM to the training (``--time`` only):
#: minigpt saves checkpoints/last on SIGTERM, and a checkpoint of a large model takes a while.
SIGNAL_LEAD_S = 120

_TIME_FORMS = (
    "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 04:00:00 for four hours, 2-00:00:00 "
    "for two days)"
)


@dataclass(frozen=True)
class SlurmJob:
    """What the sbatch script runs: checked values (build it with :func:`plan_job`)."""

    config: str  # the config as the user named it: a path relative to ``workdir``, or a name
    workdir: Path  # the folder the job starts in (``--chdir``): where runs/ and data/ land
    job_name: str
    nodes: int
    gpus_per_node: int
    procs_per_node: int  # torchrun's --nproc-per-node: the GPUs, or CPU processes
    cpus_per_node: int
    time: Optional[str]
    time_s: Optional[int]  # the limit in seconds; None: none given, or no limit
    partition: Optional[str]
    port: Optional[int]  # None: drawn from the job id
    overrides: tuple[str, ...]  # --set items for prepare and train, in order
    resume: Optional[str]  # train's --resume: auto, or a run folder
    max_restarts: int = 0  # torchrun's --max-restarts: group restarts after a lost worker


def check_time(text: str) -> tuple[str, Optional[int]]:
    """``text`` and its seconds (None: no limit) if it is a Slurm time limit (``sbatch --time``'s
    forms), else an error.

    Raises:
        MinigptError: not one of Slurm's forms, a field out of range (minutes past 59 after
        hours), or zero (Slurm's "no limit": leave --time out for the partition's default).
    """
    t = text.strip()
    if t.upper() in ("INFINITE", "UNLIMITED"):
        return t, None
    days = re.fullmatch(r"(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?", t)
    plain = re.fullmatch(r"(\d+)(?::(\d+)(?::(\d+))?)?", t)
    if days:
        d, h, m, s = (int(g) if g else 0 for g in days.groups())
        bounded = [("hours", h, 24), ("minutes", m, 60), ("seconds", s, 60)]
    elif plain:
        a, b, c = plain.groups()
        # Slurm reads MM, MM:SS and HH:MM:SS: the first field is hours only when there are three.
        h, m, s = (int(a), int(b), int(c)) if c else (0, int(a), int(b or 0))
        d = 0
        bounded = [("minutes", m, 60), ("seconds", s, 60)] if c else [("seconds", s, 60)]
    else:
        raise MinigptError(f"--time {text!r} is not a Slurm time limit; give {_TIME_FORMS}")
    for what, value, limit in bounded:
        if value >= limit:
            raise MinigptError(
                f"--time {text!r}: {value} {what} is past {limit - 1}; give {_TIME_FORMS}"
            )
    if d == h == m == s == 0:
        raise MinigptError(
            f"--time {text!r} is no time at all (to Slurm, 0 means no limit); give a limit such "
            "as 04:00:00, or leave --time out for the partition's default"
        )
    return t, ((d * 24 + h) * 60 + m) * 60 + s


def check_partition(text: str) -> str:
    """``text`` if it names Slurm partitions (a name, or names joined by commas), else an error.

    Raises:
        MinigptError: a space, quote or other character no partition name has.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*", text):
        raise MinigptError(
            f"--partition {text!r} is not a partition name (letters, digits, '.', '_', '-'; "
            "several joined by commas); sinfo lists the partitions"
        )
    return text


def plan_job(
    config: str,
    *,
    nodes: int,
    gpus_per_node: int,
    procs_per_node: Optional[int] = None,
    cpus_per_node: Optional[int] = None,
    time: Optional[str] = None,
    partition: Optional[str] = None,
    port: Optional[int] = None,
    overrides: Sequence[str] = (),
    resume: Optional[str] = None,
    max_restarts: int = 0,
    workdir: Optional[Path] = None,
    note: Callable[[str], None] = lambda message: None,
) -> SlurmJob:
    """The checked job: the config loaded with ``overrides`` as train will load it, the counts
    agreeing with each other and with the config's device.

    With ``gpus_per_node`` 0 the processes train on CPUs (gloo): ``device=cpu`` is added to the
    overrides unless the config says ``cpu`` already. ``cpus_per_node`` defaults to one per
    process.

    Raises:
        MinigptError: the config is missing or invalid; counts below 1 (0 GPUs allowed);
        ``procs_per_node`` other than the GPU count; a config whose device cannot use the GPUs
        asked for (or that asks for a GPU with none); fewer CPUs than processes; a bad time,
        partition or port; a working folder whose name an #SBATCH line cannot hold.
    """
    from ..config.schema import load_config

    if nodes < 1:
        raise MinigptError(f"--nodes {nodes}: a job needs at least 1 node")
    if gpus_per_node < 0:
        raise MinigptError(
            f"--gpus-per-node {gpus_per_node}: give the GPUs of each node, or 0 to train on CPUs"
        )
    if gpus_per_node and procs_per_node not in (None, gpus_per_node):
        raise MinigptError(
            f"--procs-per-node {procs_per_node} with --gpus-per-node {gpus_per_node}: torchrun "
            "starts one process per GPU; leave --procs-per-node out, or give --gpus-per-node 0 "
            "to train on CPUs"
        )
    procs = gpus_per_node or (1 if procs_per_node is None else procs_per_node)
    if procs < 1:
        raise MinigptError(f"--procs-per-node {procs}: each node needs at least 1 process")
    cpus = procs if cpus_per_node is None else cpus_per_node
    if cpus < procs:
        raise MinigptError(
            f"--cpus-per-node {cpus} is fewer than the {procs} processes of each node; give at "
            f"least --cpus-per-node {procs}"
        )
    if max_restarts < 0:
        raise MinigptError(f"--max-restarts {max_restarts}: give 0 (none) or more")
    if port is not None and not 1024 <= port <= 65535:
        raise MinigptError(
            f"--port {port}: give a port from 1024 to 65535, or leave it out (a port drawn from "
            "the job id)"
        )
    cfg = load_config(config, list(overrides), note=note)  # refuses a missing or invalid config
    overrides = tuple(overrides)
    if gpus_per_node and cfg.device in ("cpu", "mps"):
        raise MinigptError(
            f"{config} trains on device {cfg.device}, which cannot use the {gpus_per_node} GPUs "
            "per node asked for; --set device=auto (or cuda) trains on them, --gpus-per-node 0 "
            "--procs-per-node P on CPUs"
        )
    if not gpus_per_node and cfg.device != "cpu":
        if cfg.device != "auto":
            raise MinigptError(
                f"{config} trains on device {cfg.device}, but --gpus-per-node 0 asks for no GPU; "
                "give --gpus-per-node G, or --set device=cpu"
            )
        overrides = (*overrides, "device=cpu")  # a node's GPUs, if any, are not the job's
        load_config(config, list(overrides))  # e.g. dtype float16, which a CPU cannot train in
    if resume is not None:
        from ..run.folder import find_resume_dir

        find_resume_dir(cfg.train.out_dir, cfg.name, resume)  # a folder given must be a run's
    time_text, time_s = check_time(time) if time is not None else (None, None)
    workdir = Path(workdir or Path.cwd()).absolute()
    if re.search(r'["\n\r]', str(workdir)):
        raise MinigptError(
            f"the job would start in {str(workdir)!r}, whose name holds a quote or a line break, "
            "which an #SBATCH line cannot carry; run minigpt launch from a folder without them"
        )
    return SlurmJob(
        config=str(config),
        workdir=workdir,
        job_name=cfg.name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        procs_per_node=procs,
        cpus_per_node=cpus,
        time=time_text,
        time_s=time_s,
        partition=None if partition is None else check_partition(partition),
        port=port,
        overrides=overrides,
        resume=resume,
        max_restarts=max_restarts,
    )


def sbatch_script(job: SlurmJob, made_by: str) -> str:
    """The sbatch script's text for ``job``; ``made_by`` (the arguments of the ``minigpt launch
    slurm`` that asked for it) is written in its header."""
    q = shlex.quote
    sets = "".join(f" --set {q(item)}" for item in job.overrides)
    cfg = q(job.config)
    resume = f" --resume {q(job.resume)}" if job.resume else ""
    header = [
        f"#SBATCH --job-name={job.job_name}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",  # one torchrun per node; it starts the node's processes
        f"#SBATCH --cpus-per-task={job.cpus_per_node}",
    ]
    if job.gpus_per_node:
        header.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if job.time:
        header.append(f"#SBATCH --time={job.time}")
    if job.time_s and job.time_s >= 5 * SIGNAL_LEAD_S:  # a shorter job gets the limit's own TERM
        header.append(f"#SBATCH --signal=TERM@{SIGNAL_LEAD_S}")
    if job.partition:
        header.append(f"#SBATCH --partition={job.partition}")
    # sbatch reads a value in double quotes whole (a folder with spaces).
    chdir = f'"{job.workdir}"' if re.search(r"\s", str(job.workdir)) else str(job.workdir)
    header += [f"#SBATCH --chdir={chdir}", "#SBATCH --output=%x-%j.out"]
    port = str(job.port) if job.port else f"$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))"
    where = (
        f"{job.gpus_per_node} GPU(s)"
        if job.gpus_per_node
        else f"{job.procs_per_node} CPU process(es)"
    )
    return "\n".join(
        [
            "#!/bin/bash",
            f"{MARK} {' '.join(made_by.split())}",
            f"# {job.nodes} node(s) x {where}: submit with `sbatch FILE`. The job starts in",
            "# --chdir below, where the config's relative paths, runs/ and data/ are; every node",
            "# must see that folder (a shared file system). It runs the torchrun and minigpt on",
            "# PATH at submission (Slurm passes the submitting shell's environment on).",
            *header,
            "set -euo pipefail",
            "",
            "for tool in torchrun minigpt; do",
            '    if ! command -v "$tool" >/dev/null; then',
            '        echo "error: $tool is not on PATH in the job;" \\',
            '            "activate minigpt\'s environment before sbatch, or in this script" >&2',
            "        exit 2",
            "    fi",
            "done",
            "",
            "# The rendezvous: torchrun's c10d store on the job's first node, named by the job id.",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"rdzv_port={port}",
            "# Each process's threads: the node's CPUs shared among its processes.",
            f"export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / {job.procs_per_node} > 0 ?"
            f" SLURM_CPUS_PER_TASK / {job.procs_per_node} : 1 ))",
            "# Seconds torchrun gives its processes to save and stop after a SIGTERM, before it",
            f"# kills them (30 by default); --signal comes {SIGNAL_LEAD_S} s before a time limit.",
            f"export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={SIGNAL_LEAD_S - 20}",
            *(
                [
                    "# Every node's torchrun keeps its own rendezvous store, so that a restarted",
                    "# group (--max-restarts) meets afresh on each node (docs/gpu.md).",
                    "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                ]
                if job.max_restarts and job.nodes > 1
                else []
            ),
            "",
            "# The corpus, tokenizer and token files, made once here before the processes start",
            "# (else each node's first process makes them while the others wait at a barrier).",
            f"minigpt prepare {cfg}{sets}",
            "",
            "# --cpus-per-task again: some Slurm versions (22.05 among them) do not pass it on.",
            'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 \\',
            '    --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1 \\',
            f'    torchrun --nnodes="$SLURM_NNODES" --nproc-per-node={job.procs_per_node}'
            + (f" --max-restarts={job.max_restarts}" if job.max_restarts else "")
            + " \\",
            '    --rdzv-backend=c10d --rdzv-endpoint="$head_node:$rdzv_port"'
            ' --rdzv-id="$SLURM_JOB_ID" \\',
            f"    -m minigpt_cli train {cfg}{sets}{resume}",
            "",
        ]
    )


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a script this command wrote (its second line is :data:`MARK`'s)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [f.readline(), f.readline()]
    except OSError:
        return False
    return lines[0] == "#!/bin/bash\n" and lines[1].startswith(MARK)
