#!/usr/bin/env bash
# Runs the whole test suite: sets up and builds first (tools/setup.sh --no-run, incremental),
# then every CTest test. Tests labelled `gpu` report "Skipped" where there is no CUDA device.
# Extra arguments go to ctest (e.g. tools/test.sh -L unit, tools/test.sh -R test_graph).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build}
"$ROOT/tools/setup.sh" --no-run
cd "$BUILD"
ctest --output-on-failure --timeout 900 -j"$(nproc)" "$@"
