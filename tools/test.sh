#!/usr/bin/env bash
# Runs the test suite: sets up and builds first (tools/setup.sh --no-run, incremental), then
# every CTest test. Tests labelled `gpu` report "Skipped" where there is no CUDA device.
#
#   tools/test.sh [CTEST ARGS]              build/: everything, every test
#   tools/test.sh --sanitize address [...]  build-asan/: ASan + UBSan, every test (with
#                                           PIPELINE_WITH_TORCH=OFF: the torch-free parts only,
#                                           as CI runs it)
#   tools/test.sh --sanitize thread [...]   build-tsan/: TSan, the torch-free parts (graph/,
#                                           datasets/ and their tests, the engine included)
#   tools/test.sh --fuzz [SECONDS]          build-fuzz/: clang + libFuzzer; runs each target in
#                                           tests/fuzz for SECONDS (default 60) from its seeds
#
# Extra arguments go to ctest (e.g. tools/test.sh -L unit, tools/test.sh -R test_graph).
# Sanitizer reports are fatal; the only suppressions are for third-party code, each with its
# reason, in tools/sanitizers/. Each mode has its own build directory and shares ccache.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=plain
FUZZ_SECONDS=60
case ${1:-} in
  --sanitize)
    MODE=${2:-}
    [[ $MODE == address || $MODE == thread ]] || { echo "test.sh: --sanitize takes address or thread" >&2; exit 2; }
    shift 2 ;;
  --fuzz)
    MODE=fuzz
    shift
    if [[ ${1:-} =~ ^[0-9]+$ ]]; then FUZZ_SECONDS=$1; shift; fi ;;
  -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
esac

SUPP=$ROOT/tools/sanitizers
case $MODE in
  plain)
    BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build} ;;
  address)
    BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build-asan}
    export PIPELINE_SANITIZE=address
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:strict_init_order=1}
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SUPP/lsan.supp:print_suppressions=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp} ;;
  thread)
    BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build-tsan}
    export PIPELINE_SANITIZE=thread PIPELINE_WITH_TORCH=OFF
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp} ;;
  fuzz)
    BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build-fuzz}
    export PIPELINE_FUZZ=1 PIPELINE_WITH_TORCH=OFF PIPELINE_BUILD_TARGETS=fuzzers
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} ;;
esac
export PIPELINE_BUILD_DIR=$BUILD
"$ROOT/tools/setup.sh" --no-run

if [[ $MODE != fuzz ]]; then
  cd "$BUILD"
  exec ctest --output-on-failure --timeout 900 -j"$(nproc)" "$@"
fi

# Fuzzing: each target starts from a copy of its committed seeds (new inputs it finds go to
# build-fuzz/corpus/, crashes to build-fuzz/crashes/) and fails the run on any finding.
# The targets run side by side, as many at once as there are cores.
fuzz_one() {
  local name=$1 seeds=$2 corpus=$BUILD/corpus/$1
  mkdir -p "$corpus" "$BUILD/crashes"
  "$BUILD/tests/fuzz/$name" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$BUILD/crashes/$name-" "$corpus" "$seeds" 2>"$BUILD/$name.log"
}
failed=()
declare -A running=()  # pid -> target
reap() {  # waits for one target to end and reports it
  local pid name
  wait -n -p pid "${!running[@]}" && status=0 || status=$?
  name=${running[$pid]}
  unset "running[$pid]"
  if ((status != 0)); then
    failed+=("$name")
    tail -40 "$BUILD/$name.log" >&2
  fi
  echo "== $name: $(grep -E "^stat::number_of_executed_units|^#[0-9]+ +DONE" "$BUILD/$name.log" | tr '\n' ' ')" >&2
}
for seeds in "$ROOT"/tests/fuzz/corpus/*/; do
  name=$(basename "$seeds")
  if [[ ! -x $BUILD/tests/fuzz/$name ]]; then  # fuzz_parquet without PIPELINE_WITH_PARQUET
    echo "== $name: not built in this configuration, skipped" >&2
    continue
  fi
  while ((${#running[@]} >= $(nproc))); do reap; done
  echo "== $name: ${FUZZ_SECONDS}s from $(ls "$seeds" | wc -l) seeds" >&2
  fuzz_one "$name" "$seeds" &
  running[$!]=$name
done
while ((${#running[@]})); do reap; done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (inputs in $BUILD/crashes/)" >&2
  exit 1
fi
echo "fuzz: $(ls "$ROOT"/tests/fuzz/corpus | wc -l) targets, no findings" >&2
