#!/usr/bin/env bash
# What the CPU's page-fault tax costs, and what is left of it: three workloads, each run by up to
# three programs in turn, ROUNDS times, alternating, so that the machine's drift falls on all of
# them alike. For each run: ms/step (or the whole run's seconds for eval), user and system CPU
# time, minor page faults and peak RSS, from /usr/bin/time; at the end the medians and each one's
# ratio to the first program's.
#
#   tools/compare_cpu_tax.sh [ROUNDS]     (default 3)
#
# The programs:
#   before   BEFORE_BUILD's tools (an older tree's build, e.g. a worktree of the commit before the
#            change, built with tools/setup.sh --no-run), run in that tree (BEFORE_ROOT, default
#            BEFORE_BUILD/..) on its own configs and bundled data; left out when BEFORE_BUILD is unset
#   glibc    this build with PIPELINE_CPU_ALLOC=glibc (LibTorch's allocator: the tax paid)
#   cache    this build as it runs by default (model/device/cpu_block_cache.h)
# The workloads: the quick start (STEPS steps, default 30, no evaluation), bench_model --preset
# small-cpu (8x128 fp32), and pipeline eval --val on the bundled validation split with the
# quick start's model (a checkpoint this script trains first, 10 steps).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-3}
STEPS=${STEPS:-30}
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
command -v /usr/bin/time >/dev/null || { echo "compare_cpu_tax: needs /usr/bin/time (Debian: time)" >&2; exit 2; }

programs=(glibc cache)
[[ -n ${BEFORE_BUILD:-} ]] && programs=(before "${programs[@]}")
bin_of() { [[ $1 == before ]] && echo "$BEFORE_BUILD/tools" || echo "$BUILD/tools"; }
root_of() { [[ $1 == before ]] && echo "${BEFORE_ROOT:-$BEFORE_BUILD/..}" || echo "$ROOT"; }
model_of() { [[ $1 == before ]] && echo "$TMP/model.before" || echo "$TMP/model"; }
env_of() { [[ $1 == glibc ]] && echo "PIPELINE_CPU_ALLOC=glibc" || echo "PIPELINE_CPU_ALLOC=cache"; }

# A checkpoint for eval --val, trained by each tree's own build (a checkpoint's format may differ).
for p in "${programs[@]}"; do
  [[ $p == glibc ]] && continue
  (cd "$(root_of "$p")" && "$(bin_of "$p")/pipeline" run quickstart.toml --set training.steps=10 --set eval.every=0 \
    --set logging.live=off --set run.dir="$(model_of "$p")") >/dev/null 2>&1
done

# run PROGRAM WORKLOAD ROUND: one measured run; prints "ms_per_step user sys faults rss_mb".
run() {
  local p=$1 w=$2 r=$3 bin out
  bin=$(bin_of "$p") out="$TMP/$p.$w.$r"
  case $w in
    quickstart)
      (cd "$(root_of "$p")" && env "$(env_of "$p")" /usr/bin/time -f '%U %S %R %M' -o "$out.time" "$bin/pipeline" run quickstart.toml \
        --set training.steps="$STEPS" --set eval.every=0 --set checkpoint.at_end=false --set logging.live=off \
        --set run.dir="$out.run") >"$out.log" 2>&1
      ms=$(tail -1 "$out.run/metrics.jsonl" | sed 's/.*"ms_per_step":\([0-9.]*\).*/\1/') ;;
    bench_model)
      env "$(env_of "$p")" /usr/bin/time -f '%U %S %R %M' -o "$out.time" "$bin/bench_model" --preset small-cpu \
        --batch 8 --seq 128 --device cpu --dtype fp32 --steps 20 --warmup 3 >"$out.log" 2>&1
      ms=$(grep '^result' "$out.log" | sed 's/.*ms_per_step=\([0-9.]*\).*/\1/') ;;
    eval_val)
      local t0 t1
      t0=$(date +%s.%N)
      (cd "$(root_of "$p")" && env "$(env_of "$p")" /usr/bin/time -f '%U %S %R %M' -o "$out.time" "$bin/pipeline" eval "$(model_of "$p")" \
        --val datasets/data/tinyshakespeare/text --seq-len 128 --batch-size 8) >"$out.log" 2>&1
      t1=$(date +%s.%N)
      ms=$(echo "($t1 - $t0) * 1000" | bc -l) ;;
  esac
  read -r user sys faults rss <"$out.time"
  printf '%s %s %s %s %s\n' "$ms" "$user" "$sys" "$faults" "$((rss / 1024))"
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

declare -A results
for r in $(seq "$ROUNDS"); do
  for w in quickstart bench_model eval_val; do
    for p in "${programs[@]}"; do
      line=$(run "$p" "$w" "$r")
      results[$p.$w]+="$line"$'\n'
      printf 'round %d %-11s %-6s (load %s): ms %s user %s s sys %s s faults %s rss %s MB\n' "$r" "$w" "$p" \
        "$(cut -d' ' -f1 /proc/loadavg)" $line
    done
  done
done

echo
echo "medians of $ROUNDS rounds (ms: per step; eval_val: the whole run) and ratios to ${programs[0]}:"
printf '| workload | program | ms | user s | sys s | minor faults | peak RSS MB | ms / %s |\n' "${programs[0]}"
echo '| --- | --- | --- | --- | --- | --- | --- | --- |'
for w in quickstart bench_model eval_val; do
  base=""
  for p in "${programs[@]}"; do
    cols=()
    for c in 1 2 3 4 5; do cols+=("$(median $(printf '%s' "${results[$p.$w]}" | awk -v c=$c 'NF {print $c}'))"); done
    [[ -z $base ]] && base=${cols[0]}
    printf '| %s | %s | %.1f | %.1f | %.1f | %d | %d | %.3f |\n' "$w" "$p" "${cols[0]}" "${cols[1]}" "${cols[2]}" \
      "${cols[3]}" "${cols[4]}" "$(echo "${cols[0]} / $base" | bc -l)"
  done
done
