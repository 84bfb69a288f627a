#!/usr/bin/env bash
# The Parquet benchmark (docs/parquet.md, "Figures"): our Parquet input side against the zstd
# text-shard input side (the same documents) in one run, the time from `pipeline run` to the first
# training step on the Parquet corpus, and the llm.c way (fineweb_reference.py: tiktoken in a pool
# of 2 processes writing .bin shards) on the same files. Everything goes under WORK (default
# /tmp/pipeline_parquet_bench), which is deleted at the end unless KEEP=1.
#
#   tools/parquet_bench/run.sh [TRIALS]      (after tools/setup.sh --no-run)
#
# Needs a Python with pyarrow==26.0.1, tiktoken and numpy: BENCH_PYTHON, default a venv made
# (once, from PyPI) at $PIPELINE_CACHE/parquet-bench. tiktoken runs offline from the project's
# own GPT-2 vocabulary (write_tiktoken_cache.py).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tools/parquet_bench
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build}
CACHE=${PIPELINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pipeline}
WORK=${WORK:-/tmp/pipeline_parquet_bench}
TRIALS=${1:-5}
PY=${BENCH_PYTHON:-$CACHE/parquet-bench/bin/python}
if ! "$PY" -c "import pyarrow, tiktoken, numpy" 2>/dev/null; then
  python3 -m venv "$CACHE/parquet-bench"
  "$CACHE/parquet-bench/bin/pip" install -q pyarrow==26.0.1 tiktoken==0.14.0 numpy==2.4.6
  PY=$CACHE/parquet-bench/bin/python
fi
cleanup() { [[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK"
say() { printf '\n== %s (%s; load: %s)\n' "$*" "$(date -u +%H:%M:%S)" "$(cut -d' ' -f1-3 /proc/loadavg)"; }

say "corpus"
"$PY" "$HERE/make_corpus.py" "$WORK/parquet" --mb ${CORPUS_MB:-520}
"$BUILD/tools/pipeline" prepare "$WORK/parquet" --out "$WORK/text" --val-fraction 0 --quiet
du -sh "$WORK/parquet" "$WORK/text"

say "input side: [0] zstd text shards, [1] Parquet (same documents), alternating trials"
"$BUILD/tools/bench_input" --dataset "$WORK/text" --dataset "$WORK/parquet" --trials "$TRIALS" --seconds 10 --warmup 2

say "pipeline run -> first training step (tiny model on the CPU, so the step itself is short)"
for data in parquet text; do
  for t in $(seq "$TRIALS"); do
    "$PY" "$HERE/first_step.py" "$BUILD/tools/pipeline" "$WORK/$data" "$WORK/run_${data}_$t"
  done
done

say "reference: llm.c's fineweb.py approach, tiktoken GPT-2 in a pool of 2 processes"
"$PY" "$HERE/write_tiktoken_cache.py" "$WORK/tiktoken"
for t in $(seq "${REF_TRIALS:-3}"); do
  rm -rf "$WORK/bin"
  TIKTOKEN_CACHE_DIR=$WORK/tiktoken "$PY" "$HERE/fineweb_reference.py" "$WORK/parquet" "$WORK/bin" --procs 2
done
say "done"
