#!/usr/bin/env bash
# Sets up everything `pipeline` needs on a Debian/Ubuntu machine, builds it, and (unless
# --no-run) runs the quick-start training job on the bundled tiny-shakespeare data.
# Idempotent: a second run installs nothing, downloads nothing and rebuilds incrementally.
#
#   tools/setup.sh            set up, build, run pipelines/quickstart.toml
#   tools/setup.sh --no-run   set up and build only (tools/test.sh uses this)
#
# Environment: PIPELINE_CACHE (default ~/.cache/pipeline) holds the pinned LibTorch (and, in
# the same venv, the pinned transformers / safetensors / tensorboard the interop tests run);
# Torch_DIR points at an existing LibTorch instead; PIPELINE_BUILD_DIR (default build);
# PIPELINE_WITH_PARQUET=OFF builds without Parquet input (otherwise pyarrow's Arrow C++ comes
# pinned into PIPELINE_CACHE too); PIPELINE_WERROR=1 turns warnings into errors (CI). For tools/test.sh's sanitizer and fuzz
# builds: PIPELINE_SANITIZE=address|thread, PIPELINE_FUZZ=1 (clang), PIPELINE_WITH_TORCH=OFF
# (no LibTorch needed), PIPELINE_BUILD_TARGETS (build only these targets), PIPELINE_TBB_DIR (the
# TBBConfig.cmake directory of another oneTBB: tools/check_onetbb.sh).
set -euo pipefail

TORCH_VERSION=2.11.0
ARROW_VERSION=26.0.1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PIPELINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pipeline}
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build}
RUN=1
for a in "$@"; do
  case $a in
    --no-run) RUN=0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
# shellcheck source=tools/pinned_venv.sh
source "$ROOT/tools/pinned_venv.sh"

# 1. Debian packages (only the missing ones; apt is not touched when all are present).
PACKAGES=(build-essential cmake ninja-build pkg-config ccache python3 python3-venv
          libtbb-dev libzstd-dev libtomlplusplus-dev libconcurrentqueue-dev doctest-dev libicu-dev
          nlohmann-json3-dev libssl-dev zlib1g-dev zstd clang libfuzzer-14-dev
          libgloo-dev      # gloo's headers, for c10d's Gloo backend (its code is in LibTorch)
          libprotobuf-dev protobuf-compiler libisal-dev  # TensorBoard event files: protobuf, CRC-32C
          libcpp-httplib-dev  # the live server (pipeline run --serve)
          chromium         # headless, for the live page's browser test (test_live_browser)
          slurm-wlm munge  # a two-node Slurm on this machine, for tests/test_slurm (tests/slurm/cluster.sh)
          libxxhash-dev)   # xxHash, the 64-bit hash of a training row (datasets/order/row_hash.h)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# 2. LibTorch from PyPI's torch wheel, pinned, in a cache outside the checkout so every clone
#    reuses it. The wheel carries headers, libraries and TorchConfig.cmake.
WITH_TORCH=${PIPELINE_WITH_TORCH:-ON}
if [[ $WITH_TORCH == OFF ]]; then
  Torch_DIR=""
  TORCH_PY=""
elif [[ -z ${Torch_DIR:-} ]]; then
  VENV=$CACHE/torch-$TORCH_VERSION
  PY=$VENV/bin/python
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
    say "installing torch==$TORCH_VERSION into $VENV (once; about 4 GB with its CUDA libraries)"
    mkdir -p "$CACHE"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$PY" -m pip install -q --no-cache-dir --upgrade pip >&2
    "$PY" -m pip install -q --no-cache-dir "torch==$TORCH_VERSION" numpy >&2
  fi
  # The tools tests/test_interop checks against, pinned, in the same venv (they import torch).
  # A stamp records what was installed, so a second run neither downloads nor asks pip anything.
  # (torch named too, so that pip keeps it at its pin.)
  pinned_install "$VENV" interop "transformers==5.23.0 safetensors==0.8.0 tensorboard==2.21.0 torch==$TORCH_VERSION" \
    "for the interop tests"
  # The reference parser test_live_prometheus checks /metrics with.
  pinned_install "$VENV" prometheus "prometheus-client==0.26.0" "for the /metrics test"
  Torch_DIR=$("$PY" -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'share/cmake/Torch'))")
  TORCH_PY=$PY
else
  TORCH_PY=$(command -v python3)
fi

# 2b. Arrow C++ and Parquet from PyPI's pyarrow wheel (headers and libraries inside), pinned, in a
#     venv of its own so the torch-free builds get it without LibTorch. Its python writes the
#     tests' Parquet files.
WITH_PARQUET=${PIPELINE_WITH_PARQUET:-ON}
if [[ $WITH_PARQUET == ON ]]; then
  ARROW_VENV=$CACHE/arrow-$ARROW_VERSION
  ARROW_PY=$ARROW_VENV/bin/python
  pinned_install "$ARROW_VENV" arrow "pyarrow==$ARROW_VERSION" "about 200 MB" new
  ARROW_DIR=$("$ARROW_PY" -c "import pyarrow, os; print(os.path.dirname(pyarrow.__file__))")
fi

# 3. Configure once, then build incrementally. ccache makes rebuilds of fresh clones cheap;
#    the sloppiness settings let it cache translation units that use precompiled headers.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
# Paths relative to the checkout and no working directory in the hash: a fresh clone elsewhere
# reuses what an earlier clone compiled.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
WERROR=OFF; [[ ${PIPELINE_WERROR:-0} == 1 ]] && WERROR=ON
FUZZ=OFF; [[ ${PIPELINE_FUZZ:-0} == 1 ]] && FUZZ=ON
ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPIPELINE_WERROR=$WERROR -DPIPELINE_WITH_TORCH=$WITH_TORCH
      -DPIPELINE_SANITIZE=${PIPELINE_SANITIZE:-} -DPIPELINE_FUZZ=$FUZZ)
ARGS+=(-DPIPELINE_WITH_PARQUET=$WITH_PARQUET)
[[ $WITH_PARQUET == ON ]] && ARGS+=(-DPIPELINE_ARROW_DIR="$ARROW_DIR" -DPIPELINE_ARROW_PYTHON="$ARROW_PY")
[[ $WITH_TORCH == ON ]] && ARGS+=(-DTorch_DIR="$Torch_DIR" -DPIPELINE_TORCH_PYTHON="$TORCH_PY")
# TSan needs a oneTBB built with it (see tools/build_tsan_tbb.sh), cached like LibTorch.
if [[ ${PIPELINE_SANITIZE:-} == thread ]]; then
  TSAN_TBB=$CACHE/onetbb-$(dpkg-query -W -f='${Version}' libtbb-dev)-tsan
  "$ROOT/tools/build_tsan_tbb.sh" "$TSAN_TBB"
  ARGS+=(-DTBB_DIR="$TSAN_TBB/lib/cmake/TBB")
fi
# Another oneTBB than the system's (tools/check_onetbb.sh: PyPI's tbb-devel of the 2022 series).
[[ -n ${PIPELINE_TBB_DIR:-} ]] && ARGS+=(-DTBB_DIR="$PIPELINE_TBB_DIR")
# libFuzzer comes with clang; the other builds use the default compiler (the one LibTorch was built with).
[[ $FUZZ == ON ]] && ARGS+=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
if [[ ! -f $BUILD/build.ninja ]] || [[ "$(cat "$BUILD/.configure-args" 2>/dev/null)" != "${ARGS[*]}" ]]; then
  say "configuring $BUILD"
  rm -f "$BUILD/CMakeCache.txt"  # a changed compiler or option set starts from a clean cache
  cmake -S "$ROOT" -B "$BUILD" "${ARGS[@]}" >/dev/null
  echo "${ARGS[*]}" > "$BUILD/.configure-args"
fi
TARGETS=(${PIPELINE_BUILD_TARGETS:-all})
say "building ${TARGETS[*]} in $BUILD ($(nproc) jobs)"
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}"

# 4. The main job on the bundled data.
if ((RUN)); then
  say "running: pipeline run quickstart.toml"
  cd "$ROOT"
  exec "$BUILD/tools/pipeline" run quickstart.toml
fi
