"""Checkpoints: the save policy (Checkpointer), kills mid-write, damaged files, and what a
checkpoint holds."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY, assert_user_error, cli_process, record_checksums, tiny
from safetensors.torch import load_file

from minigpt_cli.config.schema import load_config
from minigpt_cli.errors import MinigptError
from minigpt_cli.model.gpt import GPT
from minigpt_cli.run import checkpoint
from minigpt_cli.run import folder as runs
from minigpt_cli.run.checkpoint import Checkpointer
from minigpt_cli.trainer import train


@pytest.fixture
def policy(tmp_path):
    """A Checkpointer over a tiny model whose snapshot says which step it is at."""
    cfg = load_config(TINY, ["model.vocab_size=65", "train.keep_every=4"])
    model = GPT(cfg.model)
    step = {"n": 0}

    def snapshot():
        return model, {"step": step["n"]}, {"name": cfg.name, "step": step["n"]}

    return Checkpointer(tmp_path, cfg, snapshot), step


def saved(run_dir: Path) -> dict[str, int]:
    """Each checkpoint folder of the run and the step its meta.json names."""
    root = run_dir / runs.CHECKPOINTS
    return (
        {d.name: runs.read_meta(d)["step"] for d in sorted(root.iterdir())} if root.is_dir() else {}
    )


def test_an_eval_saves_best_only_when_it_improves_and_last_always(policy, tmp_path):
    ckpt, step = policy
    step["n"] = 0
    ckpt.after_eval(improved=True)
    assert saved(tmp_path) == {"best": 0, "last": 0}
    step["n"] = 2
    ckpt.after_eval(improved=False)
    assert saved(tmp_path) == {"best": 0, "last": 2}
    assert ckpt.last_step() == 2


def test_kept_checkpoints_every_keep_every_steps(policy, tmp_path):
    ckpt, step = policy
    for n in range(1, 10):
        step["n"] = n
        ckpt.after_step(n)
    assert saved(tmp_path) == {"step-0000004": 4, "step-0000008": 8}
    step["n"] = 9
    ckpt.on_stop()
    assert saved(tmp_path)["last"] == 9


def test_a_process_that_does_not_write_saves_nothing(policy, tmp_path):
    ckpt, _ = policy
    ckpt.enabled = False
    ckpt.after_eval(improved=True)
    ckpt.after_step(4)
    ckpt.on_stop()
    assert saved(tmp_path) == {} and ckpt.last_step() is None


def test_a_saved_checkpoint_rebuilds_the_model_alone(tmp_path):
    cfg = load_config(TINY, ["model.vocab_size=65"])
    torch.manual_seed(0)
    model = GPT(cfg.model)
    checkpoint.save(runs.checkpoint_dir(tmp_path, runs.LAST), model, cfg, {"step": 3}, {"step": 3})
    loaded, loaded_cfg = checkpoint.load_model(runs.checkpoint_dir(tmp_path, runs.LAST))
    assert loaded_cfg.model == cfg.model
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert checkpoint.load_trainer_state(runs.checkpoint_dir(tmp_path, runs.LAST)) == {"step": 3}
    meta = json.loads((runs.checkpoint_dir(tmp_path, runs.LAST) / runs.META).read_text())
    digest = meta.pop("meta_sha256")  # of the other fields, as canonical JSON (sorted keys)
    assert digest == hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
    sums = meta.pop("sha256")
    assert meta == {"step": 3}
    assert sums == {
        name: hashlib.sha256(
            (runs.checkpoint_dir(tmp_path, runs.LAST) / name).read_bytes()
        ).hexdigest()
        for name in (runs.WEIGHTS, runs.STATE, runs.CONFIG)
    }


def test_kills_during_checkpoint_writes_keep_the_previous_one(data_dir, tmp_path, monkeypatch):
    """SIGKILL inside the 2nd write of checkpoints/last, as its weights are written: the 1st stays
    loadable. The resume is SIGKILLed inside its 1st swap, while ``.last.old`` is the only
    complete copy: that copy survives, and the run resumes from it to the end."""
    sets = [
        f"data.data_dir={data_dir}",
        "train.max_iters=20",
        "train.eval_interval=10",
        "train.sample_tokens=0",
    ]
    args = [TINY, "--no-progress", *[w for s in sets for w in ("--set", s)]]
    kill_at = "MINIGPT_TEST_KILL_DURING_SAVE"
    killed = cli_process(
        ["train", *args, "--run-name", "k"], {kill_at: "last:2:weights"}, cwd=tmp_path
    )
    assert killed.returncode == -signal.SIGKILL
    last = tmp_path / "runs" / "k" / "checkpoints" / "last"
    survivor = runs.resolve(last)
    assert json.loads((survivor / "meta.json").read_text())["step"] == 0
    model, _ = checkpoint.load_model(last)
    assert model.wte.weight.isfinite().all()
    assert list(last.parent.glob(".last.tmp-*"))  # the killed save's temporary folder
    again = cli_process(
        ["train", *args, "--resume", "runs/k"], {kill_at: "last:1:swap"}, cwd=tmp_path
    )
    assert again.returncode == -signal.SIGKILL
    assert runs.read_meta(last)["step"] == 0
    monkeypatch.chdir(tmp_path)
    resumed = train(load_config(TINY, sets), resume="runs/k", echo=lambda m: None, progress=False)
    assert resumed.step == 20 and json.loads((last / "meta.json").read_text())["step"] == 20
    assert not list(last.parent.glob(".*.tmp-*"))  # swept on resume


def test_truncated_weights_are_refused(data_dir, tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=5"), run_name="t", echo=lambda m: None, progress=False)
    w = tmp_path / "runs" / "t" / "checkpoints" / "last" / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(MinigptError, match="model.safetensors.*corrupt or truncated"):
        checkpoint.load_model(w.parent)
    res = cli(
        "train", TINY, "--resume", "runs/t", "--set", f"data.data_dir={data_dir}", "--no-progress"
    )
    assert_user_error(res, "model.safetensors", "corrupt")
    # Every command that loads a checkpoint is told the option it takes, not another command's.
    for command in (
        ["evaluate", "--run", "runs/t"],
        ["export", "runs/t", "--output", "hf"],
        ["generate", "--run", "runs/t", "--max-new-tokens", "1"],
    ):
        res = cli(*command, "--checkpoint", "last")
        assert_user_error(
            res, "corrupt or truncated", "use the other checkpoint (--checkpoint best)"
        )
        assert "generate --checkpoint" not in res.stderr, res


@pytest.mark.parametrize(
    "change,problem",
    [
        (lambda s: {"x": 1}, "no 'step' entry"),
        (lambda s: [s], "it holds a value of type list, not a dict"),
        (lambda s: {**s, "evaluated": "yes"}, "'evaluated' is of type str"),
        (lambda s: {**s, "rng": {**s["rng"], "torch": 3}}, "'rng.torch' is of type int"),
        (lambda s: {**s, "data_rng": {}}, "no 'data_rng.train' entry"),
    ],
)
def test_a_trainer_state_of_the_wrong_shape_is_refused_in_one_line(
    data_dir, tmp_path, monkeypatch, cli, change, problem
):
    """A well-formed pickle that is not a trainer state: the entry a resume would miss is named, as
    a truncated file is, instead of a KeyError deep in the resume."""
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=2"), run_name="s", echo=lambda m: None, progress=False)
    state = tmp_path / "runs" / "s" / "checkpoints" / "last" / "trainer_state.pt"
    torch.save(change(torch.load(state, weights_only=True)), state)
    record_checksums(state.parent)  # a file of the wrong shape, not a damaged one
    sets = ["--set", f"data.data_dir={data_dir}", "--set", "train.max_iters=8"]
    for extra in ([], ["--dry-run"]):
        res = cli("train", TINY, "--resume", "runs/s", *sets, *extra, "--no-progress")
        assert_user_error(
            res, "trainer_state.pt", "is not a minigpt trainer state", problem, "start a new run"
        )


def test_a_pickle_that_runs_code_is_refused_and_not_run(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=5"), run_name="p", echo=lambda m: None, progress=False)
    marker = tmp_path / "pwned"
    _Evil.marker = marker
    state = tmp_path / "runs" / "p" / "checkpoints" / "last" / "trainer_state.pt"
    torch.save({"step": 1, "payload": _Evil()}, state)
    record_checksums(
        state.parent
    )  # a pickle planted with its checksum: weights_only must still refuse it
    with pytest.raises(MinigptError, match="trainer_state.pt.*unsafe"):
        checkpoint.load_trainer_state(state.parent)
    assert not marker.exists()
    with pytest.raises(MinigptError, match="trainer_state.pt"):
        train(
            tiny(data_dir, "train.max_iters=5"),
            echo=lambda m: None,
            progress=False,
            resume="runs/p",
        )
    assert not marker.exists()
    assert pickle  # the module the attack would use


def test_loading_tolerates_a_compile_or_ddp_prefix(data_dir, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    train(tiny(data_dir, "train.max_iters=3"), run_name="p", echo=lambda m: None, progress=False)
    w = tmp_path / "runs" / "p" / "checkpoints" / "last" / "model.safetensors"
    sd = load_file(w)
    for prefix in ("_orig_mod.", "module.", "module._orig_mod."):  # compiled, DDP-wrapped, both
        save_file({f"{prefix}{k}": v for k, v in sd.items()}, str(w))
        record_checksums(w.parent)
        model, _ = checkpoint.load_model(w.parent)
        assert torch.equal(model.wte.weight, sd["wte.weight"])


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_reads_of_a_run_that_saves_at_every_step_never_fail(tmp_path, data_dir):
    """A reader never meets a half-swapped checkpoint (issue 40): loads, as generate and evaluate
    make them, of a run whose trainer (a process of its own) saves ``last`` at every step, until
    they have met 12 of its saves (and made 40 loads at least)."""
    from minigpt_cli.sample.load import load_run

    sets = [
        f"data.data_dir={data_dir}",
        "train.max_iters=1000000",
        "train.eval_interval=1",  # an eval, so a save of last (and of best when better), every step
        "train.eval_iters=1",
        "train.log_interval=1000",
        "train.sample_tokens=0",
    ]
    writer = subprocess.Popen(
        [sys.executable, "-m", "minigpt_cli", "train", str(TINY), "--run-name", "busy"]
        + [w for s in sets for w in ("--set", s)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = tmp_path / "runs" / "busy"
    try:
        # The events: the trainer's line "training ..." comes before its first step; then its first
        # save.
        said = iter(writer.stderr.readline, "")
        assert any(line.startswith("training") for line in said), writer.wait()
        drain = threading.Thread(target=lambda: all(said), daemon=True)  # keeps the pipe drained
        drain.start()
        failures, steps = [], set()
        while not (run / "checkpoints" / "last" / "meta.json").exists():
            assert writer.poll() is None
            time.sleep(0.05)
        i = 0
        while i < 40 or len(steps) < 12:  # the saves the reads met: events, not a count of reads
            assert writer.poll() is None  # it saves all along
            try:
                loaded = load_run(run, "last" if i % 2 else "best")
                steps.add(runs.read_meta(loaded.checkpoint)["step"])
            except MinigptError as exc:
                failures.append(str(exc))
            i += 1
    finally:
        writer.send_signal(signal.SIGTERM)
        writer.wait()
    drain.join()  # the pipe's end: its one reader is done before the pipe is closed
    writer.stderr.close()
    assert failures == [], failures


def test_a_run_in_training_without_a_checkpoint_yet_is_not_told_to_train_first(tmp_path):
    run = tmp_path / "runs" / "busy"
    run.mkdir(parents=True)
    with pytest.raises(MinigptError, match="train first"):
        runs.open_checkpoint(run, "last")
    (run / ".lock").write_text("4242\n")
    with open(run / ".lock") as held:  # another open file description: as the trainer's own lock
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(MinigptError) as e:
            runs.open_checkpoint(run, "last")
    assert "the run is training (pid 4242) and has not saved one" in str(e.value)
    assert "train first" not in str(e.value) and "wait for its first save" in str(e.value)
