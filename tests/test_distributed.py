"""Training over several processes and machines, on the CPU with gloo: torchrun across two "nodes"
(DDP), FSDP2 over two processes, and resuming a run in the other mode. Each run is held against one
process on the same global batch (8 sequences), which it must match to float32 rounding.

The runs share one schedule (``train.lr_decay_iters=30``), so a run stopped and resumed makes the
same updates as the uninterrupted one, and clip their gradients (the norm is global under FSDP).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers import TINY, assert_user_error, curve, records, tiny, working_dir
from safetensors.torch import load_file

from minigpt_cli.errors import MinigptError
from minigpt_cli.run import claim as claims
from minigpt_cli.run import folder as runs
from minigpt_cli.trainer import train

TOL = 1e-5
#: Shared by every run: one schedule, and a clipping threshold below the gradient norm, so that
#: clipping acts.
COMMON = [
    "train.lr_decay_iters=30",
    "train.grad_clip=0.1",
    "train.eval_interval=10",
    "train.log_interval=1",
    "train.sample_tokens=0",
]


def sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    """A torchrun (``python -m torch.distributed.run ARGS``) in the background, one thread per
    process."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> str:
    """Wait for a started torchrun; its stdout. Fails with the end of its stderr when it did not
    exit 0."""
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun stops its workers (SIGTERM, SIGKILL after its grace period), then exits
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"torchrun did not finish in 300 s (a hung collective?): {err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    return out


def train_args(data_dir: Path, run: list[str], *overrides: str) -> list[str]:
    """``minigpt train`` tiny.yaml at batch 4 a process, with ``run`` (``--run-name X`` or
    ``--resume X``)."""
    return [
        "-m",
        "minigpt_cli",
        "train",
        str(TINY),
        "--no-progress",
        *run,
        *sets(f"data.data_dir={data_dir}", "train.batch_size=4", *COMMON, *overrides),
    ]


def assert_matches(run: Path, reference: Path, tol: float = TOL) -> None:
    """Every train loss of ``run`` (and val loss at the reference's evals) within ``tol`` of the
    reference's."""
    a, b = curve(run), curve(reference)
    assert {k for k in a if k[0] == "train"} <= b.keys() and a, sorted(a.keys() - b.keys())
    worst = max(a.keys() & b.keys(), key=lambda k: abs(a[k] - b[k]))
    assert abs(a[worst] - b[worst]) <= tol, (worst, a[worst], b[worst])


def last_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "last" / "model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """One process, batch 8, 30 steps; with ``train.parallelism: fsdp`` and no torchrun, which must
    say it changes nothing and train as a plain run (the DDP and FSDP runs below are held against
    it)."""
    work = tmp_path_factory.mktemp("reference")
    said: list[str] = []
    with working_dir(work):
        train(
            tiny(data_dir, *COMMON, "train.max_iters=30", "train.parallelism=fsdp"),
            run_name="one",
            echo=said.append,
            progress=False,
        )
    notes = [m for m in said if "parallelism: fsdp" in m]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "one process" in notes[0], said
    return work / "runs" / "one"


def test_two_nodes_then_fsdp_then_one_process_train_as_one_process_does(
    reference, data_dir, tmp_path, monkeypatch, cli
):
    """One run in three sessions, each held against the uninterrupted one-process run (losses to
    1e-5):

    steps 0-10 with DDP on two one-process torchrun "nodes" meeting at a c10d rendezvous on
    127.0.0.1; resumed for steps 11-25 with FSDP over 2 processes (a DDP checkpoint loaded into
    shards, shards gathered into the one-process layout, every rank in the eval sample); then
    generate reads it, and it is resumed in one process (batch 8) for steps 26-30, ending with the
    reference's weights (to 1e-5).
    """
    port = free_port()
    # The same command twice, as on two machines (c10d numbers the nodes itself: no --node_rank).
    node = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        "minigpt-test",
        "--local_addr",
        "127.0.0.1",
        *train_args(data_dir, ["--run-name", "r"], "train.max_iters=10"),
    ]
    nodes = [start(node, tmp_path) for _ in range(2)]
    outs = [finish(p) for p in nodes]
    assert (
        sum(o.count("trained to step 10") for o in outs) == 1
    )  # rank 0 alone reports, on either node
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["r"]  # one folder for both nodes
    run = tmp_path / "runs" / "r"
    assert "world 2" in (run / "train.log").read_text()
    assert (
        len(curve(run)) == 12 and max(k[1] for k in curve(run)) == 10
    )  # 10 train losses, evals at 0 and 10
    assert_matches(run, reference)
    # At step 0 the weights are identical: the eval reads the same windows, split over the
    # processes.
    assert abs(curve(run)["eval", 0] - curve(reference)["eval", 0]) < 1e-6

    out = finish(
        start(
            [
                "--standalone",
                "--nproc_per_node",
                "2",
                *train_args(
                    data_dir,
                    ["--resume", "runs/r"],
                    "train.max_iters=25",
                    "train.parallelism=fsdp",
                    "train.sample_tokens=4",
                ),
            ],
            tmp_path,
        )
    )
    assert out.count("trained to step 25") == 1
    assert (
        "FSDP: weights, gradients and AdamW moments sharded over 2 processes"
        in (run / "train.log").read_text()
    )
    assert (
        len(curve(run)) == 29 and max(k[1] for k in curve(run)) == 25
    )  # evals at 0, 10, 20 and 25
    assert_matches(run, reference)
    assert (run / "samples.txt").read_text().count(
        "====="
    ) == 4  # samples at steps 20 and 25 (headers)
    # The FSDP checkpoint has the one-process layout: the same tensors, the optimizer state by
    # index.
    ref_w, got_w = last_weights(reference), last_weights(run)
    assert {k: v.shape for k, v in got_w.items()} == {k: v.shape for k, v in ref_w.items()}
    ref_o = torch.load(reference / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)[
        "optimizer"
    ]
    got_o = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)[
        "optimizer"
    ]
    assert [g["params"] for g in got_o["param_groups"]] == [
        g["params"] for g in ref_o["param_groups"]
    ]
    assert {i: {k: tuple(v.shape) for k, v in s.items()} for i, s in got_o["state"].items()} == {
        i: {k: tuple(v.shape) for k, v in s.items()} for i, s in ref_o["state"].items()
    }

    monkeypatch.chdir(tmp_path)
    text = cli(
        "generate",
        "--run",
        "runs/r",
        "--checkpoint",
        "last",
        "--max-new-tokens",
        "20",
        "--prompt",
        "ROMEO:",
    )
    assert text.exit_code == 0 and text.stdout.startswith("ROMEO:") and len(text.stdout) > 20, text
    one = cli(
        "train",
        TINY,
        "--no-progress",
        "--resume",
        "runs/r",
        *sets(f"data.data_dir={data_dir}", "train.batch_size=8", *COMMON, "train.max_iters=30"),
    )
    assert one.exit_code == 0, one
    assert curve(run).keys() == curve(reference).keys() | {
        ("eval", 25)
    }  # the FSDP session's last eval kept
    assert_matches(run, reference)
    got_w = last_weights(run)
    for k in ref_w:
        assert torch.allclose(got_w[k], ref_w[k], atol=TOL, rtol=0), k


@pytest.fixture
def one_process_group():
    """A gloo process group of one process, in this process (FSDP2 needs one), destroyed
    afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp_state_is_saved_and_loaded_in_the_one_process_layout(one_process_group):
    """FSDP2 on a one-process mesh, with the oneDNN linear layers (where this CPU has them): before
    the first step the gathered optimizer state is empty (gathering must not count a zero step in
    AdamW's bias correction); a no-grad forward's gathered root goes back to shards; after a step
    the gathered weights and optimizer state equal an unsharded twin's; and a sharded model loaded
    from the twin's saved state takes the same next step."""
    from torch.distributed.tensor import DTensor

    from minigpt_cli.config.schema import ModelConfig, TrainConfig
    from minigpt_cli.model.gpt import GPT
    from minigpt_cli.runtime import distributed as parallel
    from minigpt_cli.runtime.kernels import onednn
    from minigpt_cli.trainer import make_optimizer

    # n_embd 192: the MLP's weights (192 x 768) are big enough for oneDNN; the head is tied (stored
    # once).
    mc = ModelConfig(n_layer=1, n_head=2, n_embd=192, block_size=8, vocab_size=11)
    tc = TrainConfig()
    cpu = torch.device("cpu")

    def pair():
        torch.manual_seed(0)
        plain = onednn.swap_linears(GPT(mc), enabled=onednn.available())
        torch.manual_seed(0)
        sharded = parallel.shard(onednn.swap_linears(GPT(mc), enabled=onednn.available()), cpu, 1)
        return (plain, make_optimizer(plain, tc)), (sharded, make_optimizer(sharded, tc))

    def step(model, opt, seed):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randint(0, 11, (2, 8), generator=g), torch.randint(0, 11, (2, 8), generator=g)
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    (plain, p_opt), (sharded, s_opt) = pair()
    assert parallel.is_sharded(sharded) and not parallel.is_sharded(plain)
    if onednn.available():
        assert "oneDNN" in onednn.linear_kernel(sharded, 16, cpu, torch.float32)
    weights, opt_state = parallel.gather_state(sharded, s_opt)
    assert (
        opt_state == {"state": {}, "param_groups": p_opt.state_dict()["param_groups"]}
        and not s_opt.state
    )
    assert "lm_head.weight" not in weights
    with torch.no_grad():
        sharded(torch.zeros(1, 8, dtype=torch.long))
    assert not all(
        isinstance(p, DTensor) for p in sharded.parameters()
    )  # the root kept its gathered weights
    parallel.reshard(sharded)
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    for model, opt in ((plain, p_opt), (sharded, s_opt)):
        step(model, opt, 1)
    weights, opt_state = parallel.gather_state(sharded, s_opt)
    want = p_opt.state_dict()
    assert (
        opt_state["param_groups"] == want["param_groups"]
        and opt_state["state"].keys() == want["state"].keys()
    )
    for i, s in want["state"].items():
        for k, v in s.items():
            assert torch.allclose(opt_state["state"][i][k], v, rtol=1e-5, atol=1e-9), (i, k)
    for k, v in plain.state_dict().items():
        if k != "lm_head.weight":
            assert torch.allclose(weights[k], v, atol=1e-7), k

    (_, _), (fresh, f_opt) = pair()
    saved = (
        io.BytesIO()
    )  # the twin's state as a checkpoint holds it (and no tensor shared with the twin)
    torch.save(
        {
            "weights": {k: v for k, v in plain.state_dict().items() if k != "lm_head.weight"},
            "optimizer": p_opt.state_dict(),
        },
        saved,
    )
    saved.seek(0)
    saved = torch.load(saved, weights_only=True)
    parallel.load_model_state(fresh, saved["weights"])
    parallel.load_optimizer_state(fresh, f_opt, saved["optimizer"])
    for model, opt in ((plain, p_opt), (fresh, f_opt)):
        step(model, opt, 2)
    weights, _ = parallel.gather_state(fresh, f_opt)
    for k, v in plain.state_dict().items():
        if k != "lm_head.weight":
            assert torch.allclose(weights[k], v, atol=1e-6), k


#: A torchrun worker that runs ``minigpt``, counts the collectives that pickle objects on the host,
#: and whose torch.compile works on rank 0 (Dynamo with the "eager" backend) and fails on rank 1.
WORKER = """
import atexit, json, os, runpy
import torch
import torch.distributed as dist

calls = {"broadcast_object_list": 0, "all_gather_object": 0, "all_reduce": 0}
for name in calls:
    real = getattr(dist, name)
    def counted(*a, _name=name, _real=real, **k):
        calls[_name] += 1
        return _real(*a, **k)
    setattr(dist, name, counted)
atexit.register(lambda: open(f"calls-{os.environ['RANK']}.json", "w").write(json.dumps(calls)))

real_compile = torch.compile

def no_compiler(graph, example_inputs):
    raise RuntimeError("no C++ compiler on rank 1")

backend = no_compiler if os.environ["RANK"] == "1" else "eager"
torch.compile = lambda model, **k: real_compile(model, backend=backend)
runpy.run_module("minigpt_cli", run_name="__main__")
"""


def test_the_ranks_take_one_compile_decision_broadcast_no_object_and_train_muon_as_one(
    data_dir, tmp_path
):
    """2 processes on gloo, 30 steps of ``train.optimizer: muon`` with 4 evals of 5 batches a split
    and a time budget, compile on; compiling fails on rank 1 only, in the warm-up at build.

    - The ranks agree by an all-reduce and both train eagerly (before, the failing rank alone
      rebuilt DDP at its first step, whose constructor's broadcast the other rank never joined);
      rank 0's log says why.
    - The ranks agree on a stop and the time budget by a tensor all-reduce once per log interval
      (10 steps), never by an object broadcast per step or per eval batch; the run folder's name
      is the only object broadcast.
    - Muon under DDP: every rank orthogonalises the same all-reduced gradient, so the run follows
      one process on batch 8 (the gradients differ by float32 rounding, which Muon's bfloat16
      iteration, on a CPU with bfloat16 units, rounds apart: 5.8e-5 by step 30 where the products
      were bfloat16, emulated on a Zen 3, and 2.4e-7 in float32; 3e-4 here), and its momentum is
      saved.

    One launch for all three: a torchrun's processes take some 10 s to start and train here."""
    muon = ("train.optimizer=muon", "train.max_iters=30")
    with working_dir(tmp_path):
        train(tiny(data_dir, *COMMON, *muon), run_name="one", echo=lambda m: None, progress=False)
    (tmp_path / "worker.py").write_text(WORKER)
    args = train_args(
        data_dir,
        ["--run-name", "ddp"],
        *muon,
        "train.max_seconds=3600",
        "compile=true",
        "train.log_interval=10",
    )
    out = finish(start(["--standalone", "--nproc_per_node", "2", "worker.py", *args[2:]], tmp_path))
    assert out.count("trained to step 30") == 1
    run = tmp_path / "runs" / "ddp"
    log = (run / "train.log").read_text()
    assert (
        log.count("torch.compile failed (it failed on another process); training without it") == 1
    )
    for rank in (0, 1):
        calls = json.loads((tmp_path / f"calls-{rank}.json").read_text())
        assert calls["broadcast_object_list"] == 1 and calls["all_gather_object"] == 0, calls
        # One a step (the loss sum that decides a skip; DDP's gradient buckets are reduced in C++,
        # not counted here), two an eval (each split's sum), two a log interval (the loss, stop and
        # time), and one for the compile decision.
        assert calls["all_reduce"] == 30 + 2 * 4 + 2 * 3 + 1, calls
    train_steps = {k[1] for k in curve(run) if k[0] == "train"}
    assert train_steps == {10, 20, 30}
    assert_matches(run, tmp_path / "runs" / "one", tol=3e-4)
    state = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)[
        "optimizer"
    ]
    assert any("momentum_buffer" in s for s in state["state"].values())


def test_the_collective_timeout_covers_a_preparation_and_is_checked(cli, tmp_path, monkeypatch):
    """Every collective may wait MINIGPT_DIST_TIMEOUT seconds (30 minutes unset, beyond NCCL's 10,
    as the other processes of a node wait in a barrier while the first prepares the data); a value
    that is not a positive number of seconds is refused in one line, under torchrun's variables,
    before anything is written."""
    from datetime import timedelta

    from minigpt_cli.runtime.distributed import dist_timeout

    monkeypatch.delenv("MINIGPT_DIST_TIMEOUT", raising=False)
    assert dist_timeout() == timedelta(minutes=30)
    monkeypatch.setenv("MINIGPT_DIST_TIMEOUT", "7200")
    assert dist_timeout() == timedelta(hours=2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINIGPT_DIST_TIMEOUT", "ten minutes")
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    assert_user_error(cli("train", TINY), "MINIGPT_DIST_TIMEOUT='ten minutes'", "above 0")
    assert not (tmp_path / "runs").exists()


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Wait until ``path`` exists, while ``proc`` runs (a deadline that holds at 10x slowness)."""
    deadline = time.monotonic() + 300
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(
                f"torchrun ended before {path} was written: {proc.communicate()[1][-3000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path} was not written in 300 s")
        time.sleep(0.01)


def test_a_worker_killed_mid_run_is_resumed_from_the_last_checkpoint_by_torchrun(
    data_dir, tmp_path
):
    """torchrun --max-restarts 1, 2 processes on gloo, 60 steps with a checkpoint every 10: once
    the second kept checkpoint is written, rank 1 is SIGKILLed. torchrun starts the group again,
    which finds the run folder by the job's run id (not by its --run-name, which the first group
    took), says which folder and step it resumes, and ends the run normally in that one folder.
    The same checkpoint resumed by hand (--resume RUN/checkpoints/step-N, 2 processes) ends with the
    same weights, bit for bit, and the same losses and learning rates at every step."""
    # 40 steps after the kill's cue, 4 evaluations and checkpoints among them (COMMON evaluates,
    # and saves last, every 10): the kill, sent within milliseconds of the cue, lands long before
    # the run could end, however slowly this test is scheduled.
    every = ["train.max_iters=60", "train.keep_every=10"]
    job = ["--standalone", "--nproc_per_node", "2", "--max-restarts", "1"]
    proc = start([*job, *train_args(data_dir, ["--run-name", "r"], *every)], tmp_path)
    run = tmp_path / "runs" / "r"
    # The second kept checkpoint: checkpoints/last (saved by the eval after each) is at 10 or later.
    wait_for(run / "checkpoints" / "step-0000020", proc)
    workers = {int(p.environ()["RANK"]): p for p in psutil.Process(proc.pid).children()}
    assert set(workers) == {0, 1}, "the run ended before a worker could be killed"
    workers[1].send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]

    said = re.findall(
        r"torchrun restart 1 of 1 \(run id [^)]+\): resuming (\S+) from step (\d+)", err
    )
    assert len(said) == 1 and Path(said[0][0]) == Path("runs/r"), err[-3000:]
    step = int(said[0][1])
    assert 10 <= step < 60 and step % 10 == 0, step
    assert out.count("trained to step 60") == 1
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["r"]  # the same folder, no other
    log = (run / "train.log").read_text()
    assert "torchrun restart 1 of 1 (run id " in log and f"resumed from step {step} (" in log

    finish(
        start(
            [
                "--standalone",
                "--nproc_per_node",
                "2",
                *train_args(
                    data_dir,
                    ["--resume", f"runs/r/checkpoints/step-{step:07d}", "--run-name", "hand"],
                    *every,
                ),
            ],
            tmp_path,
        )
    )
    hand = tmp_path / "runs" / "hand"
    got, want = last_weights(run), last_weights(hand)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)

    def losses(r: Path) -> dict:
        return {
            (e["event"], e["step"]): (e.get("loss"), e.get("lr"), e.get("val_loss"))
            for e in records(r)
        }

    assert losses(run) == losses(hand) and max(k[1] for k in losses(run)) == 60


def test_a_restarted_group_trains_from_step_0_in_the_folder_that_saved_nothing(
    data_dir, tmp_path, monkeypatch
):
    """A group torchrun restarts (TORCHELASTIC_RESTART_COUNT 1) whose first group made its run
    folder and was lost before the first checkpoint: the folder marked with the job's run id is
    found (not a folder of another job), emptied but for its lock and mark, and trained in from
    step 0; no other folder is made, and the line before training says so. Without the restart,
    the same folder name is refused as a run that stopped before its first save."""
    monkeypatch.chdir(tmp_path)
    runs_dir = tmp_path / "runs"
    mine, other = runs_dir / "tiny-20260101-000000", runs_dir / "tiny-20260101-000001"
    for folder, job in ((mine, "job-1"), (other, "job-0")):
        folder.mkdir(parents=True)
        (folder / runs.LOCK).write_text("12345\n")  # its owner is gone: the lock is free
        claims.mark_elastic(folder, job)
        # What the lost group wrote before its first save: an eval's event.
        (folder / "metrics.jsonl").write_text('{"step": 0, "event": "eval", "val_loss": 9.0}\n')
    cfg = tiny(data_dir, "train.max_iters=5", "train.eval_interval=5")
    with pytest.raises(MinigptError, match="stopped before its first save"):
        train(cfg, mine.name, echo=lambda line: None, progress=False)

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    said: list[str] = []
    result = train(cfg, echo=said.append, progress=False)
    assert result.run_dir == Path("runs") / mine.name and result.step == 5
    assert sorted(p.name for p in runs_dir.iterdir()) == [mine.name, other.name]
    assert (
        f"torchrun restart 1 of 1 (run id job-1): runs/{mine.name} got no checkpoint before the "
        "failure; training it from step 0 again" in said
    ), said
    assert [(e["event"], e["step"]) for e in records(mine) if e["event"] == "eval"] == [
        ("eval", 0),
        ("eval", 5),
    ]
    assert json.loads((mine / runs.ELASTIC).read_text()) == {"run_id": "job-1"}
    assert (other / "metrics.jsonl").read_text().count("\n") == 1  # another job's: untouched


def test_restarts_over_several_machines_on_the_shared_store_get_a_note(data_dir, monkeypatch):
    """torchrun --max-restarts over 2 machines with its agent's store shared (PyTorch's default):
    the notes before the run say to export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; with it exported
    (the store not shared), on one machine, or without restarts, they do not."""
    from minigpt_cli.trainer.run_notes import config_notes

    cfg = tiny(data_dir)
    said = "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    env = {
        "GROUP_WORLD_SIZE": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert sum(said in note and note.startswith("note: ") for note in config_notes(cfg)) == 1
    for key in env:
        with monkeypatch.context() as m:
            m.setenv(
                key, {"GROUP_WORLD_SIZE": "1", "TORCHELASTIC_MAX_RESTARTS": "0"}.get(key, "False")
            )
            assert not any(said in note for note in config_notes(cfg)), key
