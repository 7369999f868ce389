#!/usr/bin/env bash
# The GPU check (issues 7 and 19), as one short script for a machine with one CUDA GPU and no network.
#
#   bash scripts/gpu-wheels.sh            # first, on a machine with network: .gpu-wheels/
#   bash scripts/gpu-check.sh [OUT_DIR]   # then on the GPU machine, from the repository root
#
# Install, offline: the machine's python3 already holds torch (CUDA), typer, pyyaml, tqdm, requests, numpy,
# safetensors, matplotlib and tokenizers, but not pydantic. pydantic and its dependencies come from the wheels
# in $GPU_WHEELS (default .gpu-wheels), then the project is installed editable with --no-deps (its build
# backend, setuptools, from the same folder); pip never looks at an index. PYTHON names another interpreter.
#
# Then it measures:
# - `minigpt bench` on the GPU recipe (bf16 autocast, fused AdamW, flash attention via SDPA, torch.compile;
#   MFU against a bf16 2048x2048 matmul peak measured in the same run; generation tokens/s uncached, eager
#   cached, compiled and batched);
# - training configs/shakespeare.yaml with compile for 75 s of wall time, evals every 250 steps, so that
#   "val <= 1.47 within 60 s of training" can be read off metrics.jsonl (elapsed_s);
# - generation on the trained run, eager KV cache against the compiled one-token step (CUDA graphs) at
#   batch 1: tokens/s (target: compiled >= 3x eager) and whether the tokens are equal, once in-process
#   (generation.json) and once through `minigpt generate --temperature 0` (generate-*.txt, timed).
# Needs the corpus at data/tinyshakespeare/input.txt or ../shared/data/tinyshakespeare/input.txt.
set -euo pipefail
out=${1:-${OUT:-gpu-check-out}}
wheels=${GPU_WHEELS:-.gpu-wheels}
py=${PYTHON:-python3}
mkdir -p "$out" data/tinyshakespeare
if [ ! -f data/tinyshakespeare/input.txt ]; then
  cp ../shared/data/tinyshakespeare/input.txt data/tinyshakespeare/ 2>/dev/null || {
    echo "error: no corpus at data/tinyshakespeare/input.txt (bring it along)" >&2; exit 2; }
fi

# ---------------------------------------------------------------- install, offline
if [ ! -d "$wheels" ]; then
  echo "error: no wheels folder $wheels: run scripts/gpu-wheels.sh on a machine with network, bring it along" >&2
  exit 2
fi
# No index, only the folder; a system Python marked externally managed (PEP 668) takes the packages anyway.
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels" PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
"$py" -m pip --version > /dev/null 2>&1 || "$py" -m ensurepip --upgrade  # ensurepip's pip is bundled: offline
if ! "$py" -c "import pydantic" 2>/dev/null; then
  "$py" -m pip install -q "$(grep -o '"pydantic[^"]*"' pyproject.toml | tr -d '"')"
fi
# torch.compile's Inductor imports setuptools to build its C++ parts (Python 3.12+ ships without it).
"$py" -c "import setuptools" 2>/dev/null || "$py" -m pip install -q setuptools
"$py" -m pip install -q --no-deps -e .
mg=("$py" -m minigpt_cli)
"$py" -c "import minigpt_cli.generation, minigpt_cli.bench"  # every dependency imports: fails here, not later

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$py" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$out/gpu.txt"

# ---------------------------------------------------------------- bench: training, MFU, generation
"${mg[@]}" bench configs/shakespeare.yaml --iters 50 --set compile=true --set dtype=bfloat16 --json \
  | tee "$out/bench.json"

# ---------------------------------------------------------------- training: 75 s of wall time
# SIGINT saves checkpoints/last; evals every 250 steps. A new name each time: runs/ stays between calls.
run=gpu-$(date +%Y%m%d-%H%M%S)
timeout -s INT 75 "${mg[@]}" train configs/shakespeare.yaml --run-name "$run" --no-progress \
  --set compile=true --set dtype=bfloat16 --set train.eval_iters=100 2>&1 | tee "$out/train.txt" || true
grep '"eval"' "runs/$run/metrics.jsonl" | tee "$out/evals.jsonl"

# ---------------------------------------------------------------- generation: eager cache against compiled
"$py" - "runs/$run" <<'EOF' | tee "$out/generation.json"
import json, sys

import torch

from minigpt_cli import runs
from minigpt_cli.bench_generation import measure_generation
from minigpt_cli.checkpoint import load_model
from minigpt_cli.sampling import resolve_window_stride

model, cfg = load_model(runs.checkpoint_dir(sys.argv[1], runs.LAST), "cuda")
prompt = torch.zeros(1, 1, dtype=torch.long, device="cuda")
stride = resolve_window_stride(cfg.model.block_size, cfg.sample.window_stride)
n = 1000
r = measure_generation(model, prompt, n, stride, compile=True, echo=lambda m: print(m, file=sys.stderr))
print(json.dumps({"max_new_tokens": n, **r}, indent=1))
EOF
for mode in no-compile compile; do
  TIMEFORMAT="generate --$mode: %R s, start to exit"
  { time "${mg[@]}" generate --run "runs/$run" --checkpoint last --temperature 0 --max-new-tokens 1000 \
      --no-stream "--$mode" > "$out/generate-$mode.txt" 2> "$out/generate-$mode.err"; } 2>> "$out/generate-times.txt"
done
cat "$out/generate-times.txt"
if cmp -s "$out/generate-no-compile.txt" "$out/generate-compile.txt"; then
  echo "generate: the compiled and eager texts are equal" | tee -a "$out/generate-times.txt"
else
  echo "generate: the compiled and eager texts DIFFER" | tee -a "$out/generate-times.txt"
fi
