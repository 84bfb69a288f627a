#!/usr/bin/env bash
# The GPU report: one command for a session that has the GPU machine (tools/device: no network
# there, torch 2.11.0+cu130 in /opt/torch/.venv). It builds against that torch, runs the `gpu`
# tests, times the model alone (bench_model, gpt2 at 16x1024 bf16, eager and CUDA graphs) and the
# whole pipeline (200 steps of gpt2.toml and of gpt2_synthetic.toml), and prints one table.
#
#   tools/gpu_report.sh fetch-debs   here, where apt works: the Debian packages the build needs
#                                    (.deb files) into .gpu_debs/, to carry to the GPU machine
#   tools/gpu_report.sh check        what is missing to run here (exit 2 and a list if anything)
#   tools/gpu_report.sh test         build + ctest -L gpu                       (~6 min)
#   tools/gpu_report.sh measure      build + benchmarks + the two runs + table  (~6 min)
#   tools/gpu_report.sh all          all of it (may exceed one 10-minute device call)
#   tools/gpu_report.sh table        the table again, from the files the last measure left
#   tools/gpu_report.sh rerun        measure again with the programs already built, no checks
#
# On the GPU machine (each call under 10 minutes; the build is reused while the machine is warm):
#   device run, carry [".gpu_debs"]:  tools/gpu_report.sh test
#   device run, carry [".gpu_debs"]:  tools/gpu_report.sh measure
# The .debs are unpacked with `dpkg -x` into .gpu_root/ (never into /) and found from there.
#
# Environment: GPU_REPORT_TORCH_PY (python with CUDA torch; default /opt/torch/.venv/bin/python3),
# GPU_REPORT_DEBS (default .gpu_debs), GPU_REPORT_PREFIX (default .gpu_root), PIPELINE_BUILD_DIR
# (default build-gpu), GPU_REPORT_OUT (default $OUT when set, else BUILD/gpu_report),
# GPU_REPORT_STEPS (default 200), GPU_REPORT_NVIDIA_SMI (default nvidia-smi), GPU_REPORT_BENCH_ARGS
# (bench_model's arguments; default gpt2 at 16x1024 bf16), GPU_REPORT_BENCH_MODES (default "eager
# cuda_graph"), GPU_REPORT_RUN_ARGS (more arguments to both runs, e.g. --set run.device=cpu: the
# CPU test of this script runs `rerun` on a tiny model with them).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${1:-all}
TORCH_PY=${GPU_REPORT_TORCH_PY:-/opt/torch/.venv/bin/python3}
DEBS=${GPU_REPORT_DEBS:-$ROOT/.gpu_debs}
PREFIX=${GPU_REPORT_PREFIX:-$ROOT/.gpu_root}
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build-gpu}
OUTDIR=${GPU_REPORT_OUT:-${OUT:-$BUILD/gpu_report}}
STEPS=${GPU_REPORT_STEPS:-200}
NVIDIA_SMI=${GPU_REPORT_NVIDIA_SMI:-nvidia-smi}
BENCH_ARGS=${GPU_REPORT_BENCH_ARGS:---preset gpt2 --batch 16 --seq 1024 --steps 20 --warmup 5 --dtype bf16}
BENCH_MODES=${GPU_REPORT_BENCH_MODES:-eager cuda_graph}
RUN_ARGS=${GPU_REPORT_RUN_ARGS:-}
ARCH=x86_64-linux-gnu

# What the build needs beyond a compiler, CMake, ninja and torch: the -dev packages of
# tools/setup.sh's list and the runtime libraries their .so links point to. pkgconf finds zstd.
DEB_PACKAGES=(libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libhwloc15 libzstd-dev libzstd1
              libtomlplusplus-dev libtomlplusplus3 libconcurrentqueue-dev doctest-dev libicu-dev libicu72
              pkgconf pkgconf-bin libpkgconf3)

say() { printf '[gpu_report] %s\n' "$*" >&2; }

usage() { sed -n '2,31p' "$0"; }

fetch_debs() {
  command -v apt-get >/dev/null || { echo "gpu_report: fetch-debs needs apt-get (run it on a Debian/Ubuntu machine with network)" >&2; exit 2; }
  mkdir -p "$DEBS"
  # apt's sandbox user may not write here; the download itself is the same.
  (cd "$DEBS" && apt-get -o APT::Sandbox::User=root download "${DEB_PACKAGES[@]}")
  say "$(find "$DEBS" -name "*.deb" | wc -l) .deb files in $DEBS (git-ignored); carry it: device run with carry [\".gpu_debs\"]"
}

# Everything that is missing, all at once; exit 2 naming it.
check() {
  local missing=()
  if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
    missing+=("an NVIDIA GPU: $NVIDIA_SMI is not on PATH (this is not the GPU machine)")
  elif ! "$NVIDIA_SMI" -L 2>/dev/null | grep -q '^GPU'; then
    missing+=("an NVIDIA GPU: $NVIDIA_SMI -L lists none")
  fi
  if [[ ! -x $TORCH_PY ]]; then
    missing+=("torch with CUDA: no python at $TORCH_PY (set GPU_REPORT_TORCH_PY)")
  elif ! "$TORCH_PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    missing+=("torch with CUDA: $TORCH_PY has no torch that sees a GPU")
  fi
  local venv_bin
  venv_bin=$(dirname "$TORCH_PY")
  command -v cmake >/dev/null 2>&1 || [[ -x $venv_bin/cmake ]] || missing+=("cmake")
  command -v ninja >/dev/null 2>&1 || [[ -x $venv_bin/ninja ]] || missing+=("ninja")
  command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || missing+=("a C++ compiler (c++ or g++)")
  command -v dpkg-deb >/dev/null 2>&1 || missing+=("dpkg-deb (to unpack the carried .debs)")
  local p absent=()
  for p in "${DEB_PACKAGES[@]}"; do compgen -G "$DEBS/${p}_*.deb" >/dev/null || absent+=("$p"); done
  ((${#absent[@]} == 0)) ||
    missing+=("Debian packages in $DEBS: ${absent[*]} (run 'tools/gpu_report.sh fetch-debs' where apt works, then carry .gpu_debs)")
  if ((${#missing[@]})); then
    echo "gpu_report: cannot run here; missing:" >&2
    for p in "${missing[@]}"; do echo "  - $p" >&2; done
    exit 2
  fi
  export PATH=$venv_bin:$PATH
}

# The .debs, unpacked into PREFIX (once), and the environment that finds them.
use_debs() {
  if [[ ! -f $PREFIX/.unpacked ]]; then
    say "unpacking ${#DEB_PACKAGES[@]} packages into $PREFIX"
    mkdir -p "$PREFIX"
    local p
    for p in "${DEB_PACKAGES[@]}"; do dpkg-deb -x "$(compgen -G "$DEBS/${p}_*.deb" | head -1)" "$PREFIX"; done
    touch "$PREFIX/.unpacked"
  fi
  export LD_LIBRARY_PATH=$PREFIX/usr/lib/$ARCH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_LIBDIR=$PREFIX/usr/lib/$ARCH/pkgconfig:$PREFIX/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
}

build() {
  local torch_dir
  torch_dir=$("$TORCH_PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "share/cmake/Torch"))')
  if [[ ! -f $BUILD/build.ninja ]]; then
    say "configuring $BUILD against $torch_dir"
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_dir" \
      -DCMAKE_PREFIX_PATH="$PREFIX/usr;$PREFIX/usr/lib/$ARCH/cmake" -DICU_ROOT="$PREFIX/usr" \
      -DPKG_CONFIG_EXECUTABLE="$PREFIX/usr/bin/pkgconf" -DPIPELINE_WERROR=OFF >"$OUTDIR/configure.log" 2>&1 ||
      { tail -30 "$OUTDIR/configure.log" >&2; exit 1; }
  fi
  say "building ($(nproc) jobs)"
  cmake --build "$BUILD" -j"$(nproc)" --target pipeline bench_model test_model_gpu test_train_gpu >"$OUTDIR/build.log" 2>&1 ||
    { tail -40 "$OUTDIR/build.log" >&2; exit 1; }
}

run_tests() {
  say "ctest -L gpu"
  local status=0
  (cd "$BUILD" && ctest -L gpu --output-on-failure) 2>&1 | tee "$OUTDIR/ctest.log" || status=$?
  grep -E 'tests passed|tests failed' "$OUTDIR/ctest.log" | tail -1 >"$BUILD/gpu_tests.txt" || true
  return $status
}

measure() {
  local mode line
  rm -f "$OUTDIR"/bench_*.result
  for mode in $BENCH_MODES; do
    say "bench_model $BENCH_ARGS ($mode)"
    local flag=""
    [[ $mode == cuda_graph ]] && flag=--cuda-graph
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
    if ! "$BUILD/tools/bench_model" $BENCH_ARGS $flag >"$OUTDIR/bench_$mode.log" 2>&1; then
      tail -20 "$OUTDIR/bench_$mode.log" >&2
      echo "gpu_report: bench_model ($mode) failed; log: $OUTDIR/bench_$mode.log" >&2
      exit 1
    fi
    cat "$OUTDIR/bench_$mode.log"
    line=$(grep '^result ' "$OUTDIR/bench_$mode.log" || true)
    [[ -n $line ]] || { echo "gpu_report: bench_model $mode printed no result line" >&2; exit 1; }
    printf '%s\n' "$line" >"$OUTDIR/bench_$mode.result"
  done
  local cfg
  for cfg in gpt2 gpt2_synthetic; do
    say "pipeline run $cfg.toml, $STEPS steps"
    rm -rf "$OUTDIR/run_$cfg"
    # shellcheck disable=SC2086  # RUN_ARGS is a list of words
    if ! (cd "$ROOT" && "$BUILD/tools/pipeline" run "$cfg.toml" --set training.steps="$STEPS" --set eval.every=0 \
      --set checkpoint.every=0 --set checkpoint.at_end=false --set logging.live=off \
      --set run.dir="$OUTDIR/run_$cfg" $RUN_ARGS) >"$OUTDIR/run_$cfg.log" 2>&1; then
      tail -20 "$OUTDIR/run_$cfg.log" >&2
      echo "gpu_report: pipeline run $cfg.toml failed; log: $OUTDIR/run_$cfg.log" >&2
      exit 1
    fi
    tail -25 "$OUTDIR/run_$cfg.log"
  done
  table | tee "$OUTDIR/gpu_report.md"
}

table() {
  local py=$TORCH_PY gpu
  [[ -x $py ]] || py=python3
  gpu=$("$NVIDIA_SMI" -L 2>/dev/null | head -1 || true)
  "$py" - "$OUTDIR" "$BUILD/gpu_tests.txt" "${gpu:-no GPU seen by $NVIDIA_SMI}" "$BENCH_ARGS" <<'EOF'
import json, os, sys
out, tests_file, gpu, bench_args = sys.argv[1:5]

def bench(mode):
    words = open(os.path.join(out, f"bench_{mode}.result")).read().split()
    return dict(w.split("=", 1) for w in words[1:])

def run(cfg):
    d = os.path.join(out, f"run_{cfg}")
    steps = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in l]
    summary = json.load(open(os.path.join(d, "stats_summary.json")))
    train = next(s for s in summary["stages"] if s["type"] == "train")
    last = steps[-1]
    return {
        "steps": last["step"],
        "tok_s": last["tokens_per_s"],
        "ms": last["ms_per_step"],
        "busy": train["device_busy_s"] / train["wall_s"] if train["wall_s"] > 0 else 0.0,
        "phases": last.get("gpu_ms", last.get("host_ms", {})),
        "verdict": summary.get("verdict", {}).get("text", ""),
    }

tests = open(tests_file).read().strip() if os.path.exists(tests_file) else "not run on this machine yet (tools/gpu_report.sh test)"
print(f"\n## GPU report: {gpu}\n")
print(f"ctest -L gpu: {tests}\n")
print(f"| bench_model {bench_args} | ms/step | tokens/s | MFU | peak memory |")
print("| --- | --- | --- | --- | --- |")
for mode in ("eager", "cuda_graph"):
    if not os.path.exists(os.path.join(out, f"bench_{mode}.result")):
        print(f"| {mode} | not run | | | |")
        continue
    b = bench(mode)
    print(f"| {mode} | {float(b['ms_per_step']):.1f} | {float(b['tokens_per_s']):,.0f} | "
          f"{100 * float(b['mfu']):.1f}% | {float(b['peak_gib']):.2f} GiB |")
rows = {cfg: run(cfg) for cfg in ("gpt2", "gpt2_synthetic")}
print()
print("| pipeline run | steps | tokens/s | ms/step | train GPU busy | last step, ms per phase | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for cfg, r in rows.items():
    phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
    print(f"| {cfg}.toml | {r['steps']} | {r['tok_s']:,.0f} | {r['ms']:.1f} | {100 * r['busy']:.0f}% | {phases} | {r['verdict']} |")
ratio = rows["gpt2"]["tok_s"] / rows["gpt2_synthetic"]["tok_s"] if rows["gpt2_synthetic"]["tok_s"] else float("nan")
print(f"\ninput-side cost: gpt2 / gpt2_synthetic tokens/s = {ratio:.3f} (goal >= 0.99)")
EOF
}

case $MODE in
  -h|--help|help) usage ;;
  fetch-debs) fetch_debs ;;
  table) table ;;
  rerun) mkdir -p "$OUTDIR"; measure ;;
  check) check; say "all present" ;;
  test|measure|all)
    check
    mkdir -p "$OUTDIR"
    use_debs
    build
    status=0
    if [[ $MODE != measure ]]; then run_tests || status=$?; fi
    if [[ $MODE != test ]]; then measure; fi
    exit $status
    ;;
  *) echo "gpu_report: unknown mode '$MODE' (fetch-debs | check | test | measure | all | table | rerun; see --help)" >&2; exit 2 ;;
esac
