#!/usr/bin/env bash
# The issue-7 GPU check, as one short script for a machine with one CUDA GPU.
#
#   bash scripts/gpu-check.sh [OUT_DIR]
#
# Installs the project into a fresh venv (torch from the index the machine has),
# measures `minigpt bench` on the GPU recipe (bf16 autocast, fused AdamW, flash
# attention via SDPA, torch.compile; MFU against a bf16 2048x2048 matmul peak
# measured in the same run), then trains configs/shakespeare.yaml with compile
# for 75 s of wall time and prints the eval points, so "val <= 1.47 within 60 s
# of training" can be read off metrics.jsonl (elapsed_s). Needs the corpus at
# data/tinyshakespeare/input.txt or ../shared/data/tinyshakespeare/input.txt.
set -euo pipefail
out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out" data/tinyshakespeare
[ -f data/tinyshakespeare/input.txt ] || cp ../shared/data/tinyshakespeare/input.txt data/tinyshakespeare/
python -m venv .gpu-venv && . .gpu-venv/bin/activate
pip install -q -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$out/gpu.txt"
minigpt bench configs/shakespeare.yaml --iters 50 --set compile=true --set dtype=bfloat16 --json \
  | tee "$out/bench.json"
# Training: stop after 75 s of wall time (SIGINT saves checkpoints/last); evals every 250 steps.
timeout -s INT 75 minigpt train configs/shakespeare.yaml --run-name gpu --no-progress \
  --set compile=true --set dtype=bfloat16 --set train.eval_iters=100 2>&1 | tee "$out/train.txt" || true
grep '"eval"' runs/gpu/metrics.jsonl | tee "$out/evals.jsonl"
