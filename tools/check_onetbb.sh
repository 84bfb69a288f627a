#!/usr/bin/env bash
# Builds the engine (graph/, the oneTBB flow graph) and its torch-free tests against a oneTBB of
# the 2022 series, and runs the tests: the admission overrides a flow-graph receiver's
# try_put_task, whose types oneTBB 2022.0 moved to another internal namespace (graph/runtime.h),
# so a build against Debian 12's 2021.8 alone says nothing about Debian 13's 2022.1 or later.
#
#   tools/check_onetbb.sh          (CI: .ci/run calls it; about 3 minutes on 2 cores, the first
#                                   time a 7 MB download)
#
# oneTBB comes from PyPI's tbb-devel wheel (headers, CMake config, and its libtbb through the
# `tbb` wheel it requires), pinned, in a venv of its own in the cache (PIPELINE_CACHE, default
# ~/.cache/pipeline), as tools/setup.sh keeps pyarrow. The build goes to build-onetbb/
# (PIPELINE_BUILD_DIR moves it) through tools/setup.sh, torch and Parquet off. The script fails
# unless the engine's objects were compiled against that oneTBB's headers, not the system's.
set -euo pipefail
TBB_VERSION=2022.3.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PIPELINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pipeline}
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build-onetbb}
VENV=$CACHE/onetbb-$TBB_VERSION
TESTS=(test_graph test_flow_graph test_engine_faults test_engine_stress)
say() { printf '\033[1m[check_onetbb]\033[0m %s\n' "$*" >&2; }
# shellcheck source=tools/pinned_venv.sh
source "$ROOT/tools/pinned_venv.sh"
start=$SECONDS

pinned_install "$VENV" onetbb "tbb-devel==$TBB_VERSION" "about 7 MB" new
TBB_CMAKE=$VENV/lib/cmake/tbb
[[ -f $TBB_CMAKE/TBBConfig.cmake ]] || { echo "check_onetbb: no TBBConfig.cmake in $TBB_CMAKE (tbb-devel's layout changed?)" >&2; exit 1; }

PIPELINE_BUILD_DIR=$BUILD PIPELINE_WITH_TORCH=OFF PIPELINE_WITH_PARQUET=OFF PIPELINE_TBB_DIR=$TBB_CMAKE \
  PIPELINE_BUILD_TARGETS="${TESTS[*]}" "$ROOT/tools/setup.sh" --no-run

# The engine's flow graph must have been compiled against this oneTBB, not /usr/include's.
used=$(ninja -C "$BUILD" -t deps | awk '/oneapi\/tbb\/flow_graph.h$/ {print $1}' | sort -u)
if [[ $used != "$VENV/include/oneapi/tbb/flow_graph.h" ]]; then
  echo "check_onetbb: the engine was compiled against ${used:-no flow_graph.h at all}, not $VENV/include" >&2
  exit 1
fi
(cd "$BUILD" && ctest --output-on-failure --timeout 600 -j"$(nproc)" -R "^($(IFS='|'; echo "${TESTS[*]}"))\$")
say "oneTBB $TBB_VERSION: the engine and ${#TESTS[@]} test programs build and pass ($(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s)"
