#!/usr/bin/env bash
# Runs every shipped experiment one after another and copies each summary
# (table and plot) into experiments/results/, which EXPERIMENTS.md shows.
#
#   bash experiments/run-all.sh [NAME ...]     # default: all of them
#
# Run it from a folder where runs/ and data/ may grow (the repository root is
# fine: both are git-ignored). Each sweep resumes where a killed one stopped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(positions norm-position ffn tying norm d-ff init-depth tokenizers optimizer ns-steps schedule switches polar-express normuon cautious-wd ema batch-ramp seq-warmup)
mkdir -p "$here/results"
for name in "${names[@]}"; do
  start=$(date +%s)
  minigpt sweep "$here/$name.yaml" --no-progress > "$here/results/$name.md"
  cp "runs/$name/summary.png" "$here/results/$name.png"
  echo "$name: $(( $(date +%s) - start )) s" | tee -a "$here/results/times.txt"
done
