"""The script ``minigpt launch slurm`` writes, run by a real Slurm: Debian's ``slurm-wlm`` on this
one machine (munged, slurmctld and slurmd started here as the test's own processes, with a
generated slurm.conf in a temporary folder; no systemd).

Marked ``slurm``: left out of the suite; .ci/run installs slurm-wlm where it can (apt-get, as root)
and runs these with ``pytest -m slurm``. Skipped, with the reason, where the binaries are missing or
the test is not root (slurmd starts jobs as their user, which needs root).

The jobs wait on events, not clocks: ``sbatch --wait`` returns when the job ends, and the signal
test waits for the run's metrics.jsonl to show a step. Their deadlines (10 minutes) hold at 10x the
slowness of a loaded 2-core machine (a job here takes well under a minute).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TINY

pytestmark = pytest.mark.slurm

DAEMONS = ("mungekey", "munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "scancel", "sinfo")
#: The binaries' folders: root's PATH has /usr/sbin, another user's may not.
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
#: Seconds a job or a daemon may take before the test gives up: 10x what they take here.
DEADLINE_S = 600
#: Runs of tiny.yaml: a train record every step, evals at 0, 3 and 6, no samples.
TINY_SETS = [
    "train.eval_interval=3",
    "train.log_interval=1",
    "train.sample_tokens=0",
    "train.batch_size=4",
]


def _which(name: str) -> str | None:
    return shutil.which(name, path=SEARCH)


def _missing() -> str | None:
    """Why the cluster cannot start here, or None."""
    absent = [name for name in DAEMONS + CLIENTS if _which(name) is None]
    if absent:
        return (
            f"Slurm is not installed ({', '.join(absent)} missing): apt-get install slurm-wlm "
            "(.ci/run does, as root)"
        )
    if os.geteuid() != 0:
        return "slurmd starts a job as its user, which needs root; .ci/run runs as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_name() -> str:
    """The node's name: this machine's short host name where it resolves (the script's rendezvous
    host is the node's name), else localhost."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "localhost"


def _wait_for(what: str, ready, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    """Poll ``ready()`` until true; fail naming ``what`` (and the daemons' logs) if a daemon exits
    or :data:`DEADLINE_S` passes."""
    end = time.monotonic() + DEADLINE_S
    while not ready():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > end:
            tails = "\n".join(
                f"{log.name}: {log.read_text()[-1500:]}" for log in logs if log.exists()
            )
            pytest.fail(f"{what}: {'a daemon exited' if dead else 'deadline passed'}\n{tails}")
        time.sleep(0.2)


class Cluster:
    """A one-node Slurm: munged, slurmctld and slurmd on free ports, all files in ``root``."""

    def __init__(self, root: Path):
        self.root, self.node = root, _node_name()
        self.conf = root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.env = dict(
            os.environ,
            SLURM_CONF=str(self.conf),
            # The job runs the torchrun and minigpt of this Python's environment (sbatch passes
            # the submitting environment on).
            PATH=os.pathsep.join([str(Path(sys.executable).parent), SEARCH]),
        )

    def start(self) -> None:
        root = self.root
        root.chmod(0o755)  # munged wants its socket's folder reachable by all
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        key, sock = root / "munge.key", root / "munge.socket"
        subprocess.run([_which("mungekey"), "--create", "--keyfile", str(key)], check=True)
        key.chmod(0o600)
        logs = [root / "munged.log", root / "slurmctld.log", root / "slurmd.log"]
        self._spawn(
            [
                _which("munged"), "--foreground", "--force", f"--socket={sock}",
                f"--key-file={key}", f"--pid-file={root / 'munged.pid'}",
                f"--seed-file={root / 'munged.seed'}",
            ],
            logs[0],
        )  # fmt: skip
        _wait_for("munged's socket", sock.exists, self.procs, logs)
        cpus = os.cpu_count() or 2
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=minigpt-test",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={sock}",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool'}",
                    f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'slurmd.pid'}",
                    # No cgroups (a container has none to give): processes tracked by /proc.
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], logs[1])
        self._spawn([_which("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)], logs[2])
        _wait_for("the node to be idle", self._idle, self.procs, logs)

    def _spawn(self, argv: list[str], log: Path) -> None:
        with open(log, "wb") as out:
            self.procs.append(
                subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
            )

    def _idle(self) -> bool:
        res = self.run("sinfo", "--noheader", "--format=%t", check=False)
        return res.returncode == 0 and res.stdout.strip() == "idle"

    def run(self, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            [_which(argv[0]), *argv[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=DEADLINE_S,
            **kw,
        )

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, ...)."""
        out = self.run("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(word.split("=", 1) for word in out.split() if "=" in word)

    def stop(self) -> None:
        """Stop the daemons this cluster started (SIGTERM, then SIGKILL), slurmd first."""
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = _missing()
    if why:
        pytest.skip(why)
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def workdir(tmp_path, corpus_file):
    """A folder holding the corpus where tiny.yaml looks for it (no download); a space in its
    name, which the script's #SBATCH --chdir line must carry."""
    folder = tmp_path / "my runs"
    (folder / "data" / "tinyshakespeare").mkdir(parents=True)
    shutil.copy(corpus_file, folder / "data" / "tinyshakespeare" / "input.txt")
    return folder


def launch(cluster: Cluster, workdir: Path, *sets: str, resume: bool = False) -> Path:
    """``minigpt launch slurm`` tiny.yaml for one node of 2 CPU processes (``resume``: with
    ``--resume auto``), written in ``workdir`` (the job's folder), as a user types it."""
    argv = [sys.executable, "-m", "minigpt_cli", "launch", "slurm", str(TINY), "--nodes", "1"]
    argv += ["--resume", "auto"] if resume else []
    argv += ["--gpus-per-node", "0", "--procs-per-node", "2", "--cpus-per-node", "2"]
    # A free port: the job id, from which the port is drawn, starts at 1 on every test cluster.
    argv += ["--port", str(_free_port()), "--output", "job.sbatch"]
    argv += [w for item in (*TINY_SETS, *sets) for w in ("--set", item)]
    subprocess.run(argv, cwd=workdir, env=cluster.env, check=True, capture_output=True)
    return workdir / "job.sbatch"


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def the_run(workdir: Path) -> Path:
    (run,) = (workdir / "runs").iterdir()
    return run


def test_the_script_trains_on_two_processes_under_slurm(cluster, workdir):
    script = launch(cluster, workdir, "train.max_iters=6")
    # An unrelated folder to submit from: the script's --chdir takes the job to its own.
    sub = cluster.run("sbatch", "--wait", "--parsable", str(script), cwd=cluster.root, check=False)
    job_id = sub.stdout.strip().split(";")[0]
    log = workdir / f"tiny-{job_id}.out"
    job_log = log.read_text() if log.exists() else "(no job log)"
    assert sub.returncode == 0, f"{sub.stderr}\n{job_log[-3000:]}"
    job = cluster.job(job_id)
    assert (job["JobState"], job["ExitCode"], job["NumNodes"]) == ("COMPLETED", "0:0", "1"), job
    assert "training 0.03M parameters on cpu x 2 processes" in job_log, job_log[-3000:]

    run = the_run(workdir)
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    assert meta["step"] == 6 and meta["world_size"] == 2
    assert (run / "checkpoints" / "last" / "model.safetensors").stat().st_size > 0
    assert [r["step"] for r in records(run) if r["event"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records(run) if r["event"] == "eval"] == [0, 3, 6]
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 2 and env["cwd"] == str(workdir)
    assert (
        "global batch 8 sequences = batch 4 x accum 1 x world 2" in (run / "train.log").read_text()
    )


def test_a_signal_from_slurm_saves_the_run_and_the_next_job_resumes_it(cluster, workdir):
    """SIGTERM to the job's step, as ``--signal=TERM@120`` sends it before a time limit: torchrun
    passes it to the processes, which save checkpoints/last and stop. The script again, with
    ``--resume auto``, continues that run in its own folder."""
    long = ("train.max_iters=100000", "train.eval_interval=1000")
    script = launch(cluster, workdir, *long, resume=True)
    job_id = cluster.run("sbatch", "--parsable", str(script)).stdout.strip().split(";")[0]
    metrics = workdir / "runs"
    end = time.monotonic() + DEADLINE_S

    def stepped() -> bool:
        files = list(metrics.glob("*/metrics.jsonl"))
        return bool(files) and '"event": "train"' in files[0].read_text()

    while not stepped():
        state = cluster.job(job_id)["JobState"]
        assert state in ("PENDING", "RUNNING") and time.monotonic() < end, state
        time.sleep(0.2)
    cluster.run("scancel", "--signal=TERM", job_id)
    while cluster.job(job_id)["JobState"] in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < end, "the job did not end after SIGTERM"
        time.sleep(0.2)
    run = the_run(workdir)
    log = (workdir / f"tiny-{job_id}.out").read_text()
    assert "stopped by SIGTERM at step" in log, log[-3000:]
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    stopped = max(r["step"] for r in records(run))
    assert 0 < meta["step"] == stopped < 100000 and meta["world_size"] == 2

    script = launch(cluster, workdir, long[1], f"train.max_iters={stopped + 3}", resume=True)
    sub = cluster.run("sbatch", "--wait", "--parsable", str(script), check=False)
    job_id = sub.stdout.strip().split(";")[0]
    log = (workdir / f"tiny-{job_id}.out").read_text()
    assert sub.returncode == 0, log[-3000:]
    assert the_run(workdir) == run  # the same folder, not a new run
    steps = [r["step"] for r in records(run) if r["event"] == "train"]
    assert steps == list(range(1, stopped + 4)), steps
    meta = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())
    assert meta["step"] == stopped + 3 and meta["world_size"] == 2
