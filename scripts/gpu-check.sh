#!/usr/bin/env bash
# The GPU check (issue 36): what a lent GPU's minutes are for, in one command, and a CPU mode that
# CI runs on every submission, so that the check cannot rot unseen.
#
#   bash scripts/gpu-check.sh [OUT]        # on a CUDA machine (default OUT: gpu-check-out)
#   bash scripts/gpu-check.sh --cpu OUT    # the same steps, tiny, on the CPU (CI; under 60 s)
#
# It writes OUT/gpu-check.json (every figure), OUT/summary.txt (the few lines to read first, also
# printed) and a log per step. It records torch, CUDA and driver versions; minigpt bench (MFU
# against the datasheet's peak of known GPUs and against a measured one); 75 s of
# configs/shakespeare.yaml with evals; compiled against eager greedy decoding at batch 1 and 8
# (tokens/s, the share of equal tokens, the largest logit difference); a 2-process torchrun (NCCL,
# given 2 GPUs) against one process; the CUDA allocator's peak against count-params' estimate. The
# steps are scripts/gpu_check.py's: it calls only the CLI and minigpt_cli's public API, and
# tests/test_gpu_check.py holds what it names against both.
#
# Offline install (CUDA mode, only when minigpt_cli does not import yet): the GPU machine has no
# network, and its python3 holds torch (CUDA) and most dependencies but not pydantic. pydantic and
# setuptools come from the wheels in $GPU_WHEELS (default .gpu-wheels; scripts/gpu-wheels.sh
# downloads them on a machine with network), then the project is installed editable with --no-deps.
# PYTHON names another interpreter. The corpus: data/tinyshakespeare/input.txt, ../shared/data/...,
# or $MINIGPT_CORPUS (no download).
set -euo pipefail

mode=cuda
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "error: unknown option $1; use --cpu, or --help" >&2
      exit 2
      ;;
    *)
      if [ -n "$out" ]; then
        echo "error: one OUT folder, not $out and $1" >&2
        exit 2
      fi
      out=$1
      ;;
  esac
  shift
done
out=${out:-gpu-check-out}
# mkdir's own message is raw and its status 1: a bad OUT is the caller's input, refused in one line.
if [ -e "$out" ] && [ ! -d "$out" ]; then
  echo "error: OUT $out exists and is not a folder; give a folder path (new or existing)" >&2
  exit 2
fi
if ! mkdir -p "$out" 2>/dev/null; then
  echo "error: cannot make the OUT folder $out (a part of its path is a file, or no permission);" \
    "give a folder you can write" >&2
  exit 2
fi
out=$(cd "$out" && pwd)  # absolute: the check runs from the repository root
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}

if [ "$mode" = cuda ] && ! "$py" -c "import minigpt_cli.cli, pydantic" 2>/dev/null; then
  wheels=${GPU_WHEELS:-.gpu-wheels}
  if [ ! -d "$wheels" ]; then
    echo "error: minigpt does not import and there is no wheels folder $wheels: run" \
      "scripts/gpu-wheels.sh on a machine with network and bring $wheels along" >&2
    exit 2
  fi
  # No index, only the folder; a system Python marked externally managed (PEP 668) takes them
  # anyway.
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels" PIP_BREAK_SYSTEM_PACKAGES=1
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$py" -m pip --version >/dev/null 2>&1 || "$py" -m ensurepip --upgrade  # bundled: offline
  "$py" -c "import pydantic" 2>/dev/null \
    || "$py" -m pip install -q "$(grep -o '"pydantic[^"]*"' pyproject.toml | tr -d '"')"
  # torch.compile's Inductor imports setuptools to build its C++ parts (Python 3.12+ ships without
  # it).
  "$py" -c "import setuptools" 2>/dev/null || "$py" -m pip install -q setuptools
  "$py" -m pip install -q --no-deps -e .
fi

exec "$py" scripts/gpu_check.py --mode "$mode" --out "$out"
