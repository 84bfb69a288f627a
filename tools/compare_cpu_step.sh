#!/usr/bin/env bash
# The CPU training step of `pipeline run gpt2_synthetic.toml` against the same step as an eager
# PyTorch script (tools/eager_step.py): small-cpu, 8x128, fp32, 2 threads, random tokens. The two
# alternate, ROUNDS times, each timing STEPS steps the same way (wall time after the first step,
# over the steps after it), in two environments: as they start by default, and with the page-fault
# tax removed for both (GLIBC_TUNABLES=glibc.malloc.hugetlb=1: glibc's mmapped blocks on huge
# pages; the pipeline keeps its large blocks itself either way, model/device/cpu_block_cache.h).
# Each round prints the load, both figures and their ratio; the end, the medians per environment.
# The machine is shared: compare within one run, not across runs.
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
ENVS=(default "GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
declare -A pipe eager
for r in $(seq "$ROUNDS"); do
  for e in "${ENVS[@]}"; do
    envset=(); [[ $e != default ]] && envset=("$e")
    (cd "$ROOT" && env "${envset[@]}" "$BUILD/tools/pipeline" run gpt2_synthetic.toml --set model.preset=small-cpu \
      --set training.batch_size=8 --set training.seq_len=128 --set training.dtype=fp32 --set run.device=cpu \
      --set run.threads=2 --set training.steps="$STEPS" --set logging.live=off --set run.dir="$TMP/r$r$e") \
      >"$TMP/r$r.log" 2>&1
    p=$(tail -1 "$TMP/r$r$e/metrics.jsonl" | sed 's/.*"ms_per_step":\([0-9.]*\).*/\1/')
    q=$(env "${envset[@]}" "$PY" "$ROOT/tools/eager_step.py" --preset small-cpu --batch 8 --seq 128 --threads 2 \
        --steps $((STEPS - 1)) --warmup 1 | sed 's/.*threads: \([0-9.]*\) ms\/step.*/\1/')
    pipe[$e]+="$p " eager[$e]+="$q "
    printf 'round %d, %s (load %s): pipeline %.1f ms/step, eager %.1f ms/step, eager/pipeline %.3f\n' "$r" "$e" \
      "$(cut -d' ' -f1 /proc/loadavg)" "$p" "$q" "$(echo "$q / $p" | bc -l)"
  done
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
for e in "${ENVS[@]}"; do
  # shellcheck disable=SC2086
  mp=$(median ${pipe[$e]}) me=$(median ${eager[$e]})
  printf 'median of %d, %s: pipeline %.1f ms/step, eager %.1f ms/step, eager/pipeline %.3f (>= 1: the pipeline is as fast)\n' \
    "$ROUNDS" "$e" "$mp" "$me" "$(echo "$me / $mp" | bc -l)"
done
