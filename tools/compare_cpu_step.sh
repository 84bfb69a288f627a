#!/usr/bin/env bash
# The CPU training step of `pipeline run gpt2_synthetic.toml` against the same step as an eager
# PyTorch script (tools/eager_step.py): small-cpu, 8x128, fp32, 2 threads, random tokens. The two
# alternate, ROUNDS times, each timing STEPS steps the same way (wall time after the first step,
# over the steps after it); each round prints the load, both figures and their ratio, and the end
# the medians. The machine is shared: compare within one run, not across runs.
#
#   tools/compare_cpu_step.sh [ROUNDS]      (default 5; STEPS=30, PIPELINE_BUILD_DIR=build)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-5}
STEPS=${STEPS:-30}
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build}
PY=${PIPELINE_TORCH_PY:-${PIPELINE_CACHE:-$HOME/.cache/pipeline}/torch-2.11.0/bin/python}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pipe=() eager=()
for r in $(seq "$ROUNDS"); do
  (cd "$ROOT" && "$BUILD/tools/pipeline" run gpt2_synthetic.toml --set model.preset=small-cpu --set training.batch_size=8 \
    --set training.seq_len=128 --set training.dtype=fp32 --set run.device=cpu --set run.threads=2 \
    --set training.steps="$STEPS" --set logging.live=off --set run.dir="$TMP/r$r") >"$TMP/r$r.log" 2>&1
  p=$(tail -1 "$TMP/r$r/metrics.jsonl" | sed 's/.*"ms_per_step":\([0-9.]*\).*/\1/')
  e=$("$PY" "$ROOT/tools/eager_step.py" --preset small-cpu --batch 8 --seq 128 --threads 2 --steps $((STEPS - 1)) --warmup 1 |
      sed 's/.*threads: \([0-9.]*\) ms\/step.*/\1/')
  pipe+=("$p") eager+=("$e")
  printf 'round %d (%s): pipeline %.1f ms/step, eager %.1f ms/step, eager/pipeline %.3f\n' "$r" \
    "$(uptime | sed 's/.*load average: //')" "$p" "$e" "$(echo "$e / $p" | bc -l)"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
mp=$(median "${pipe[@]}") me=$(median "${eager[@]}")
printf 'median of %d: pipeline %.1f ms/step, eager %.1f ms/step, eager/pipeline %.3f (>= 1: the pipeline is as fast)\n' \
  "$ROUNDS" "$mp" "$me" "$(echo "$me / $mp" | bc -l)"
