"""``minigpt launch slurm``: the sbatch script's text for GPUs and for CPUs, that bash parses it and
that torchrun knows every option it passes, and the refusals (one line, exit 2, no file written).

The script running on a real Slurm is tests/test_slurm.py (marked ``slurm``).
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY, assert_user_error

REPO = Path(__file__).resolve().parent.parent
GPU_CONFIG = REPO / "configs" / "shakespeare.yaml"  # device: auto


def script_lines(text: str) -> list[str]:
    """The script's command lines: comments left out, continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip()[:1] not in ("", "#")]


def sbatch_options(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", text, flags=re.M))


def command(text: str, head: str) -> list[str]:
    """The words of the script's command line that starts with ``head``."""
    line = next(line for line in script_lines(text) if line.startswith(head))
    return shlex.split(line)


def torchrun_flags(line: str) -> list[str]:
    """The options given to torchrun in a command line (before its ``-m minigpt_cli``)."""
    words = shlex.split(line)
    words = words[words.index("torchrun") + 1 : words.index("minigpt_cli")]
    return [word.split("=")[0] for word in words if word.startswith("-")]


@functools.cache
def torchrun_options() -> set[str]:
    """Every option ``torchrun --help`` lists (this environment's torch); asked once (a process that
    imports torch: 1.3 s)."""
    help_text = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(re.findall(r"(?<![\w-])(--?[\w-]+)", help_text))


def test_gpu_script_runs_torchrun_on_every_node_with_slurms_rendezvous(cli, tmp_path):
    out = tmp_path / "train.sbatch"
    res = cli(
        "launch", "slurm", GPU_CONFIG, "--nodes", "4", "--gpus-per-node", "8",
        "--time", "1-12:00:00", "--partition", "gpu,gpu-long", "--output", out,
        "--set", "train.max_iters=2000", "--set", "model.n_layer=4",
    )  # fmt: skip
    assert res.exit_code == 0, res
    assert res.stdout == "" and f"wrote {out}" in res.stderr
    text = out.read_text()
    assert text.startswith(f"#!/bin/bash\n# Made by: minigpt launch slurm {GPU_CONFIG} --nodes 4 ")
    assert sbatch_options(text) == {
        "job-name": "shakespeare",
        "nodes": "4",
        "ntasks-per-node": "1",
        "cpus-per-task": "8",
        "gpus-per-node": "8",
        "time": "1-12:00:00",
        "signal": "TERM@120",
        "partition": "gpu,gpu-long",
        "chdir": str(Path.cwd()),
        "output": "%x-%j.out",
    }
    lines = script_lines(text)
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    assert "rdzv_port=$((20000 + SLURM_JOB_ID % 10000))" in lines
    assert "export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=100" in lines  # within --signal's 120 s
    sets = ["--set", "train.max_iters=2000", "--set", "model.n_layer=4"]
    assert command(text, "minigpt prepare") == ["minigpt", "prepare", str(GPU_CONFIG), *sets]
    srun = command(text, "srun")
    torchrun = srun[srun.index("torchrun") :]
    assert srun[: srun.index("torchrun")] == [
        "srun",
        "--nodes=$SLURM_NNODES",
        "--ntasks-per-node=1",
        "--cpus-per-task=$SLURM_CPUS_PER_TASK",
        "--kill-on-bad-exit=1",
    ]
    assert torchrun == [
        "torchrun",
        "--nnodes=$SLURM_NNODES",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=$head_node:$rdzv_port",
        "--rdzv-id=$SLURM_JOB_ID",
        "-m",
        "minigpt_cli",
        "train",
        str(GPU_CONFIG),
        *sets,
    ]
    # Printed, the same text (the time and partition left out: none in the header).
    printed = cli("launch", "slurm", GPU_CONFIG, "--nodes", "1", "--gpus-per-node", "2")
    assert printed.exit_code == 0, printed
    options = sbatch_options(printed.stdout)
    assert options["nodes"] == "1" and options["gpus-per-node"] == "2"
    assert not {"time", "signal", "partition"} & set(options)
    assert "--nproc-per-node=2" in command(printed.stdout, "srun")


def test_cpu_form_trains_p_processes_per_node_on_gloo(cli, tmp_path):
    res = cli(
        "launch", "slurm", GPU_CONFIG, "--nodes", "2", "--gpus-per-node", "0",
        "--procs-per-node", "3", "--cpus-per-node", "12", "--port", "29400", "--time", "5",
    )  # fmt: skip
    assert res.exit_code == 0, res
    text = res.stdout
    options = sbatch_options(text)
    assert "gpus-per-node" not in options and options["cpus-per-task"] == "12"
    assert options["time"] == "5" and "signal" not in options  # 5 minutes: the limit's own TERM
    # device: auto would take a node's GPU if it had one; the CPU form says cpu (gloo).
    assert command(text, "minigpt prepare")[-2:] == ["--set", "device=cpu"]
    torchrun = command(text, "srun")
    assert "--nproc-per-node=3" in torchrun and torchrun[-2:] == ["--set", "device=cpu"]
    assert "rdzv_port=29400" in script_lines(text)
    threads = next(line for line in script_lines(text) if line.startswith("export OMP"))
    assert "SLURM_CPUS_PER_TASK / 3" in threads
    # The threads a process gets, as bash computes them from Slurm's variable.
    for cpus, want in (("12", "4"), ("2", "1")):
        got = subprocess.run(
            ["bash", "-c", f"SLURM_CPUS_PER_TASK={cpus}; {threads}; echo $OMP_NUM_THREADS"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert got.stdout.strip() == want
    # One process a node by default; a config on the CPU already is left as it is.
    one = cli("launch", "slurm", TINY, "--nodes", "1", "--gpus-per-node", "0", "--resume", "auto")
    assert one.exit_code == 0, one
    torchrun = command(one.stdout, "srun")
    assert "--nproc-per-node=1" in torchrun and "device=cpu" not in torchrun
    assert torchrun[-2:] == ["--resume", "auto"]  # to train, not to prepare
    assert "--resume" not in command(one.stdout, "minigpt prepare")


def test_script_parses_and_torchrun_knows_its_options(cli):
    text = cli("launch", "slurm", GPU_CONFIG, "--nodes", "2", "--gpus-per-node", "4").stdout
    parsed = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    flags = torchrun_flags(shlex.join(command(text, "srun")))
    assert flags == [
        "--nnodes",
        "--nproc-per-node",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id",
        "-m",
    ]
    assert set(flags) <= torchrun_options(), set(flags) - torchrun_options()


def test_max_restarts_reach_torchrun_and_several_nodes_get_their_own_stores(cli):
    """--max-restarts K: torchrun restarts the group after a lost worker (the run resumes its
    folder: test_distributed's kill test); over several nodes each torchrun keeps its own
    rendezvous store (pytorch#135712), on one node nothing needs setting."""
    args = ["launch", "slurm", GPU_CONFIG, "--gpus-per-node", "4", "--max-restarts", "2"]
    two = cli(*args, "--nodes", "2").stdout
    srun = command(two, "srun")
    assert "--max-restarts=2" in srun and srun.index("--max-restarts=2") < srun.index("-m")
    assert "--max-restarts" in torchrun_options()
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in script_lines(two)
    one = cli(*args, "--nodes", "1").stdout
    assert "--max-restarts=2" in command(one, "srun")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in one
    plain = cli("launch", "slurm", GPU_CONFIG, "--gpus-per-node", "4", "--nodes", "2").stdout
    assert "--max-restarts" not in plain and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plain


def test_output_is_replaced_only_when_this_command_wrote_it(cli, tmp_path):
    out = tmp_path / "job.sbatch"
    args = ["launch", "slurm", TINY, "--nodes", "1", "--gpus-per-node", "0", "--output", out]
    assert cli(*args).exit_code == 0
    assert cli(*args, "--time", "30").exit_code == 0  # ours: written again
    assert sbatch_options(out.read_text())["time"] == "30"
    mine = tmp_path / "mine.sbatch"
    mine.write_text("#!/bin/bash\necho my own job\n")
    res = cli(*args[:-1], mine)
    assert_user_error(res, f"--output {mine} exists and is not a script minigpt launch")
    assert mine.read_text() == "#!/bin/bash\necho my own job\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch", "mine.sbatch"]


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (["--nodes", "0"], ["--nodes 0", "greater than or equal to 1"]),
        (["--gpus-per-node", "-1"], ["--gpus-per-node -1"]),
        (["--gpus-per-node", "2", "--procs-per-node", "3"], ["one process per GPU"]),
        (["--procs-per-node", "4", "--cpus-per-node", "2"], ["--cpus-per-node 2 is fewer"]),
        (["--time", "1:30:75"], ["75 seconds is past 59", "HH:MM:SS"]),
        (["--time", "2-24"], ["24 hours is past 23"]),
        (["--time", "four hours"], ["is not a Slurm time limit", "D-HH:MM:SS"]),
        (["--time", "0:00"], ["no time at all"]),
        (["--partition", "gpu; rm -rf ~"], ["is not a partition name", "sinfo"]),
        (["--port", "80"], ["--port 80", "1024 to 65535"]),
        (["--max-restarts", "-1"], ["--max-restarts -1", "0 (none) or more"]),
        (["--set", "train.max_itres=5"], ["train.max_itres", "unknown key"]),
        (["--set", "dtype=float16"], ["float16"]),  # the CPU form cannot train in it
        (["--resume", "runs/nothing-here"], ["--resume runs/nothing-here: no such run folder"]),
    ],
)
def test_refusals_are_one_line_and_write_nothing(cli, tmp_path, monkeypatch, extra, fragments):
    monkeypatch.chdir(tmp_path)
    base = {"--nodes": "1", "--gpus-per-node": "0"}
    # The case's own value replaces the default one.
    args = [w for pair in base.items() if pair[0] not in extra for w in pair] + extra
    res = cli("launch", "slurm", GPU_CONFIG, *args, "--output", "job.sbatch")
    assert_user_error(res, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_config_must_exist_and_suit_the_devices_asked_for(cli, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert_user_error(
        cli("launch", "slurm", missing, "--nodes", "1", "--gpus-per-node", "0"), "not found"
    )
    # tiny.yaml says device: cpu, so GPUs would sit idle; a CUDA config with no GPU cannot start.
    res = cli("launch", "slurm", TINY, "--nodes", "2", "--gpus-per-node", "8")
    assert_user_error(res, "trains on device cpu", "--gpus-per-node 0 --procs-per-node P")
    no_gpu = ["launch", "slurm", GPU_CONFIG, "--nodes", "1", "--gpus-per-node", "0"]
    res = cli(*no_gpu)
    assert res.exit_code == 0, res
    res = cli(*no_gpu, "--set", "device=cuda")
    assert_user_error(res, "trains on device cuda", "--gpus-per-node 0 asks for no GPU")


def _fences(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", page.read_text(), flags=re.M | re.S)


def test_the_manual_shows_the_script_the_command_writes(cli, tmp_path, monkeypatch):
    """docs/cluster.md's script is what its command prints (made in /home/you/minigpt), and its
    SkyPilot task is YAML whose torchrun options torchrun knows."""
    import yaml

    page = REPO / "docs" / "cluster.md"
    shown = next(block for block in _fences(page, "bash") if block.startswith("#!/bin/bash"))
    argv = shlex.split(shown.splitlines()[1].removeprefix("# Made by: "))
    monkeypatch.chdir(tmp_path)
    res = cli(*argv[1:])  # minigpt's own arguments
    assert res.exit_code == 0, res
    assert res.stdout.replace(str(tmp_path), "/home/you/minigpt") == shown
    (task,) = _fences(page, "yaml")[-1:]
    run = re.sub(r"\\\n\s*", " ", yaml.safe_load(task)["run"])  # continuations joined
    line = next(line for line in run.splitlines() if line.strip().startswith("torchrun"))
    flags = torchrun_flags(line)
    assert "--node-rank" in flags and set(flags) <= torchrun_options(), flags


def test_a_folder_with_spaces_is_quoted_and_one_with_a_quote_refused(cli, tmp_path, monkeypatch):
    spaced = tmp_path / "my runs"
    spaced.mkdir()
    monkeypatch.chdir(spaced)
    res = cli("launch", "slurm", TINY, "--nodes", "1", "--gpus-per-node", "0")
    assert res.exit_code == 0, res
    assert f'#SBATCH --chdir="{spaced}"\n' in res.stdout  # sbatch reads it whole
    quoted = tmp_path / 'say "hi"'
    quoted.mkdir()
    monkeypatch.chdir(quoted)
    res = cli("launch", "slurm", TINY, "--nodes", "1", "--gpus-per-node", "0", "-o", "x.sbatch")
    assert_user_error(res, "holds a quote or a line break", "run minigpt launch from a folder")
    assert list(quoted.iterdir()) == []
