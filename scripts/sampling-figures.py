"""Issue 19's CPU figures for sampling, in one sitting (BENCHMARKS.md, "Faster sampling").

    python scripts/sampling-figures.py RUN [--reps 3] [--only batch,startup,bf16,compile]

RUN is a run folder of configs/shakespeare.yaml's architecture (a few training steps are enough for
timing; a few dozen make the bfloat16 agreement meaningful). Each part alternates what it compares,
so that a machine
whose speed drifts affects both sides alike:

- batch: `minigpt generate --run RUN --max-new-tokens 500` with --num-samples 1 and 8, whole
  process, and the same with --max-new-tokens 1 as the start-up; tokens/s = samples x 499 / (wall -
  start-up), and the ratio (target >= 4; the ratio with the start-up left in is printed beside it);
- startup: `python -c "import torch"` against `minigpt generate --run RUN --max-new-tokens 200`,
  start to exit (target: within 1.5x);
- bf16: float32 against bfloat16 weights in one process: greedy tokens/s over 500 tokens, where the
  greedy texts part, and the teacher-forced argmax agreement over 2,048 positions of the corpus's
  last 20,000 chars;
- compile: bench's generation figures with the compiled step (bench_generation.measure_generation),
  twice.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def median_line(name: str, values: list[float], unit: str) -> str:
    return f"{name}: median {statistics.median(values):.2f} {unit} ({', '.join(f'{v:.2f}' for v in values)})"


def batch(run: str, reps: int) -> None:
    """Whole commands, as a user times them; a 1-token command of the same --num-samples is the
    start-up (loading, the prompt) and is subtracted, so the ratio is the decoding's own (issue 29's
    measure)."""
    walls: dict[tuple[int, int], list[float]] = {(n, t): [] for n in (1, 8) for t in (1, 500)}
    for _ in range(reps):
        for n, t in walls:
            walls[n, t].append(
                timed(
                    [
                        "minigpt",
                        "generate",
                        "--run",
                        run,
                        "--max-new-tokens",
                        str(t),
                        "--num-samples",
                        str(n),
                    ]
                )
            )
    # The start-up is the same work for 1 and 8 samples (loading; a 1-token prompt): the median of
    # all the 1-token commands, which is steadier than either half (a 0.2 s wobble in it is 10% of
    # one sample's decoding).
    start = statistics.median(walls[1, 1] + walls[8, 1])
    speeds = {}
    for n in (1, 8):
        whole = statistics.median(walls[n, 500])
        speeds[n] = n * 499 / (whole - start)
        print(median_line(f"--num-samples {n}, 500 tokens", walls[n, 500], "s"))
        print(median_line(f"--num-samples {n}, 1 token", walls[n, 1], "s"))
        print(
            f"--num-samples {n}: {speeds[n]:.1f} tokens/s after the start-up ({n * 500 / whole:.1f} with it)"
        )
    print(f"start-up (median of the 1-token commands) {start:.2f} s")
    print(
        f"batch ratio {speeds[8] / speeds[1]:.2f} after the start-up "
        f"({8 * statistics.median(walls[1, 500]) / statistics.median(walls[8, 500]):.2f} with it)"
    )


def startup(run: str, reps: int) -> None:
    cmds = {
        "import torch": [sys.executable, "-c", "import torch"],
        "generate 200": ["minigpt", "generate", "--run", run, "--max-new-tokens", "200"],
    }
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(reps):
        for k, cmd in cmds.items():
            walls[k].append(timed(cmd))
    for k, v in walls.items():
        print(median_line(k, v, "s"))
    print(
        f"start-to-exit ratio {statistics.median(walls['generate 200']) / statistics.median(walls['import torch']):.2f}"
    )


def load(run: str):
    from minigpt_cli.run import folder as runs
    from minigpt_cli.run.checkpoint import load_model
    from minigpt_cli.runtime.kernels import onednn
    from minigpt_cli.tokenizer.kinds import load_run_tokenizer

    model, cfg = load_model(runs.checkpoint_dir(run, runs.LAST))
    onednn.swap_linears(model)  # as generate does
    return model, cfg, load_run_tokenizer(Path(run), cfg)


def bf16(run: str, reps: int) -> None:
    import torch

    from minigpt_cli.sample.sampling import generate_tokens

    m32, cfg, tok = load(run)
    m16 = copy.deepcopy(m32).to(torch.bfloat16)
    prompt = torch.tensor([tok.encode("\n")])

    def greedy(model, n=500):
        list(generate_tokens(model, prompt, 8, 0.0))
        t = time.perf_counter()
        ids = torch.stack(list(generate_tokens(model, prompt, n, 0.0)), 1)
        return n / (time.perf_counter() - t), ids

    for _ in range(reps):
        (a, ia), (b, ib) = greedy(m32), greedy(m16)
        part = (ia != ib).nonzero()
        print(
            f"float32 {a:.0f} tokens/s, bfloat16 {b:.0f} ({b / a:.2f}x); greedy texts equal for "
            f"{int(part[0, 1]) if len(part) else ia.size(1)} of {ia.size(1)} tokens"
        )
    corpus = Path(cfg.data.data_dir) / "tinyshakespeare" / "input.txt"
    ids = torch.tensor([tok.encode(corpus.read_text(encoding="utf-8")[-20000:])[:2048]])
    T, agree, worst = cfg.model.block_size, 0, 0.0
    with torch.no_grad():
        for s in range(0, ids.size(1) - T + 1, T):
            a, b = m32(ids[:, s : s + T])[0], m16(ids[:, s : s + T])[0].float()
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            worst = max(worst, float((a - b).abs().max()))
    print(
        f"teacher-forced argmax agreement {agree}/{ids.size(1)} = {agree / ids.size(1):.3f}; "
        f"largest logit difference {worst:.3f}"
    )


def compiled(run: str, reps: int) -> None:
    import torch

    from minigpt_cli.bench.generation import measure_generation
    from minigpt_cli.sample.sampling import resolve_window_stride

    model, cfg, _ = load(run)
    stride = resolve_window_stride(cfg.model.block_size, cfg.sample.window_stride)
    for _ in range(reps):
        r = measure_generation(
            model,
            torch.zeros(1, 1, dtype=torch.long),
            500,
            stride,
            compile=True,
            echo=lambda m: None,
        )
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default="batch,startup,bf16,compile")
    args = parser.parse_args()
    parts = {"batch": batch, "startup": startup, "bf16": bf16, "compile": compiled}
    for name in args.only.split(","):
        print(f"== {name} (load average {os.getloadavg()[0]:.1f})", flush=True)
        parts[name](args.run, args.reps if name != "compile" else 2)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
