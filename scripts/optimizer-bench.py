"""Issue 29's "Muon's step" figure: the training step under AdamW, torch.optim.Muon and BatchedMuon, in one sitting
(BENCHMARKS.md, "Muon's step").

    python scripts/optimizer-bench.py [CONFIG] [--steps 10] [--rounds 7] [--set KEY=VALUE ...] [--json]

CONFIG defaults to configs/shakespeare-cpu.yaml (its model and batch; random tokens, vocabulary 65). Each round
times every optimizer's steps in turn (minigpt_cli.bench.optimizer); the table gives the medians and the ratios
to AdamW's step. Target: Muon's step at most 1.10x AdamW's.
"""

from __future__ import annotations

import argparse
import json
import sys

from minigpt_cli.bench.optimizer import bench_optimizers, format_bench_optimizers
from minigpt_cli.config.schema import load_config
from minigpt_cli.errors import MinigptError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="configs/shakespeare-cpu.yaml")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        cfg = load_config(args.config, args.overrides)
        result = bench_optimizers(cfg, steps=args.steps, rounds=args.rounds, echo=lambda m: print(m, file=sys.stderr))
    except MinigptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_bench_optimizers(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
