"""The Trainer in-process on a tiny model: what the loop asks its components, and what it leaves
behind."""

from __future__ import annotations

import json
import math
import shutil
import signal
import threading
from pathlib import Path

import pytest
import torch
from helpers import TINY, assert_user_error, curve, records, small_peak, tiny
from safetensors.torch import load_file

from minigpt_cli.config.schema import TrainConfig, load_config
from minigpt_cli.errors import MinigptError
from minigpt_cli.model.gpt import GPT
from minigpt_cli.run import checkpoint
from minigpt_cli.run.checkpoint import Checkpointer
from minigpt_cli.trainer import make_optimizer, train, train_step
from minigpt_cli.trainer.evaluate import Evaluator

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


def test_the_loop_asks_the_evaluator_and_the_checkpointer(data_dir, tmp_path, monkeypatch):
    """Evals at 0, every eval_interval and at the end; best on improvement, last after each eval,
    kept steps."""
    monkeypatch.chdir(tmp_path)
    evals, saves = [], []
    real_losses, real_save = Evaluator.losses, Checkpointer.save

    def losses(self, model, step):
        evals.append(step)
        return real_losses(self, model, step)

    def save(self, which):
        saves.append(which)
        return real_save(self, which)

    monkeypatch.setattr(Evaluator, "losses", losses)
    monkeypatch.setattr(Checkpointer, "save", save)
    res = train(
        tiny(data_dir, "train.max_iters=9", "train.eval_interval=4", "train.keep_every=3"),
        "loop",
        echo=lambda m: None,
        progress=False,
    )
    assert res.step == 9 and evals == [0, 4, 8, 9]
    assert saves.count("last") == 4 and saves.count("best") >= 1
    assert [s for s in saves if s.startswith("step-")] == [
        "step-0000003",
        "step-0000006",
        "step-0000009",
    ]
    assert saves[:2] == ["best", "last"]  # step 0's eval is the first best
    log = (res.run_dir / "train.log").read_text()
    assert (
        "to go (from the first eval batches)" in log and "to go (3 steps at" in log
    )  # the time estimate
    assert [
        r["step"]
        for r in map(json.loads, (res.run_dir / "metrics.jsonl").read_text().splitlines())
        if r["event"] == "train"
    ] == list(range(1, 10))


def test_train_leaves_no_global_state_behind(data_dir, tmp_path, monkeypatch):
    """A sweep calls train in-process many times: handlers, threads and flags are as they were, and
    runs repeat."""
    monkeypatch.chdir(tmp_path)
    sigs = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    before = (
        {s: signal.getsignal(s) for s in sigs},
        torch.get_num_threads(),
        torch.backends.cuda.matmul.allow_tf32,
        {t for t in threading.enumerate() if not t.daemon},
        subnormals_kept(),
    )
    results = [
        train(
            tiny(data_dir, "train.max_iters=6", "train.eval_interval=3"),
            f"r{i}",
            echo=lambda m: None,
            progress=False,
        )
        for i in range(2)
    ]
    after = (
        {s: signal.getsignal(s) for s in sigs},
        torch.get_num_threads(),
        torch.backends.cuda.matmul.allow_tf32,
        {t for t in threading.enumerate() if not t.daemon},
        subnormals_kept(),
    )
    assert after == before and before[-1]
    a, b = results
    assert a.run_dir != b.run_dir and a.val_loss == b.val_loss and a.train_loss == b.train_loss
    assert math.isfinite(a.best_val_loss)


def subnormals_kept() -> bool:
    """Whether float32 keeps a subnormal value (1e-40 is below its smallest normal, 1.2e-38)
    rather than flushing it to zero (``torch.set_flush_denormal``)."""
    return torch.tensor([1e-40]).item() != 0.0


def test_training_on_a_cpu_flushes_subnormals_and_stops_after(data_dir, tmp_path, monkeypatch):
    """Subnormal floats slow a trained model's CPU step down by up to 1.8x (BENCHMARKS.md): the
    loop flushes them to zero while it trains, and only then."""
    monkeypatch.chdir(tmp_path)
    seen = []
    train(
        tiny(data_dir, "train.max_iters=4", "train.eval_interval=2"),
        echo=lambda m: None,
        progress=False,
        on_eval=lambda step, val: seen.append(subnormals_kept()),
    )
    assert seen == [False, False, False]  # steps 0, 2 and 4
    assert subnormals_kept()


def test_the_thread_count_is_put_back_after_a_run_that_changed_it(data_dir, tmp_path, monkeypatch):
    """Other processes took a core mid-run (the trainer dropped to 1 thread); afterwards the count
    is restored."""
    from minigpt_cli.runtime import device as runtime

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.chdir(tmp_path)
    suite_threads = torch.get_num_threads()
    torch.set_num_threads(
        2
    )  # the suite runs with 1 (conftest); a run that starts with 2 can drop one
    try:

        def busy_elsewhere(self, force=False):
            torch.set_num_threads(1)  # what poll does when other processes keep the cores busy
            return 1

        monkeypatch.setattr(runtime.CpuThreads, "poll", busy_elsewhere)
        train(
            tiny(data_dir, "train.max_iters=2", "train.eval_interval=2"),
            "t",
            echo=lambda m: None,
            progress=False,
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(suite_threads)


def test_gradient_accumulation_equals_one_big_batch():
    """4 micro-batches of 8 give the same update as one batch of 32 (to 1e-5).

    Plain SGD with lr 1 makes the update the gradient itself (Adam's first step,
    ~lr·sign(g), would magnify rounding noise in near-zero gradients).
    """
    cfg = load_config(TINY).model.model_copy(update={"vocab_size": 65})
    torch.manual_seed(0)
    x = torch.randint(0, 65, (32, 32))
    y = torch.randint(0, 65, (32, 32))
    results = []
    for accum, chunks in (
        (1, [(x, y)]),
        (4, [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]),
    ):
        torch.manual_seed(1)
        model = GPT(cfg)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        params = list(model.parameters())
        loss, skipped = train_step(
            model,
            opt,
            iter(chunks),
            accum,
            torch.autocast("cpu", enabled=False),
            scaler,
            1.0,
            params,
        )
        assert skipped.item() == 0.0
        results.append((loss.item(), [p.detach().clone() for p in model.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
    moved = sum((a - b).abs().sum() for a, b in zip(results[0][1], before))
    assert moved > 1e-3  # the step did change the weights


def test_one_nan_skips_the_step(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(GPT, "forward", _nan_forward({7}))
    res = train(
        tiny(data_dir, "train.max_iters=20"), run_name="n", echo=lambda m: None, progress=False
    )
    assert res.step == 20 and math.isfinite(res.val_loss)
    log = (tmp_path / "runs" / "n" / "train.log").read_text()
    assert "non-finite" in log and "step skipped" in log
    w = load_file(tmp_path / "runs" / "n" / "checkpoints" / "last" / "model.safetensors")
    assert all(t.isfinite().all() for t in w.values())


def test_repeated_nans_stop_the_run_cleanly(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(GPT, "forward", _nan_forward(set(range(12, 1000))))
    with pytest.raises(
        MinigptError, match=r"not finite for 5 steps in a row, steps 12 to 16;.*learning_rate"
    ):
        train(
            tiny(data_dir, "train.max_iters=40"), run_name="n", echo=lambda m: None, progress=False
        )
    last = tmp_path / "runs" / "n" / "checkpoints" / "last"
    model, _ = checkpoint.load_model(last)
    assert all(p.isfinite().all() for p in model.parameters())


def test_a_model_that_overflows_as_initialised_is_told_apart_from_a_high_learning_rate(
    data_dir, tmp_path, monkeypatch
):
    """NaN from the first step on: no update happened, so the fix is the init, not the learning
    rate; the eval sample says why there is none instead of sampling from NaN."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        MinigptError, match=r"first 5 steps, before any update.*model.init_std \(now 1e\+10\)"
    ) as e:
        train(
            tiny(data_dir, "train.max_iters=40", "model.init_std=1e10", "train.sample_tokens=20"),
            run_name="o",
            echo=lambda m: None,
            progress=False,
        )
    assert "learning_rate" not in str(e.value)
    assert (
        "(no sample: the model's output is NaN"
        in (tmp_path / "runs" / "o" / "samples.txt").read_text()
    )
    from minigpt_cli.sample.sampling import sample_next

    with pytest.raises(MinigptError, match="output is NaN"):
        sample_next(torch.tensor([[0.0, float("nan")]]), 0.0, None, None, None)


def test_early_stopping_and_kept_checkpoints(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # A learning rate of ~0 after warmup: val loss stops improving, patience 2 ends the run.
    cfg = tiny(
        data_dir,
        "train.max_iters=200",
        "train.eval_interval=10",
        "train.early_stop_patience=2",
        "train.learning_rate=1e-9",
        "train.min_lr=0",
        "train.warmup_iters=0",
        "train.keep_every=10",
    )
    res = train(cfg, run_name="e", echo=lambda m: None, progress=False)
    assert res.stopped_early and res.step < 200
    ckpts = tmp_path / "runs" / "e" / "checkpoints"
    assert (ckpts / "best").is_dir() and (ckpts / "last").is_dir()
    assert (ckpts / "step-0000010" / "model.safetensors").is_file()
    assert "early stopping" in (tmp_path / "runs" / "e" / "train.log").read_text()


def test_compile_failure_falls_back_with_a_warning(data_dir, tmp_path, monkeypatch):
    """torch.compile fails lazily on some platforms: the run warns once and trains eagerly."""
    monkeypatch.chdir(tmp_path)

    class Broken(torch.nn.Module):
        def forward(self, *a, **k):
            raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch, "compile", lambda model, **k: Broken())
    notes = []
    # n_embd 128: in eager mode the linear layers run on oneDNN (x86), which env.json must then say.
    res = train(
        tiny(data_dir, "train.max_iters=10", "compile=true", "model.n_embd=128"),
        run_name="c",
        echo=notes.append,
        progress=False,
    )
    assert res.step == 10 and math.isfinite(res.val_loss)
    assert sum("torch.compile failed" in n for n in notes) == 1
    keys = load_file(tmp_path / "runs" / "c" / "checkpoints" / "last" / "model.safetensors").keys()
    assert not any(k.startswith("_orig_mod.") for k in keys)
    from minigpt_cli.runtime.kernels.onednn import wins as onednn_enabled

    env = json.loads((tmp_path / "runs" / "c" / "env.json").read_text())
    assert env["linear_kernel"] == ("oneDNN" if onednn_enabled() else "torch.mm")
    # bench falls back the same way, and says what it measured.
    from minigpt_cli.bench.throughput import bench

    bench_notes = []
    small_peak(monkeypatch)
    r = bench(
        tiny(data_dir, "compile=true", "model.n_embd=128"),
        iters=1,
        generation=False,
        echo=bench_notes.append,
    )
    assert r["compile"] is False and r["linear_kernel"] == env["linear_kernel"]
    assert sum("torch.compile failed" in n for n in bench_notes) == 1


def test_bfloat16_autocast_runs_on_cpu(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = train(
        tiny(data_dir, "train.max_iters=20", "dtype=bfloat16"),
        run_name="b",
        echo=lambda m: None,
        progress=False,
    )
    assert math.isfinite(res.val_loss) and res.val_loss < math.log(65)
    env = json.loads((tmp_path / "runs" / "b" / "env.json").read_text())
    assert env["dtype"] == "bfloat16"


def test_tensorboard_without_the_package_is_a_clear_error(cli, data_dir, tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(tmp_path)
    real = importlib.util.find_spec  # the package as missing, whether it is installed here or not
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    res = cli(
        "train", TINY, "--set", "train.tensorboard=true", "--set", f"data.data_dir={data_dir}"
    )
    assert_user_error(res, "tensorboard", "pip install tensorboard")
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="torch.compile's CPU backend needs a C++ compiler",
)
def test_compile_trains_like_eager_on_cpu(data_dir, tmp_path, monkeypatch):
    """The GPU recipe's compile path, run for real on the CPU: the same losses as eager, no
    fallback."""
    monkeypatch.chdir(tmp_path)
    notes: list[str] = []
    runs = {}
    for flag in ("false", "true"):
        # n_embd 64: c_fc and the MLP's c_proj (256 tokens x 64 x 256) are big enough for oneDNN in
        # eager mode. n_layer 1: one block is enough here, and a smaller graph compiles faster (~40
        # s with a cold inductor cache).
        res = train(
            tiny(
                data_dir,
                "train.max_iters=10",
                "train.eval_interval=10",
                f"compile={flag}",
                "model.n_embd=64",
                "model.n_layer=1",
            ),
            run_name=f"c{flag}",
            echo=notes.append,
            progress=False,
        )
        runs[flag] = curve(res.run_dir)
    from minigpt_cli.runtime.kernels.onednn import wins as onednn_enabled

    assert not [n for n in notes if "compile" in n and "oneDNN" not in n], notes  # no fallback
    # On x86 the compiled run says that eager would put (some of) tiny's linear layers on the faster
    # oneDNN, and env.json names the kernel the compiled step really uses.
    assert sum("oneDNN" in n for n in notes) == int(onednn_enabled()), notes
    envs = {
        flag: json.loads((tmp_path / "runs" / f"c{flag}" / "env.json").read_text()) for flag in runs
    }
    assert envs["true"]["linear_kernel"] == "torch.mm"
    assert envs["false"]["linear_kernel"] == ("oneDNN+torch.mm" if onednn_enabled() else "torch.mm")
    assert runs["true"].keys() == runs["false"].keys() and len(runs["true"]) >= 12
    for key, value in runs["false"].items():
        assert runs["true"][key] == pytest.approx(value, abs=2e-4), key


def test_missing_device_is_a_clear_error(cli, tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(tmp_path)
    assert_user_error(cli("train", TINY, "--set", "device=cuda"), "device: cuda", "no CUDA")
    assert not (tmp_path / "runs").exists()


def test_weight_decay_on_matrices_only():
    cfg = load_config(CONFIGS / "tiny.yaml").model.model_copy(
        update={"vocab_size": 65, "bias": True}
    )
    model = GPT(cfg)
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == model.num_params()


@pytest.mark.real_plot
def test_tiny_run_learns_and_logs(tmp_path, data_dir, monkeypatch, corpus_in_use):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        CONFIGS / "tiny.yaml",
        [
            f"data.data_dir={data_dir}",
            "train.max_iters=60",
            "train.eval_interval=30",
            "train.eval_iters=20",
        ],
    )
    result = train(cfg, run_name="t", echo=lambda m: None, progress=False)
    lines = [json.loads(l) for l in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [l for l in lines if l["event"] == "eval"]
    trains = [l for l in lines if l["event"] == "train"]
    assert [e["step"] for e in evals] == [0, 30, 60]
    # Loss at initialisation ≈ ln(vocabulary) (the genuine corpus: ln 65); it then falls.
    assert abs(evals[0]["val_loss"] - math.log(len(corpus_in_use.chars))) < 0.1
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    assert evals[-1]["train_loss"] < evals[0]["train_loss"] - 0.5
    for l in lines:
        assert {"step", "event", "elapsed_s"} <= set(l)
    for l in trains:
        assert (
            {"loss", "lr", "tokens_per_sec"} <= set(l) and l["lr"] > 0 and l["tokens_per_sec"] > 0
        )
    for e in evals:
        assert {"train_loss", "val_loss"} <= set(e)
    assert result.best_val_loss == min(e["val_loss"] for e in evals)
    # loss.png is the real plot (the suite's other in-process runs write a 1x1 stand-in): a 700 x
    # 450 PNG.
    png = (result.run_dir / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (700, 450)
    # Every file and folder of the run gets the mode a plain open()/mkdir() would under the umask:
    # no 0600 files from tempfile.mkstemp, no 0700 checkpoint folders from mkdtemp.
    import os

    umask = os.umask(0)
    os.umask(umask)
    modes = {
        p.relative_to(result.run_dir).as_posix(): p.stat().st_mode & 0o777
        for p in result.run_dir.rglob("*")
        if p.name != ".lock"
    }
    assert {
        "loss.png",
        "metrics.jsonl",
        "checkpoints/last",
        "checkpoints/last/model.safetensors",
    } <= set(modes)
    wrong = {
        k: oct(m)
        for k, m in modes.items()
        if m != (0o777 if (result.run_dir / k).is_dir() else 0o666) & ~umask
    }
    assert not wrong, wrong


def test_a_model_too_large_for_memory_is_refused_before_anything_is_made(
    cli, data_dir, tmp_path, monkeypatch, corpus_in_use
):
    """10 million layers: the estimate (count-params' accounting) exceeds the free memory; no run
    folder."""
    from helpers import assert_user_error

    import minigpt_cli.runtime.device as T

    monkeypatch.chdir(tmp_path)
    res = cli(
        "train",
        CONFIGS / "tiny.yaml",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "model.n_layer=10000000",
    )
    assert_user_error(
        res,
        "this model needs about",
        # the layers and positions, and the tied embedding: vocabulary x n_embd 32 (the genuine
        # corpus: 123,520,003,136)
        f"{123_520_001_056 + 32 * len(corpus_in_use.chars):,} parameters",
        "free",
        "model.n_layer",
        notes_ok=True,
    )
    assert not (tmp_path / "runs").exists()
    # The estimate against a pretend 1 MiB machine: even the tiny model is refused; with plenty, it
    # trains.
    monkeypatch.setattr(T, "available_memory", lambda device: 2**20)
    cfg = load_config(CONFIGS / "tiny.yaml", [f"data.data_dir={data_dir}"])
    with pytest.raises(T.MinigptError, match="but cpu has 1.00 MiB free"):
        T.check_memory(
            cfg.model_copy(update={"model": cfg.model.model_copy(update={"vocab_size": 65})}),
            torch.device("cpu"),
            torch.float32,
        )


def test_running_out_of_memory_is_one_line(cli, data_dir, tmp_path, monkeypatch):
    """The allocator failing after the estimate passed: one line, exit 2, the fix named."""
    from helpers import assert_user_error

    import minigpt_cli.trainer.loop as T

    monkeypatch.chdir(tmp_path)

    def oom(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 786432 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(T, "train_step", oom)
    res = cli(
        "train", CONFIGS / "tiny.yaml", "--set", f"data.data_dir={data_dir}", "--run-name", "o"
    )
    assert_user_error(
        res, "out of memory", "can't allocate memory", "train.batch_size", notes_ok=True
    )


def _nan_forward(bad_calls):
    """GPT.forward with a NaN loss at the training calls ``bad_calls`` of each model (counted per
    model: the throwaway model train times its estimate with makes a few calls of its own first)."""
    import weakref

    real = GPT.forward
    count = weakref.WeakKeyDictionary()

    def forward(self, idx, targets=None, *a, **k):
        logits, loss = real(self, idx, targets, *a, **k)
        if targets is not None and self.training:
            count[self] = count.get(self, 0) + 1
            if count[self] in bad_calls:
                loss = loss * float("nan")
        return logits, loss

    return forward


def test_the_eval_does_not_depend_on_how_the_global_batch_is_split(data_dir, tmp_path, monkeypatch):
    """Identical weights at step 0: 8 x 1, 1 x 8 and 2 x 4 evaluate the same windows, to 1e-6 (2
    processes x 4: test_resume's DDP test). Before, each read eval_iters micro-batches: 4.1710,
    4.1578 and 4.1636."""
    monkeypatch.chdir(tmp_path)
    losses = {}
    for batch, accum in ((8, 1), (1, 8), (2, 4)):
        res = train(
            tiny(
                data_dir,
                "train.max_iters=1",
                f"train.batch_size={batch}",
                f"train.grad_accum_steps={accum}",
                "train.eval_iters=3",
            ),
            f"split-{batch}x{accum}",
            echo=lambda m: None,
            progress=False,
        )
        losses[batch, accum] = next(
            (r["train_loss"], r["val_loss"])
            for r in records(res.run_dir)
            if r["event"] == "eval" and r["step"] == 0
        )
    reference = losses[8, 1]
    for split, pair in losses.items():
        assert pair == pytest.approx(reference, abs=1e-6, rel=0), split
    # The eval is over 3 x 8 windows per split, not 3 micro-batches: a different count gives another
    # mean.
    other = train(
        tiny(data_dir, "train.max_iters=1", "train.eval_iters=1"),
        "fewer",
        echo=lambda m: None,
        progress=False,
    )
    first = next(r["val_loss"] for r in records(other.run_dir) if r["event"] == "eval")
    assert abs(first - reference[1]) > 1e-6


def test_the_eval_at_start_can_be_skipped(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = train(
        tiny(data_dir, "train.max_iters=4", "train.eval_interval=2", "train.eval_at_start=false"),
        "late",
        echo=lambda m: None,
        progress=False,
    )
    assert [r["step"] for r in records(res.run_dir) if r["event"] == "eval"] == [2, 4]


def test_train_prints_the_notes_dry_run_shows(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sets = [
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.max_iters=2",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.sample_tokens=0",
        "--set",
        "model.pos_encoding=sinusoidal",
        "--set",
        "data.url=file:///home/me/my.txt",
    ]
    dry = [
        l
        for l in cli("train", TINY, "--dry-run", *sets).stdout.splitlines()
        if l.startswith("note: ")
    ]
    assert len(dry) == 3
    res = cli("train", TINY, "--no-progress", *sets)
    assert res.exit_code == 0, res
    assert [l for l in res.stderr.splitlines() if l.startswith("note: ")] == dry


def test_without_a_bar_a_status_line_tells_of_progress(data_dir, tmp_path, monkeypatch):
    """stderr to a file or pipe: no bar, so a line at most every STATUS_EVERY_S (0 here: at each
    log_interval)."""
    import minigpt_cli.trainer.loop as loop

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loop, "STATUS_EVERY_S", 0.0)
    said: list[str] = []
    train(
        tiny(data_dir, "train.max_iters=4", "train.log_interval=2", "train.eval_interval=4"),
        "quiet",
        echo=said.append,
        progress=False,
    )
    status = [line for line in said if line.startswith("step ") and "tokens/s" in line]
    assert [line.split(":")[0] for line in status] == ["step 2/4", "step 4/4"], said


# ---------------------------------------------------------------- compile, decided once at build


REAL_COMPILE = torch.compile


def _compile_with(monkeypatch, backend) -> None:
    """torch.compile for real (Dynamo captures the model) with ``backend`` compiling the graphs:
    "eager" runs them as captured, in seconds on a CPU; a function that raises is a compiler that
    fails."""
    monkeypatch.setattr(torch, "compile", lambda model, **k: REAL_COMPILE(model, backend=backend))


def test_a_compiled_run_that_is_not_finite_from_the_start_is_pointed_at_compile_false(
    data_dir, tmp_path, monkeypatch
):
    """With compile on, non-finite first steps may be the compiled graph's fault (NaN gradients from
    Inductor where the eager model trains): the error says to try compile: false before the init,
    and names the gradients too when train.grad_clip checks their norm."""
    monkeypatch.chdir(tmp_path)
    _compile_with(monkeypatch, "eager")
    with pytest.raises(MinigptError) as e:
        train(
            tiny(data_dir, "train.max_iters=20", "model.init_std=1e10", "compile=true"),
            run_name="c",
            echo=lambda m: None,
            progress=False,
        )
    message = str(e.value)
    assert "before any update, with compile on" in message and "compile: false" in message
    assert "the loss or its gradients were not finite" in message  # tiny() clips gradients


def _failing_at_call(n: int, error: Exception, monkeypatch) -> list[int]:
    """The trainer's train_step, raising ``error`` at its ``n``-th call; the calls made, counted."""
    from minigpt_cli.trainer import loop

    real, calls = loop.train_step, []

    def step(*a, **k):
        calls.append(len(calls) + 1)
        if len(calls) == n:
            raise error
        return real(*a, **k)

    monkeypatch.setattr(loop, "train_step", step)
    return calls


def test_an_out_of_memory_error_in_a_compiled_step_ends_the_run(
    cli, data_dir, tmp_path, monkeypatch
):
    """A compiled run (warmed up at build) that runs out of memory at step 3: the user gets the
    error, in one line, and no step runs eagerly after it (once, every exception of a step counted
    as a compile failure). The evals ran the compiled model."""
    monkeypatch.chdir(tmp_path)
    _compile_with(monkeypatch, "eager")
    calls = _failing_at_call(
        3, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), monkeypatch
    )
    evaluated = []
    real_losses = Evaluator.losses
    monkeypatch.setattr(
        Evaluator,
        "losses",
        lambda self, model, step: (
            evaluated.append(type(model).__name__) or real_losses(self, model, step)
        ),
    )
    res = cli(
        "train",
        TINY,
        "--run-name",
        "oom",
        *("--set", f"data.data_dir={data_dir}", "--set", "compile=true"),
        *("--set", "train.log_interval=1", "--set", "train.max_iters=10"),
    )
    assert_user_error(
        res, "out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)", notes_ok=True
    )
    assert "torch.compile failed" not in res.stdout + res.stderr
    assert calls == [1, 2, 3]  # no step after the error, eager or not
    assert evaluated == ["OptimizedModule"]  # step 0's eval, on the compiled model
    run = tmp_path / "runs" / "oom"
    assert [r["step"] for r in records(run) if r["event"] == "train"] == [1, 2]
    assert "training without it" not in (run / "train.log").read_text()


def test_compile_falls_back_at_build_only(data_dir, tmp_path, monkeypatch):
    """A compiler that fails does so in the warm-up, before step 1: a warning, then every step
    eager. The same kind of error from a step after the warm-up (a RuntimeError, as Inductor raises)
    is the run's error, not a fallback."""
    monkeypatch.chdir(tmp_path)

    def no_compiler(graph, example_inputs):
        raise RuntimeError("no C++ compiler here")

    _compile_with(monkeypatch, no_compiler)
    notes: list[str] = []
    res = train(
        tiny(data_dir, "train.max_iters=6", "compile=true"),
        run_name="fails",
        echo=notes.append,
        progress=False,
    )
    failed = [n for n in notes if "torch.compile failed" in n]
    assert res.step == 6 and len(failed) == 1 and "no C++ compiler here" in failed[0], notes
    log = (tmp_path / "runs" / "fails" / "train.log").read_text()
    assert log.index("training without it") < log.index("run folder")  # at build, before any step

    _compile_with(monkeypatch, "eager")
    calls = _failing_at_call(3, RuntimeError("a kernel failed at step 3"), monkeypatch)
    notes.clear()
    with pytest.raises(RuntimeError, match="a kernel failed at step 3"):
        train(
            tiny(data_dir, "train.max_iters=6", "compile=true"),
            run_name="later",
            echo=notes.append,
            progress=False,
        )
    assert calls == [1, 2, 3] and not [n for n in notes if "torch.compile failed" in n], notes


# ---------------------------------------------------------------- the step stays on the device


def _on_device(optimizer, skip: torch.Tensor) -> None:
    """``step_unless``'s path on a GPU, taken here on the CPU: the flag handed over as torch.amp's
    ``found_inf``, never read on the host."""
    parts = optimizer.parts if hasattr(optimizer, "parts") else [optimizer]
    for part in parts:
        part.found_inf = skip
    optimizer.step()
    for part in parts:
        del part.found_inf


#: Every Muon variant on at once (issue 39): NorMuon's second moment must be kept too.
MUON_VARIANTS = {
    "coefficients": "polar-express",
    "ns_method": "gram",
    "normuon": True,
    "cautious_weight_decay": True,
    "weight_decay": 0.1,
}


@pytest.mark.parametrize("path", ["step_unless", "found_inf"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon", "muon-variants"])
def test_a_skipped_update_changes_nothing_and_a_taken_one_is_a_plain_step(optimizer, path):
    """step_unless with 1.0 leaves every weight, moment and step count as it was, to the bit; with
    0.0 it makes the update of a plain ``step()`` on a copy of the same model, to the bit. On a CPU
    step_unless reads the flag (nothing is queued there); the device's path, the flag as
    ``found_inf``, is checked too."""
    from minigpt_cli.trainer.optim import step_unless

    if path == "found_inf":
        step_unless = _on_device  # noqa: F811

    cfg = load_config(TINY).model.model_copy(update={"vocab_size": 65})
    if optimizer == "muon-variants":
        tc = TrainConfig(optimizer="muon", muon=MUON_VARIANTS)
    else:
        tc = TrainConfig(optimizer=optimizer)
    torch.manual_seed(0)
    x = torch.randint(0, 65, (4, 32))
    models = [GPT(cfg) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [make_optimizer(m, tc) for m in models]

    def state(model, opt):
        moments = [v.clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        return [p.detach().clone() for p in model.parameters()] + moments

    for i in range(3):  # a few steps, so that the moments are there and the skip must keep them
        for model in models:
            model.zero_grad()
            model(x, x)[1].backward()
        if i == 2:
            before = state(models[0], opts[0])
            for p in models[0].parameters():
                p.grad[0] = float("nan")
            step_unless(opts[0], torch.tensor(1.0))
            after = state(models[0], opts[0])
            assert all(torch.equal(a, b) for a, b in zip(before, after))
            break
        step_unless(opts[0], torch.tensor(0.0))
        opts[1].step()
        for a, b in zip(state(models[0], opts[0]), state(models[1], opts[1])):
            assert torch.equal(a, b)


def test_the_step_reads_nothing_on_the_host_between_log_intervals(data_dir, tmp_path, monkeypatch):
    """Every .item(), bool(), float(), int() and .tolist() of a tensor during a run, by where it is
    made: in a step only step_unless's flag (on a CPU, where nothing is queued; the device's path:
    test_a_skipped_update_changes_nothing_and_a_taken_one_is_a_plain_step), none in the loop between
    steps, two at each log interval (the interval's skip flags and losses in one read, the logged
    loss), and the evals' own. A NaN loss at step 7 is
    skipped on the device, logged at the read of step 10, and its update is not counted by AdamW's
    step count."""
    from minigpt_cli.trainer.loop import Trainer

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(GPT, "forward", _nan_forward({7}))
    where = ["setup"]
    reads: dict[str, int] = {}

    def phase(name, method):
        real = getattr(Trainer, name)

        def wrapped(self, *a, **k):
            where.append(method)
            try:
                return real(self, *a, **k)
            finally:
                where.pop()

        monkeypatch.setattr(Trainer, name, wrapped)

    for name, method in [("fit", "loop"), ("step", "step"), ("log_train", "log")]:
        phase(name, method)
    phase("evaluate", "eval")
    phase("finish", "end")
    for attr in ("item", "tolist", "__bool__", "__float__", "__int__"):
        real = getattr(torch.Tensor, attr)

        def counted(self, *a, _real=real, **k):
            reads[where[-1]] = reads.get(where[-1], 0) + 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, attr, counted)
    res = train(
        tiny(data_dir, "train.max_iters=20", "train.log_interval=5", "train.eval_interval=100"),
        run_name="sync",
        echo=lambda m: None,
        progress=False,
    )
    monkeypatch.undo()  # the reads below are the test's own (and the working folder is the test's again)
    run = tmp_path / "runs" / "sync"
    assert res.step == 20
    assert reads.get("step", 0) == 20 and reads.get("loop", 0) == 0, reads  # one flag a step
    assert reads["log"] == 2 * 4, reads  # steps 5, 10, 15, 20
    log = (run / "train.log").read_text()
    assert log.count("step skipped") == 1 and "step 7: non-finite loss or gradient (nan)" in log
    assert [r["step"] for r in records(run) if r["event"] == "train"] == [5, 10, 15, 20]
    state = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    state = state["optimizer"]["state"]
    assert {float(s["step"]) for s in state.values()} == {19.0}  # 20 steps, one skipped


def test_a_scaler_overflow_skips_the_update_on_the_device_without_counting_it():
    """float16's GradScaler (here on the CPU): gradients that overflow the scale skip the update and
    halve the scale, as scaler.step did, and with train.grad_clip 0 the step is not counted as
    non-finite."""
    cfg = load_config(TINY).model.model_copy(update={"vocab_size": 65})
    torch.manual_seed(0)
    model = GPT(cfg)
    x = torch.randint(0, 65, (4, 32))
    opt = make_optimizer(model, TrainConfig())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, enabled=True)
    params = [p for p in model.parameters() if p.requires_grad]

    class Huge(torch.nn.Module):  # a finite loss whose scaled gradients overflow float32
        def forward(self, idx, targets):
            logits, loss = model(idx, targets)
            return logits, loss * 1e36

    before = [p.detach().clone() for p in params]
    loss, skipped = train_step(
        Huge(), opt, iter([(x, x)]), 1, torch.autocast("cpu", enabled=False), scaler, 0.0, params
    )
    assert torch.isfinite(loss) and skipped.item() == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, params))
    # AdamW took no step (on a CPU it never started: step_unless read the flag)
    assert all(float(s["step"]) == 0.0 for s in opt.state.values())
    assert scaler.get_scale() == 2.0**15
    loss, skipped = train_step(
        model, opt, iter([(x, x)]), 1, torch.autocast("cpu", enabled=False), scaler, 0.0, params
    )
    assert skipped.item() == 0.0 and not all(torch.equal(a, p) for a, p in zip(before, params))


# torch's own patch, not monkeypatch's: undoing a setattr on torch's config module deletes the key
# (PyTorch 2.13), and every later compile in the process then fails on the missing limit.
@torch._dynamo.config.patch(recompile_limit=2)
def test_run_after_run_in_one_process_each_compiles(data_dir, tmp_path, monkeypatch):
    """A sweep trains in-process: a run past Dynamo's recompile limit (8 compiles of GPT.forward; 2
    here, to be quick) still compiles, rather than running eagerly without a word."""
    monkeypatch.chdir(tmp_path)
    compiled = []

    def counting(graph, example_inputs):
        compiled.append(1)
        return graph.forward

    _compile_with(monkeypatch, counting)
    for i in range(3):
        before = len(compiled)
        train(
            tiny(
                data_dir,
                "train.max_iters=1",
                "train.eval_iters=1",
                "model.n_layer=1",
                "compile=true",
            ),
            run_name=f"r{i}",
            echo=lambda m: None,
            progress=False,
        )
        assert len(compiled) > before, i


# ---------------------------------------------------------------- the whole val split at each eval


@pytest.mark.parametrize(
    "n,block_size,batch_size,world",
    [(100, 16, 3, 1), (100, 16, 3, 2), (97, 8, 4, 3), (17, 16, 8, 2), (2, 4, 2, 2), (33, 32, 1, 4)],
)
def test_full_eval_batches_score_every_token_once_over_the_processes(
    n, block_size, batch_size, world
):
    """Every token after the first is a target exactly once over all the processes' batches, each
    read after the tokens before it in its window; every process reads the same number of
    batches (FSDP's forward is a collective)."""
    from minigpt_cli.data.pipeline import full_eval_batches, full_eval_steps

    tokens = torch.randperm(1000)[:n].numpy()
    scored = []
    for rank in range(world):
        batches = list(
            full_eval_batches(tokens, block_size, batch_size, rank, world, torch.device("cpu"))
        )
        assert len(batches) == full_eval_steps(n, block_size, batch_size, world)
        for x, y in batches:
            assert x.shape == y.shape and x.size(0) <= batch_size and x.size(1) <= block_size
            for row_x, row_y in zip(x.tolist(), y.tolist()):
                begin = tokens.tolist().index(row_x[0])
                for j, target in enumerate(row_y):
                    if target >= 0:
                        assert row_x[: j + 1] == tokens[begin : begin + j + 1].tolist()
                        assert target == tokens[begin + j + 1]
                        scored.append(begin + j + 1)
    assert sorted(scored) == list(range(1, n))


def test_estimate_loss_weighs_each_batch_by_its_scored_tokens():
    """The mean over tokens, whatever the batching: three ways of cutting one split into batches
    (one holding no scored target) give the summed cross-entropy of every token over their
    count."""
    from contextlib import nullcontext

    from minigpt_cli.data.pipeline import full_eval_batches
    from minigpt_cli.trainer.step import estimate_loss

    torch.manual_seed(0)
    cfg = tiny("data").model.model_copy(update={"vocab_size": 65})
    model = GPT(cfg)
    tokens = torch.randint(0, 65, (301,)).numpy()
    x = torch.from_numpy(tokens[:-1].astype("int64"))[None]
    y = torch.from_numpy(tokens[1:].astype("int64"))[None]
    with torch.no_grad():
        # windows of block_size (32): the same (context, token) pairs as the batches below
        logits = torch.cat([model(x[:, i : i + 32])[0] for i in range(0, 300, 32)], dim=1)
        expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
    got = []
    for batch_size, world in ((1, 1), (4, 1), (3, 3)):
        batches = [
            b
            for rank in range(world)
            for b in full_eval_batches(tokens, 32, batch_size, rank, world, torch.device("cpu"))
        ]
        assert world == 1 or any((b[1] < 0).all() for b in batches)  # a batch that scores nothing
        got.append(estimate_loss(model, {"val": batches}, nullcontext())["val"])
    assert got == pytest.approx([expected] * 3, abs=1e-6), got


def test_eval_full_val_logs_the_whole_val_split_and_evaluate_gives_it_back(
    data_dir, tmp_path, cli, monkeypatch
):
    """A run with train.eval_full_val logs the loss --full --stride BLOCK_SIZE computes on its
    last checkpoint, and evaluate's default (the run's eval windows) gives that back too."""
    monkeypatch.chdir(tmp_path)
    result = train(
        tiny(
            data_dir, "train.max_iters=3", "train.eval_at_start=false", "train.eval_full_val=true"
        ),
        "full",
        echo=lambda m: None,
        progress=False,
    )
    full = cli(
        "evaluate",
        "--run",
        result.run_dir,
        "--checkpoint",
        "last",
        "--full",
        "--stride",
        "32",
        "--batch-size",
        "64",
        "--json",
        "--no-progress",
    )
    assert full.exit_code == 0, full
    full = json.loads(full.stdout)
    assert full["loss"] == pytest.approx(result.val_loss, abs=1e-5), (full, result.val_loss)
    again = cli(
        "evaluate", "--run", result.run_dir, "--checkpoint", "last", "--json", "--no-progress"
    )
    again = json.loads(again.stdout)
    assert again["mode"] == "eval" and again["tokens"] == full["tokens"] == full["split_tokens"] - 1
    assert again["loss"] == pytest.approx(result.val_loss, abs=1e-6)
    assert again["logged_loss"] == pytest.approx(result.val_loss, abs=1e-12)
