#!/usr/bin/env bash
# What scoring HellaSwag at every evaluation costs training: the quick start's tokens/s with
# `[eval] hellaswag` against without it, in alternating pairs of runs (the same config
# otherwise: evaluations every EVERY steps, the validation loss and sample each time). Prints each
# pair, the median pair's ratio and the load before and after. docs/eval.md reports its figures.
#
#   tools/bench_eval_cost.sh [PAIRS] [STEPS] [EVERY] [ITEMS] [HELLASWAG_JSONL]
#   defaults:                 3       100     25      100     tests/data/hellaswag/val_every50.jsonl
#
# tokens/s is the last step's (metrics.jsonl: since the first step); the evaluation of the last
# step runs after it and does not count. The run directories are made under a temporary folder
# and removed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pairs=${1:-3} steps=${2:-100} every=${3:-25} items=${4:-100}
file=${5:-$root/tests/data/hellaswag/val_every50.jsonl}
exe=$root/build/tools/pipeline
[[ -x $exe ]] || { echo "no $exe: build first (tools/setup.sh --no-run)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tokens_per_s() {  # RUN_DIR -> the last training step's tokens/s
  grep '"tokens_per_s"' "$1/metrics.jsonl" | tail -1 | sed 's/.*"tokens_per_s":\([0-9.]*\).*/\1/'
}
run() {  # NAME [--set ...]
  local dir=$tmp/$1; shift
  "$exe" run quickstart.toml --set training.steps="$steps" --set eval.every="$every" --set checkpoint.every=0 \
    --set checkpoint.at_end=false --set logging.live='"off"' --set logging.trace=false --set run.dir="\"$dir\"" "$@" \
    > "$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
  tokens_per_s "$dir"
}

echo "load before: $(uptime)"
ratios=()
for ((i = 1; i <= pairs; i++)); do
  without=$(run "without$i")
  with=$(run "with$i" --set eval.hellaswag="\"$file\"" --set eval.hellaswag_items="$items")
  ratio=$(python3 -c "print(f'{$with / $without:.4f}')")
  ratios+=("$ratio")
  echo "pair $i: without $without tokens/s, with HellaSwag ($items items at every evaluation) $with tokens/s: ratio $ratio"
done
echo "load after:  $(uptime)"
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
echo "median ratio (with / without): $median over $pairs pairs of $steps steps, evaluations every $every steps"
