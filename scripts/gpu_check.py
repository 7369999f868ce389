"""The GPU check's measurements (run by scripts/gpu-check.sh): one JSON file and a short summary.

It goes through the CLI (``python -m minigpt_cli``: bench, count-params, train, evaluate, generate,
torchrun) and, where a number needs Python, through ``minigpt_cli``'s public API (``generate``,
``load_run``), so that a refactor of the internals cannot break it unseen (tests/test_gpu_check.py
holds every command, option, ``--set`` key and import named here against the real CLI and package).
Each step is recorded as ok, failed (with the end of its log) or skipped (with why); a failed step
does not stop the others.

``--mode cuda`` measures on the GPU: torch, CUDA and driver versions; ``minigpt bench`` of
configs/shakespeare.yaml (compiled, bf16: MFU against the datasheet's peak and a measured one); 75 s
of training it with evals; compiled against eager greedy decoding at batch 1 and 8 (tokens/s; the
share of equal tokens and the largest logit difference, not bit equality: Inductor's kernels round
differently); a 2-process torchrun (NCCL) against one process (needs 2 GPUs); the CUDA allocator's
peak against count-params' estimate. ``--mode cpu`` takes the same steps at tiny sizes on the CPU
(CI runs it): torch.compile is a no-op there (TORCH_COMPILE_DISABLE=1: Inductor's C++ build alone
takes longer than the whole check), and torchrun uses gloo."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path("data") / "tinyshakespeare" / "input.txt"

#: Each mode's sizes: the CUDA check's (issue 36's targets) and the CPU mode's (small, for CI).
MODES = {
    "cuda": {
        "config": REPO / "configs" / "shakespeare.yaml",
        "sets": ["compile=true", "dtype=bfloat16"],
        "bench_iters": 50,
        "train_seconds": 75,
        "train_sets": ["train.eval_interval=250", "train.eval_iters=100"],
        "decode_tokens": (100, 1000),  # two lengths: their difference cancels loading and compiling
        # Eager (compiling in each process would take most of the step's time), bf16 like the rest.
        "dist_sets": [
            "dtype=bfloat16",
            "train.max_iters=10",
            "train.log_interval=1",
            "train.eval_iters=10",
        ],
        "dist_batch": 64,
        # bf16 autocast and TF32: the order of the sums moves the loss in its 3rd digit.
        "dist_tolerance": 2e-2,
        "budget_s": 560,
    },
    "cpu": {
        "config": REPO / "configs" / "tiny.yaml",
        "sets": [],
        "bench_iters": 2,
        "train_seconds": 10,  # a limit that stops it only on a loaded machine: 20 steps take ~1 s
        "train_sets": ["train.max_iters=20", "train.eval_interval=10", "train.eval_iters=2"],
        "decode_tokens": (20, 200),
        "dist_sets": ["train.max_iters=4", "train.log_interval=1", "train.eval_iters=2"],
        "dist_batch": 8,
        "dist_tolerance": 1e-5,  # float32 on gloo: tests/test_distributed.py's tolerance
        "budget_s": 300,
    },
}
#: The target of issue 36 that the training step reads off its evals.
TARGET_VAL = 1.47


class StepFailed(Exception):
    """A step's command failed; the message names it and ends with its log's last lines."""


class Check:
    """The steps' shared state: where to run, the mode's sizes, the time left, the record."""

    def __init__(self, mode: str, out: Path, work: Path):
        self.mode, self.out, self.work = mode, out, work
        self.size = MODES[mode]
        self.deadline = time.monotonic() + self.size["budget_s"]
        self.record: dict[str, Any] = {"mode": mode, "steps": {}}
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, words: list[str], limit: float) -> str:
        """Run ``words`` in the work folder, stderr to OUT/NAME.log; its stdout (or StepFailed)."""
        log = self.out / f"{name}.log"
        limit = max(1.0, min(limit, self.left()))
        with open(log, "w") as err:
            try:
                done = subprocess.run(
                    words,
                    cwd=self.work,
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    timeout=limit,
                )
            except subprocess.TimeoutExpired:
                raise StepFailed(f"{' '.join(words[:5])} ... ran past {limit:.0f} s") from None
        if done.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise StepFailed(f"exit {done.returncode}: " + " | ".join(tail))
        return done.stdout


def minigpt(check: Check, step: str, *words: str, limit: float = 300) -> str:
    """``python -m minigpt_cli WORDS`` (the first word is the command); its stdout."""
    return check.run(step, [sys.executable, "-m", "minigpt_cli", *words], limit)


def torchrun(check: Check, step: str, nproc: int, *words: str, limit: float = 300) -> str:
    """``torchrun --standalone --nproc_per_node NPROC -m minigpt_cli WORDS``; its stdout."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return check.run(
        step, [*launch, "--nproc_per_node", str(nproc), "-m", "minigpt_cli", *words], limit
    )


def sets(*pairs: str) -> list[str]:
    """``--set KEY=VALUE`` for each pair."""
    return [w for p in pairs for w in ("--set", p)]


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- the steps


def versions(check: Check) -> dict:
    """torch, CUDA, cuDNN, the driver and the device; Python, minigpt and the commit."""
    import torch

    import minigpt_cli

    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "minigpt": minigpt_cli.__version__,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        or None,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpus": torch.cuda.device_count(),
        "cpu_cores": os.cpu_count(),
    }
    if check.mode == "cuda":
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        info["nvidia_smi"] = smi.stdout.strip().splitlines()
        info["driver"] = smi.stdout.split(",")[1].strip() if smi.returncode == 0 else None
    return info


def bench(check: Check) -> dict:
    """``minigpt bench --json``: training tokens/s, MFU against the datasheet's and the measured
    peak, peak memory."""
    s = check.size
    out = minigpt(
        check,
        "bench",
        "bench",
        str(s["config"]),
        "--iters",
        str(s["bench_iters"]),
        "--no-generation",  # the decoding step below measures generation
        "--json",
        *sets(*s["sets"]),
        limit=300,
    )
    return json.loads(out)


def memory(check: Check) -> dict:
    """bench's peak allocated memory (CUDA's allocator; the process's RSS on a CPU) against
    ``count-params``' estimate for the same model, batch and dtype."""
    b = check.record["steps"]["bench"]["result"]
    out = minigpt(
        check,
        "count-params",
        "count-params",
        "--config",
        str(check.size["config"]),
        "--dtype",
        b["dtype"],
        "--vocab-size",
        "65",  # Tiny Shakespeare's characters: the vocabulary bench measured
        "--json",
        *sets(*check.size["sets"]),
        limit=60,
    )
    estimate = json.loads(out)["memory"]
    measured = b["peak_memory_bytes"]
    return {
        "measured_bytes": measured,
        "measured_by": "torch.cuda.max_memory_allocated" if check.mode == "cuda" else "max RSS",
        "estimate_bytes": estimate["total_estimate"],
        "estimate": estimate,
        "measured_over_estimate": measured / estimate["total_estimate"],
    }


def train(check: Check) -> dict:
    """``minigpt train`` for ``train_seconds`` of wall time (train.max_seconds: evals included),
    with evals."""
    s = check.size
    minigpt(
        check,
        "train",
        "train",
        str(s["config"]),
        "--run-name",
        "check",
        "--no-progress",
        *sets(*s["sets"], f"train.max_seconds={s['train_seconds']}", *s["train_sets"]),
        limit=s["train_seconds"] + 240,  # start-up, data preparation and compiling come on top
    )
    run = check.work / "runs" / "check"
    log = events(run)
    evals = [
        {k: e[k] for k in ("step", "elapsed_s", "train_loss", "val_loss")}
        for e in log
        if e["event"] == "eval"
    ]
    rates = [e["tokens_per_sec"] for e in log if e["event"] == "train" and e.get("tokens_per_sec")]
    reached = next((e for e in evals if e["val_loss"] <= TARGET_VAL), None)
    return {
        "run": str(run),
        "steps": max(e["step"] for e in log),
        "seconds": max(e["elapsed_s"] for e in log),
        "evals": evals,
        "best_val": min(e["val_loss"] for e in evals),
        "target_val": TARGET_VAL,
        "target_reached_at_s": reached["elapsed_s"] if reached else None,
        "tokens_per_sec_median": sorted(rates)[len(rates) // 2] if rates else None,
    }


def evaluate(check: Check) -> dict:
    """``minigpt evaluate --json`` of the trained run's best checkpoint: its logged val loss
    back."""
    run = check.record["steps"]["train"]["result"]["run"]
    return json.loads(minigpt(check, "evaluate", "evaluate", "--run", run, "--json", limit=120))


def generate_cli(check: Check) -> dict:
    """``minigpt generate`` (greedy, the default compile: on for CUDA) from the trained run: a
    sample."""
    run = check.record["steps"]["train"]["result"]["run"]
    n = check.size["decode_tokens"][0]
    text = minigpt(
        check,
        "generate",
        "generate",
        "--run",
        run,
        "--checkpoint",
        "last",
        "--temperature",
        "0",
        "--max-new-tokens",
        str(n),
        "--no-stream",
        limit=180,
    )
    return {"max_new_tokens": n, "text": text}


def decoding(check: Check) -> dict:
    """Compiled against eager greedy decoding at batch 1 and 8, through ``minigpt_cli.generate``."""
    run = check.record["steps"]["train"]["result"]["run"]
    device = "cuda" if check.mode == "cuda" else "cpu"
    return {f"batch_{b}": compare_decoding(Path(run), device, b, check) for b in (1, 8)}


def compare_decoding(run: Path, device: str, batch: int, check: Check) -> dict:
    """Tokens/s of each path from two lengths, after an untimed call that compiles (the difference
    of the two timed calls cancels loading the run and building the decoder), and how far the
    compiled tokens agree with the eager ones."""
    from minigpt_cli import generate, load_run

    short, long = check.size["decode_tokens"]
    texts, rates, seconds = {}, {}, {}
    for path, compile in (("eager", False), ("compiled", True)):
        timed = {}
        for i, n in enumerate((short, short, long)):
            sample = {"prompt": "\n", "max_new_tokens": n, "temperature": 0.0, "num_samples": batch}
            t = time.perf_counter()
            out = generate(run, sample, checkpoint="last", device=device, compile=compile)
            if i:  # the first call warms up (on CUDA: compiles and records the graphs)
                timed[n] = time.perf_counter() - t
        texts[path], seconds[path] = out, timed
        extra = timed[long] - timed[short]
        rates[path] = batch * (long - short) / extra if extra > 0 else None
    loaded = load_run(run, "last", device)
    tok = loaded.tokenizer
    eager = [tok.encode(t) for t in texts["eager"]]
    compiled = [tok.encode(t) for t in texts["compiled"]]
    pairs = [(a, b) for e, c in zip(eager, compiled) for a, b in zip(e, c)]
    firsts = [
        next((i for i, (a, b) in enumerate(zip(e, c)) if a != b), None)
        for e, c in zip(eager, compiled)
    ]
    return {
        "tokens_per_sec": rates,
        "seconds": seconds,
        "compiled_over_eager": rates["compiled"] / rates["eager"] if all(rates.values()) else None,
        "max_new_tokens": long,
        "equal_token_share": sum(a == b for a, b in pairs) / len(pairs),
        "first_difference": min((f for f in firsts if f is not None), default=None),
        "max_logit_difference": logit_difference(loaded, eager[0]),
    }


def logit_difference(loaded, ids: list[int]) -> float:
    """The largest |logit| difference between the compiled and the eager forward over the eager
    greedy text's first block_size tokens (teacher-forced: both see the same tokens)."""
    import torch

    model = loaded.model
    device = next(model.parameters()).device
    x = torch.tensor([ids[: model.config.block_size]], device=device)
    with torch.no_grad():
        eager, _ = model(x)
        compiled, _ = torch.compile(model)(x)
    return float((eager.float() - compiled.float()).abs().max())


def distributed(check: Check) -> Optional[dict]:
    """A 2-process torchrun (NCCL on CUDA, gloo on the CPU) of a few steps against one process on
    the same global batch: the largest train-loss difference."""
    import torch

    if check.mode == "cuda" and torch.cuda.device_count() < 2:
        raise Skipped(f"NCCL needs a GPU per process; this machine has {torch.cuda.device_count()}")
    s = check.size
    half = s["dist_batch"] // 2
    common = [str(s["config"]), "--no-progress"]
    one = [*s["dist_sets"], f"train.batch_size={s['dist_batch']}"]
    two = [*s["dist_sets"], f"train.batch_size={half}"]
    minigpt(check, "one-process", "train", *common, "--run-name", "one", *sets(*one), limit=240)
    torchrun(check, "torchrun", 2, "train", *common, "--run-name", "two", *sets(*two), limit=240)
    curves = [
        {e["step"]: e["loss"] for e in events(check.work / "runs" / name) if e["event"] == "train"}
        for name in ("one", "two")
    ]
    steps = sorted(curves[0].keys() & curves[1].keys())
    worst = max(abs(curves[0][k] - curves[1][k]) for k in steps)
    return {
        "backend": "nccl" if check.mode == "cuda" else "gloo",
        "steps": steps,
        "max_loss_difference": worst,
        "tolerance": s["dist_tolerance"],
        "equal": worst <= s["dist_tolerance"],
    }


class Skipped(Exception):
    """A step that cannot run here; the message says why."""


STEPS: list[tuple[str, Callable[[Check], Any], tuple[str, ...]]] = [
    ("versions", versions, ()),
    ("bench", bench, ()),
    ("memory", memory, ("bench",)),
    ("train", train, ()),
    ("evaluate", evaluate, ("train",)),
    ("generate", generate_cli, ("train",)),
    ("decoding", decoding, ("train",)),
    ("distributed", distributed, ()),
]


def run_steps(check: Check) -> None:
    steps = check.record["steps"]
    for name, step, needs in STEPS:
        entry: dict[str, Any] = {}
        t = time.monotonic()
        missing = [n for n in needs if steps.get(n, {}).get("status") != "ok"]
        try:
            if missing:
                raise Skipped(f"needs {', '.join(missing)}")
            if check.left() < 5:
                raise Skipped("out of time")
            entry = {"status": "ok", "result": step(check)}
        except Skipped as exc:
            entry = {"status": "skipped", "why": str(exc)}
        except StepFailed as exc:
            entry = {"status": "failed", "error": str(exc)}
        except Exception as exc:  # a step's own bug: recorded, the other steps still run
            entry = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
            (check.out / f"{name}.traceback").write_text(traceback.format_exc())
        entry["seconds"] = round(time.monotonic() - t, 1)
        steps[name] = entry
        print(
            f"gpu-check: {name}: {entry['status']} ({entry['seconds']} s)",
            file=sys.stderr,
            flush=True,
        )
        write(check.out / "gpu-check.json", json.dumps(check.record, indent=1) + "\n")


# ----------------------------------------------------------------------------- the summary


def human_flops(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def summary(record: dict) -> str:
    """A few lines a person reads first; the JSON holds the rest."""
    steps = record["steps"]

    def ok(name: str) -> Optional[dict]:
        return steps[name]["result"] if steps.get(name, {}).get("status") == "ok" else None

    lines = [f"gpu-check, {record['mode']} mode"]
    if v := ok("versions"):
        lines.append(
            f"  {v['device']}; torch {v['torch']}, CUDA {v['cuda']}, driver {v.get('driver')}, "
            f"minigpt {v['minigpt']} ({v['commit']})"
        )
    if b := ok("bench"):
        spec = (
            f"MFU {b['mfu_spec']:.3f} against the {b['spec_peak_board']} datasheet's "
            f"{human_flops(b['spec_peak_flops'])}, "
            if b.get("spec_peak_flops")
            else "no datasheet peak for this device, "
        )
        lines.append(
            f"  bench: {b['train_tokens_per_sec']:,.0f} tokens/s, {b['ms_per_step']:.1f} ms/step; "
            f"{spec}"
            f"{b['mfu_measured']:.3f} against the measured {human_flops(b['peak_flops'])}"
        )
    if m := ok("memory"):
        lines.append(
            f"  memory: {m['measured_by']} {m['measured_bytes'] / 2**20:,.0f} MiB against "
            "count-params' "
            f"{m['estimate_bytes'] / 2**20:,.0f} MiB ({m['measured_over_estimate']:.2f}x)"
        )
    if t := ok("train"):
        reached = (
            f"val <= {t['target_val']} at {t['target_reached_at_s']:.1f} s"
            if t["target_reached_at_s"] is not None
            else f"val never <= {t['target_val']}"
        )
        lines.append(
            f"  train: {t['steps']} steps in {t['seconds']:.1f} s, best val {t['best_val']:.4f}; "
            f"{reached}"
        )
    if e := ok("evaluate"):
        lines.append(f"  evaluate: val loss {e['loss']:.4f} (logged {e.get('logged_loss')})")
    if d := ok("decoding"):
        for key, r in d.items():
            rate = {k: "n/a" if v is None else f"{v:,.0f}" for k, v in r["tokens_per_sec"].items()}
            ratio = r["compiled_over_eager"]
            first = r["first_difference"]
            lines.append(
                f"  decoding {key.replace('_', ' ')}: eager {rate['eager']} tokens/s, compiled "
                f"{rate['compiled']} ({'n/a' if ratio is None else f'{ratio:.2f}x'}); "
                "equal greedy tokens "
                f"{r['equal_token_share']:.1%} "
                f"(first difference: {'none' if first is None else first}); "
                f"max |logit difference| {r['max_logit_difference']:.2e}"
            )
    if x := ok("distributed"):
        lines.append(
            f"  torchrun, 2 processes ({x['backend']}): "
            f"max |loss difference| {x['max_loss_difference']:.2e} "
            f"over {len(x['steps'])} steps: {'equal' if x['equal'] else 'DIFFERENT'} "
            f"(tolerance {x['tolerance']:g})"
        )
    for name, entry in steps.items():
        if entry["status"] != "ok":
            lines.append(f"  {name}: {entry['status']}: {entry.get('why') or entry.get('error')}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- set-up


def write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def find_corpus() -> Optional[Path]:
    """Tiny Shakespeare: $MINIGPT_CORPUS, the checkout's data/, shared/ beside it, the tests'
    cache."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minigpt"
    places = [
        Path(os.environ["MINIGPT_CORPUS"]) if os.environ.get("MINIGPT_CORPUS") else None,
        REPO / CORPUS,
        REPO.parent / "shared" / CORPUS,
        cache / "tinyshakespeare" / "input.txt",
    ]
    return next((p for p in places if p is not None and p.is_file()), None)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), required=True)
    parser.add_argument(
        "--out", type=Path, required=True, help="Folder for gpu-check.json, summary.txt, logs."
    )
    parser.add_argument("--keep", action="store_true", help="Keep the work folder (runs/, data/).")
    args = parser.parse_args(argv)
    if (
        args.mode == "cpu"
    ):  # read when torch is imported: for this process and the commands it starts
        os.environ["TORCH_COMPILE_DISABLE"] = "1"
    if args.mode == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA GPU here; use --cpu for the CPU mode", file=sys.stderr)
            return 2
    corpus = find_corpus()
    if corpus is None:  # train would download it: a GPU machine has no network
        print(
            f"error: no Tiny Shakespeare corpus found; put it at {REPO / CORPUS} "
            "or set MINIGPT_CORPUS",
            file=sys.stderr,
        )
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    (work / CORPUS).parent.mkdir(parents=True)
    shutil.copyfile(corpus, work / CORPUS)
    check = Check(args.mode, out, work)
    t = time.monotonic()
    try:
        run_steps(check)
    finally:
        check.record["seconds"] = round(time.monotonic() - t, 1)
        write(out / "gpu-check.json", json.dumps(check.record, indent=1) + "\n")
        write(out / "summary.txt", summary(check.record))
        if args.keep:
            print(f"gpu-check: the work folder stays at {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(summary(check.record))
    # On the CPU every step must run (CI); on a GPU a step may be skipped, saying why (one GPU: no
    # NCCL).
    bad = ("failed",) if args.mode == "cuda" else ("failed", "skipped")
    return 1 if any(e["status"] in bad for e in check.record["steps"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
