#!/usr/bin/env bash
# The GPU report: one command for a session that has the GPU machine (tools/device: no network
# there, torch 2.11.0+cu130 in /opt/torch/.venv). It builds against that torch, runs the `gpu`
# tests, times the model alone (bench_model, gpt2 at 16x1024 bf16, eager and CUDA graphs) and the
# whole pipeline (gpt2.toml and gpt2_synthetic.toml), and writes one table.
#
#   tools/gpu_report.sh packages [--check|--write]
#                         here, after a build: the Debian packages that build used (ninja's
#                         dependency log, the libraries it linked and its binaries load, the tools
#                         it ran), mapped with dpkg -S; --check fails naming those missing from
#                         tools/gpu_report.debs, --write rewrites that list
#   tools/gpu_report.sh fetch-debs   here, where apt works: the listed packages' .debs into
#                         .gpu_debs/, to carry to the GPU machine
#   tools/gpu_report.sh check        what is missing (exit 2 and a list if anything); then the
#                         real configure step against the unpacked packages, with the system's
#                         own /usr left out of CMake's search (exit 1 and the log if it fails)
#   tools/gpu_report.sh all          check, build, ctest -L gpu, measure, table: one 10-minute call
#   tools/gpu_report.sh test         check, build, ctest -L gpu
#   tools/gpu_report.sh measure      check, build, benchmarks, the two runs, table
#   tools/gpu_report.sh table        the table again, from what the last run left
#   tools/gpu_report.sh exec CMD...  CMD with the unpacked packages' libraries on the loader's path
#                         (build-gpu/tools/pipeline run ...: the executables find their own
#                         libraries, not what those load in turn, such as ICU's data library)
#   tools/gpu_report.sh rerun        measure again with the programs already built, no checks
#   tools/gpu_report.sh profile      check, build bench_model, then the same step profiled in
#                         bench_model and in PyTorch (tools/eager_step.py), both on
#                         GPU_REPORT_BENCH_ARGS: profile.md, the GPU time per kind of kernel side
#                         by side (tools/kernel_table.py), and both traces gzipped. At 64x1024:
#                         GPU_REPORT_BENCH_ARGS="--preset gpt2 --batch 64 --seq 1024 --steps 10
#                         --warmup 3 --dtype bf16" tools/gpu_report.sh profile
#   tools/gpu_report.sh scale        check, build bench_model, then the scale sweep (GPU_REPORT_SCALE_ROWS):
#                         gpt2 at 16, 32 and 64 x 1024, and gpt2-medium, -large and -xl at the
#                         largest micro-batch that fits (bench_model --fit-batch), without and with
#                         recompute, each row beside tools/eager_step.py eager and compiled on the
#                         same arguments; scale.md: ms/step, tokens/s, MFU and peak memory. Rows
#                         already measured are kept: a second call (same warm machine) measures the
#                         rows the first had no time for (GPU_REPORT_SCALE_FRESH=1 starts over)
#
# On the GPU machine (one call, nothing cached; the build takes most of it):
#   device run, carry [".gpu_debs"]:  tools/gpu_report.sh all
# Its files come back from $OUT: at most 8 (gpu_report.md with the table and the ctest summary,
# build.log, ctest.log, bench.log, run_gpt2.log, run_gpt2_synthetic.log, nvidia-smi.txt). The
# .debs are unpacked with `dpkg -x` into .gpu_root/ (never into /) and found from there.
#
# Environment: GPU_REPORT_TORCH_PY (python with CUDA torch; default /opt/torch/.venv/bin/python3),
# GPU_REPORT_DEBS (default .gpu_debs), GPU_REPORT_PREFIX (default .gpu_root), PIPELINE_BUILD_DIR
# (default build-gpu; build for `packages`), GPU_REPORT_OUT (the report's folder; default $OUT
# when set, else BUILD/gpu_report), GPU_REPORT_STEPS (steps of each run, default 150),
# GPU_REPORT_BUDGET_S (seconds the whole call may take, default 570: a phase that no longer fits
# is skipped and says so in the table), GPU_REPORT_RESERVE_S (seconds of that budget the tests
# leave to the measurements, default 240), GPU_REPORT_JOBS (build jobs, default nproc),
# GPU_REPORT_SCALE_SEQ (default 1024), GPU_REPORT_SCALE_DTYPE (default bf16),
# GPU_REPORT_SCALE_PYTORCH_MODES (default "eager compile"), GPU_REPORT_SCALE_ARGS (more arguments to
# bench_model and tools/eager_step.py in every row, such as --sdpa cudnn; with
# GPU_REPORT_SCALE_FRESH=1, since kept rows do not know them),
# GPU_REPORT_NVIDIA_SMI (default nvidia-smi), GPU_REPORT_NVCC (the CUDA compiler the fused loss needs;
# default: nvcc on PATH, $CUDACXX, or /usr/local/cuda/bin/nvcc), GPU_REPORT_MULTIARCH (the Debian
# multiarch triplet of the unpacked libraries; default this machine's, e.g. x86_64-linux-gnu or
# aarch64-linux-gnu), GPU_REPORT_SCALE_ROWS, GPU_REPORT_SCALE_FRESH, GPU_REPORT_SCALE_STEPS (timed
# steps of each scale row, default 10), GPU_REPORT_BENCH_ARGS (bench_model's arguments;
# default gpt2 at 16x1024 bf16), GPU_REPORT_BENCH_MODES (default "eager cuda_graph"),
# GPU_REPORT_RUN_ARGS (more arguments to both runs), GPU_REPORT_PYTORCH_MODES (PyTorch's step on
# bench_model's arguments, tools/eager_step.py, after the runs; default "eager compile", "" for
# none), GPU_REPORT_LIST (the package list; default
# tools/gpu_report.debs), GPU_REPORT_WORK (default BUILD/gpu_report_work), GPU_REPORT_CPU=1 (a
# CPU machine: no GPU to look for; `all` then uses the build directory as it is, with no .debs,
# and `check` configures against the .debs as on the GPU machine).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${1:-all}
TORCH_PY=${GPU_REPORT_TORCH_PY:-/opt/torch/.venv/bin/python3}
DEBS=${GPU_REPORT_DEBS:-$ROOT/.gpu_debs}
PREFIX=${GPU_REPORT_PREFIX:-$ROOT/.gpu_root}
if [[ $MODE == packages ]]; then BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build}; else BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build-gpu}; fi
OUTDIR=${GPU_REPORT_OUT:-${OUT:-$BUILD/gpu_report}}
WORK=${GPU_REPORT_WORK:-$BUILD/gpu_report_work}  # run directories and benchmark results: the table reads them, OUT gets none
STEPS=${GPU_REPORT_STEPS:-150}
BUDGET=${GPU_REPORT_BUDGET_S:-570}
JOBS=${GPU_REPORT_JOBS:-$(nproc)}
NVIDIA_SMI=${GPU_REPORT_NVIDIA_SMI:-nvidia-smi}
BENCH_ARGS=${GPU_REPORT_BENCH_ARGS:---preset gpt2 --batch 16 --seq 1024 --steps 20 --warmup 5 --dtype bf16}
BENCH_MODES=${GPU_REPORT_BENCH_MODES:-eager cuda_graph}
PYTORCH_MODES=${GPU_REPORT_PYTORCH_MODES-eager compile}
RUN_ARGS=${GPU_REPORT_RUN_ARGS:-}
CPU_MODE=${GPU_REPORT_CPU:-0}
RESERVE=${GPU_REPORT_RESERVE_S:-240}
# The multiarch directory the .debs' libraries unpack into (/usr/lib/<triplet>): this machine's.
ARCH=${GPU_REPORT_MULTIARCH:-$({ gcc -print-multiarch || c++ -print-multiarch; } 2>/dev/null | head -1)}
[[ -n $ARCH ]] || ARCH=$(uname -m)-linux-gnu
LIST=${GPU_REPORT_LIST:-$ROOT/tools/gpu_report.debs}
ORIG_PATH=$PATH  # PyTorch's phases run with the machine's own PATH and loader path, not the unpacked tree's
# gpt2 at 16, 32 and 64 x 1024; the larger presets at the largest micro-batch that fits (--fit-batch
# from the batch given), without and with recompute. PRESET:BATCH[:RECOMPUTE[:fit]] each.
SCALE_ROWS=${GPU_REPORT_SCALE_ROWS:-gpt2:16 gpt2:32 gpt2:64 gpt2-medium:64:none:fit gpt2-medium:64:mlp:fit gpt2-large:64:none:fit gpt2-large:64:mlp:fit gpt2-xl:32:none:fit gpt2-xl:32:block:fit}
SCALE_STEPS=${GPU_REPORT_SCALE_STEPS:-10}
SCALE_SEQ=${GPU_REPORT_SCALE_SEQ:-1024}
SCALE_DTYPE=${GPU_REPORT_SCALE_DTYPE:-bf16}
SCALE_PYTORCH_MODES=${GPU_REPORT_SCALE_PYTORCH_MODES-eager compile}
SCALE_ARGS=${GPU_REPORT_SCALE_ARGS:-}  # more arguments to both programs of every row (--sdpa cudnn)

# What the build needs beyond a C++ compiler, CMake, ninja and torch: tools/gpu_report.debs,
# derived from a real build by `packages --write` and checked by tests/test_gpu_report.cpp.
DEB_PACKAGES=()
while read -r p _; do [[ -n $p && $p != \#* ]] && DEB_PACKAGES+=("$p"); done <"$LIST"

say() { printf '[gpu_report] %s\n' "$*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; }
left() { echo $((BUDGET - SECONDS)); }

# ---------------------------------------------------------------------------------------------
# The package list, by construction.

# Files under the system's directories that the build in $BUILD used: every header in ninja's
# dependency log, every library and tool its build files and CMake cache name (a package's CMake
# config by the files in its directory), and what its binaries and those tools load at run time.
used_files() {
  [[ -f $BUILD/build.ninja && -f $BUILD/.ninja_deps ]] ||
    { echo "gpu_report: $BUILD is not a built ninja build directory (build first: tools/setup.sh --no-run)" >&2; exit 2; }
  local sys='^/(usr|lib|lib64|bin|sbin|etc)/'
  {
    ninja -C "$BUILD" -t deps | awk '/^ +\//{print $1}'
    grep -ohE '/(usr|lib|bin|sbin)/[^ ;:"$)]+' "$BUILD/build.ninja" "$BUILD/CMakeCache.txt" "$BUILD"/CMakeFiles/*.cmake 2>/dev/null || true
  } | grep -E "$sys" | sort -u >"$WORK/paths.txt"
  local f
  : >"$WORK/files.txt"
  while read -r f; do
    if [[ -f $f ]]; then
      echo "$f"
      [[ -L $f ]] && readlink -f "$f"  # a link's target may be another package's (pkg-config -> pkgconf)
    elif [[ -d $f && $f != /usr/include && $f != /usr/lib/$ARCH && $f != /usr/lib && $f != /usr/bin ]]; then
      find "$f" -maxdepth 1 -name '*.cmake' 2>/dev/null  # a package's CMake config directory
    fi
  done <"$WORK/paths.txt" >>"$WORK/files.txt"
  # What those CMake configs import must exist at configure time even if nothing links it
  # (TBB's names tbbmalloc's library: libtbbmalloc2).
  grep -h '\.cmake$' "$WORK/files.txt" | xargs -r grep -ohE '\$\{_IMPORT_PREFIX\}/[^" ;)]+' 2>/dev/null |
    sed 's#^\${_IMPORT_PREFIX}#/usr#' | sort -u | while read -r f; do [[ -f $f ]] && echo "$f"; done >>"$WORK/files.txt" || true
  # Run-time libraries of the binaries built.
  find "$BUILD/tools" "$BUILD/tests" -maxdepth 1 -type f -perm -u+x 2>/dev/null |
    while read -r f; do ldd "$f" 2>/dev/null | awk '$3 ~ /^\//{print $3}'; done >>"$WORK/files.txt"
  sort -u -o "$WORK/files.txt" "$WORK/files.txt"
}

# Run-time libraries of the programs the build ran (protoc, zstd, pkgconf), except those the
# compiler and the build tools bring (their packages are never listed).
program_libraries() {
  local f pkg
  grep -E '^/(usr/)?s?bin/' "$WORK/files.txt" | while read -r f; do
    pkg=$(dpkg -S "$f" 2>/dev/null | head -1 | sed 's/: .*//; s/:.*//') || true
    [[ -n $pkg ]] && ! grep -qx "$pkg" "$WORK/toolchain.txt" || continue
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\//{print $3}'
  done
}

# What a machine with a C++ compiler has anyway (g++ and everything it depends on), and the
# build tools the GPU machine brings itself (CMake and ninja from the torch venv): never listed.
toolchain_packages() {
  { apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
      --no-enhances g++ 2>/dev/null | grep -v '^ ' | grep -v '^<'
    printf '%s\n' g++ cmake cmake-data ninja-build ccache make
    # and what every Debian system has (essential and required packages: coreutils, libc6, ...)
    dpkg-query -W -f='${Package} ${Essential} ${Priority}\n' | awk '$2 == "yes" || $3 == "required" {print $1}'
  } | sed 's/:.*//' | sort -u
}

# dpkg -S over many files: "package" lines, one per package. Merged /usr: dpkg knows a library
# as /lib/X or as /usr/lib/X depending on the package, so a path it does not know is asked again
# the other way.
owners() {
  local unknown
  xargs -r dpkg -S <"$WORK/files.txt" 2>"$WORK/dpkg.err" | sed 's/: .*//' | tr ',' '\n' | sed 's/^ *//; s/:.*//' >"$WORK/owners.txt" || true
  unknown=$(sed -n 's/^dpkg-query: no path found matching pattern //p' "$WORK/dpkg.err" | sed 's#^/usr/#/#; t; s#^/#/usr/#' || true)
  if [[ -n $unknown ]]; then
    printf '%s\n' $unknown | xargs -r dpkg -S 2>/dev/null | sed 's/: .*//' | tr ',' '\n' | sed 's/^ *//; s/:.*//' >>"$WORK/owners.txt" || true
  fi
  sort -u "$WORK/owners.txt"
}

packages() {
  command -v dpkg >/dev/null && command -v ninja >/dev/null ||
    { echo "gpu_report: packages needs dpkg and ninja (a Debian machine with the build)" >&2; exit 2; }
  mkdir -p "$WORK"
  # GPU_REPORT_REUSE=1: what the last derivation found (a test checks two lists against one build).
  if [[ ${GPU_REPORT_REUSE:-0} != 1 || ! -s $WORK/needed.txt ]]; then
    toolchain_packages >"$WORK/toolchain.txt"
    used_files
    program_libraries >>"$WORK/files.txt"
    sort -u -o "$WORK/files.txt" "$WORK/files.txt"
    owners >"$WORK/used.txt"
    # Libraries are needed whoever else would bring them: CMake is told to find them in the
    # unpacked tree, where a -dev package's libfoo.so links to its runtime package's file. Only
    # the compiler's own run-time libraries (its sanitizers' too) are left to the machine's compiler.
    grep -E '\.so(\.[0-9]+)*$' "$WORK/files.txt" >"$WORK/libs.txt" || true
    cp "$WORK/files.txt" "$WORK/all_files.txt"
    cp "$WORK/libs.txt" "$WORK/files.txt"
    owners | grep -vE '^(libc6|libc6-dev|libstdc\+\+.*|libgcc.*|libgomp.*|libatomic.*|libquadmath.*|libcrypt.*|linux-libc-dev|lib(a|t|ub|l|hwa)san[0-9]*)$' \
      >"$WORK/lib_owners.txt" || true
    mv "$WORK/all_files.txt" "$WORK/files.txt"
    { comm -23 "$WORK/used.txt" "$WORK/toolchain.txt"; cat "$WORK/lib_owners.txt"; } | sort -u >"$WORK/needed.txt"
  fi
  case ${1:-} in
    --write)
      { echo "# The Debian packages whose files the build uses (headers, libraries, tools, run-time libraries),"
        echo "# beyond a C++ compiler, CMake and ninja: written by 'tools/gpu_report.sh packages --write' from"
        echo "# a build; tests/test_gpu_report.cpp fails when the build uses a package missing here."
        cat "$WORK/needed.txt"
      } >"$LIST"
      say "$(wc -l <"$WORK/needed.txt") packages written to $LIST" ;;
    --check)
      printf '%s\n' "${DEB_PACKAGES[@]}" | sort -u >"$WORK/listed.txt"
      local missing
      missing=$(comm -23 "$WORK/needed.txt" "$WORK/listed.txt")
      if [[ -n $missing ]]; then
        echo "gpu_report: the build in $BUILD uses files of packages that tools/gpu_report.debs does not list:" >&2
        local p
        for p in $missing; do
          echo "  - $p (e.g. $(dpkg -L "$p" 2>/dev/null | grep -Fx -f "$WORK/files.txt" | head -1 || true))" >&2
        done
        echo "add them (tools/gpu_report.sh packages --write), or the GPU machine's configure or build fails" >&2
        exit 1
      fi
      say "all $(wc -l <"$WORK/needed.txt") packages the build in $BUILD uses are listed" ;;
    *) cat "$WORK/needed.txt" ;;
  esac
}

fetch_debs() {
  command -v apt-get >/dev/null || { echo "gpu_report: fetch-debs needs apt-get (run it on a Debian/Ubuntu machine with network)" >&2; exit 2; }
  mkdir -p "$DEBS"
  # apt's sandbox user may not write here; the download itself is the same.
  (cd "$DEBS" && apt-get -o APT::Sandbox::User=root download "${DEB_PACKAGES[@]}")
  say "$(find "$DEBS" -name "*.deb" | wc -l) .deb files in $DEBS (git-ignored); carry it: device run with carry [\".gpu_debs\"]"
}

# ---------------------------------------------------------------------------------------------
# On the GPU machine.

# Everything that is missing, all at once; exit 2 naming it.
check_present() {
  local missing=()
  if [[ $CPU_MODE == 1 ]]; then
    :  # the CPU test: no GPU to look for
  elif ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
    missing+=("an NVIDIA GPU: $NVIDIA_SMI is not on PATH (this is not the GPU machine)")
  elif ! "$NVIDIA_SMI" -L 2>/dev/null | grep -q '^GPU'; then
    missing+=("an NVIDIA GPU: $NVIDIA_SMI -L lists none")
  fi
  if [[ ! -x $TORCH_PY ]]; then
    missing+=("torch with CUDA: no python at $TORCH_PY (set GPU_REPORT_TORCH_PY)")
  elif [[ $CPU_MODE != 1 ]] && ! "$TORCH_PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    missing+=("torch with CUDA: $TORCH_PY has no torch that sees a GPU")
  fi
  local venv_bin
  venv_bin=$(dirname "$TORCH_PY")
  command -v cmake >/dev/null 2>&1 || [[ -x $venv_bin/cmake ]] || missing+=("cmake")
  command -v ninja >/dev/null 2>&1 || [[ -x $venv_bin/ninja ]] || missing+=("ninja")
  command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || missing+=("a C++ compiler (c++ or g++)")
  command -v dpkg-deb >/dev/null 2>&1 || missing+=("dpkg-deb (to unpack the carried .debs)")
  local p absent=() wrong_arch=() arch
  arch=$(dpkg --print-architecture 2>/dev/null || true)
  [[ -n $arch ]] || case $(uname -m) in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
  for p in "${DEB_PACKAGES[@]}"; do
    local deb
    deb=$(compgen -G "$DEBS/${p}_*.deb" | head -1) || true
    if [[ -z $deb ]]; then absent+=("$p"); continue; fi
    local a
    a=$(dpkg-deb -f "$deb" Architecture 2>/dev/null || echo all)
    [[ $a == all || $a == "$arch" ]] || wrong_arch+=("$p ($a)")
  done
  ((${#absent[@]} == 0)) ||
    missing+=("Debian packages in $DEBS: ${absent[*]} (run 'tools/gpu_report.sh fetch-debs' where apt works, then carry .gpu_debs)")
  ((${#wrong_arch[@]} == 0)) ||
    missing+=("Debian packages for this machine's architecture ($arch) in $DEBS: ${wrong_arch[*]} are not (fetch-debs on a $arch machine)")
  if ((${#missing[@]})); then
    echo "gpu_report: cannot run here; missing:" >&2
    for p in "${missing[@]}"; do echo "  - $p" >&2; done
    exit 2
  fi
  export PATH=$venv_bin:$PATH
  ORIG_PATH=$PATH  # with the venv's cmake and ninja, still without the unpacked tree
  check_nvcc
}

# Without nvcc the fused cross-entropy kernels are not built and the loss runs as ATen ops (about
# 11 ms a step more for gpt2 at 16x1024): said loudly here, and the table's rows say which loss ran.
check_nvcc() {
  local nvcc=${GPU_REPORT_NVCC:-}
  [[ -n $nvcc ]] || nvcc=$(command -v nvcc 2>/dev/null || true)
  [[ -n $nvcc ]] || nvcc=${CUDACXX:-}
  [[ -n $nvcc ]] || { [[ -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc; }
  if [[ -n $nvcc && -x $nvcc ]]; then
    export CUDACXX=$nvcc
    say "nvcc: $nvcc (the fused loss is built)"
  else
    say "WARNING: no nvcc (not on PATH, CUDACXX or /usr/local/cuda/bin; GPU_REPORT_NVCC names one): the fused"
    say "WARNING: cross-entropy kernels will not be built, and every step runs the chunked loss (slower)"
  fi
}

# The .debs, unpacked into PREFIX (once), and the environment that finds them there.
use_debs() {
  if [[ ! -f $PREFIX/.unpacked ]]; then
    say "unpacking ${#DEB_PACKAGES[@]} packages into $PREFIX"
    mkdir -p "$PREFIX"
    local p
    for p in "${DEB_PACKAGES[@]}"; do dpkg-deb -x "$(compgen -G "$DEBS/${p}_*.deb" | head -1)" "$PREFIX"; done
    # Absolute links (zlib1g-dev's libz.so -> /lib/.../libz.so.1.2.13) would leave the tree:
    # point them at the unpacked file.
    local link target t
    while read -r link; do
      target=$(readlink "$link")
      for t in "$PREFIX$target" "$PREFIX/usr$target"; do
        if [[ -e $t ]]; then ln -sfn "$t" "$link"; break; fi
      done
    done < <(find "$PREFIX" -type l -lname '/*')
    touch "$PREFIX/.unpacked"
  fi
  export PATH=$PREFIX/usr/bin:$PATH
  DEB_LIBS=$PREFIX/usr/lib/$ARCH:$PREFIX/lib/$ARCH
  # pkg-config sees the unpacked .pc files only, their /usr paths moved under PREFIX.
  export PKG_CONFIG_LIBDIR=$PREFIX/usr/lib/$ARCH/pkgconfig:$PREFIX/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
}

# Runs one of our programs (or the build tools that run the unpacked ones: protoc, pkgconf) with the
# unpacked libraries on the loader's path. Only these: PyTorch's phases run with the machine's own.
DEB_LIBS=""
ours() {
  if [[ -n $DEB_LIBS ]]; then
    LD_LIBRARY_PATH=$DEB_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
  else
    "$@"
  fi
}

# PyTorch's own phases: the machine's PATH, no unpacked libraries.
theirs() { PATH=$ORIG_PATH "$@"; }

# The real configure step. With the packages unpacked, the system's /usr is left out of CMake's
# search: a package missing from the list fails here, not half-way through the build.
configure() {
  local torch_dir
  torch_dir=$("$TORCH_PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "share/cmake/Torch"))')
  [[ ${1:-} != force && -f $BUILD/build.ninja ]] && return 0
  say "configuring $BUILD against $torch_dir and the packages in $PREFIX"
  mkdir -p "$BUILD"
  if ! ours cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$torch_dir" \
      -DPIPELINE_TORCH_PYTHON="$TORCH_PY" \
      -DCMAKE_PREFIX_PATH="$PREFIX/usr;$PREFIX/usr/lib/$ARCH/cmake" -DCMAKE_SYSTEM_IGNORE_PREFIX_PATH=/usr \
      -DOPENSSL_ROOT_DIR="$PREFIX/usr" -DZLIB_ROOT="$PREFIX/usr" -DICU_ROOT="$PREFIX/usr" \
      -DPKG_CONFIG_EXECUTABLE="$PREFIX/usr/bin/pkgconf" -DPIPELINE_WERROR=OFF -DPIPELINE_WITH_PARQUET=OFF >"$WORK/configure.log" 2>&1; then
    cat "$WORK/configure.log" >>"$OUTDIR/build.log"
    tail -30 "$WORK/configure.log" >&2
    rm -f "$BUILD/build.ninja"  # configure again next time
    echo "gpu_report: the configure step failed against the unpacked packages; log: $OUTDIR/build.log" >&2
    exit 1
  fi
  cat "$WORK/configure.log" >>"$OUTDIR/build.log"
}

build() {
  local targets=(pipeline bench_model)
  [[ $MODE == profile || $MODE == scale ]] && targets=(bench_model)
  [[ $MODE == measure || $MODE == profile || $MODE == scale ]] || targets+=(test_model_gpu test_train_gpu test_distributed_gpu)
  say "building ${targets[*]} ($JOBS jobs)"
  if ! ours cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}" >>"$OUTDIR/build.log" 2>&1; then
    tail -40 "$OUTDIR/build.log" >&2
    echo "gpu_report: the build failed; log: $OUTDIR/build.log" >&2
    exit 1
  fi
}

run_tests() {
  say "ctest -L gpu"
  local status=0 budget
  budget=$(($(left) - RESERVE))  # what the measurements need is kept for them
  ((budget > 60)) || budget=60
  (cd "$BUILD" && ours ctest -L gpu --output-on-failure --timeout "$budget" --stop-time "$(date -d "+$budget sec" +%H:%M:%S)") \
    >"$OUTDIR/ctest.log" 2>&1 || status=$?
  tail -5 "$OUTDIR/ctest.log" >&2
  { grep -E 'tests passed|tests failed' "$OUTDIR/ctest.log" | tail -1 || echo "no summary (see ctest.log)"
    grep -E '^ *[0-9]+/[0-9]+ Test +#' "$OUTDIR/ctest.log" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //; s/ +\.+ */: /' || true
  } >"$WORK/ctest_summary.txt"
  return $status
}

# A failed phase is recorded (WORK/NAME.failed: why, in one line, with the log to read) and the
# report goes on; the table says so, and the script's status says so at the end.
FAILED=0
failed() {
  local name=$1 why=$2
  FAILED=1
  printf '%s\n' "$why" >"$WORK/$name.failed"
  say "$name failed: $why"
}

measure() {
  local mode line
  rm -rf "$WORK"/bench_*.result "$WORK"/bench_*.failed "$WORK"/pytorch_*.result "$WORK"/pytorch_*.failed "$WORK"/run_*
  : >"$OUTDIR/bench.log"
  for mode in $BENCH_MODES; do
    if (($(left) < 90)); then say "bench_model ($mode) skipped: the time budget is spent"; continue; fi
    say "bench_model $BENCH_ARGS ($mode)"
    local flag=""
    [[ $mode == cuda_graph ]] && flag=--cuda-graph
    echo "== bench_model $BENCH_ARGS $flag" >>"$OUTDIR/bench.log"
    local status=0
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
    ours "$BUILD/tools/bench_model" $BENCH_ARGS $flag >"$WORK/bench_$mode.log" 2>&1 || status=$?
    cat "$WORK/bench_$mode.log" >>"$OUTDIR/bench.log"
    if ((status != 0)); then
      failed "bench_$mode" "exit status $status: $(tail -1 "$WORK/bench_$mode.log") (bench.log)"
      continue
    fi
    line=$(grep '^result ' "$WORK/bench_$mode.log" || true)
    if [[ -z $line ]]; then failed "bench_$mode" "no result line (bench.log)"; continue; fi
    printf '%s\n' "$line" >"$WORK/bench_$mode.result"
  done
  local cfg
  for cfg in gpt2 gpt2_synthetic; do
    if (($(left) < 75)); then say "pipeline run $cfg.toml skipped: the time budget is spent"; continue; fi
    say "pipeline run $cfg.toml, $STEPS steps"
    local status=0
    # shellcheck disable=SC2086  # RUN_ARGS is a list of words
    (cd "$ROOT" && ours "$BUILD/tools/pipeline" run "$cfg.toml" --set training.steps="$STEPS" --set eval.every=0 \
      --set checkpoint.every=0 --set checkpoint.at_end=false --set logging.live=off \
      --set run.dir="$WORK/run_$cfg" $RUN_ARGS) >"$OUTDIR/run_$cfg.log" 2>&1 || status=$?
    if ((status != 0)); then
      tail -20 "$OUTDIR/run_$cfg.log" >&2
      failed "run_$cfg" "exit status $status: $(tail -1 "$OUTDIR/run_$cfg.log") (run_$cfg.log)"
    fi
  done
  pytorch
}

# PyTorch's step on bench_model's arguments (tools/eager_step.py: the same model, step and loss),
# eager and compiled, on the same machine in the same call: the reference the table compares
# bench_model with. Last and not fatal: a failure is logged and its row says so.
pytorch() {
  local mode need args
  args=$(eager_args "$BENCH_ARGS")
  for mode in $PYTORCH_MODES; do
    if [[ ! -x $TORCH_PY ]]; then say "PyTorch ($mode) skipped: no python at $TORCH_PY"; continue; fi
    need=60
    [[ $mode == compile ]] && need=150  # the compilation itself takes about a minute
    if (($(left) < need)); then say "PyTorch $mode skipped: the time budget is spent"; continue; fi
    say "tools/eager_step.py $args ($mode)"
    local flag=""
    [[ $mode == compile ]] && flag=--compile
    echo "== tools/eager_step.py $args $flag" >>"$OUTDIR/bench.log"
    local status=0
    # shellcheck disable=SC2086  # args is a list of words
    theirs "$TORCH_PY" "$ROOT/tools/eager_step.py" $args $flag >"$WORK/pytorch_$mode.log" 2>&1 || status=$?
    cat "$WORK/pytorch_$mode.log" >>"$OUTDIR/bench.log"
    if ((status != 0)); then failed "pytorch_$mode" "exit status $status: $(tail -1 "$WORK/pytorch_$mode.log") (bench.log)"; continue; fi
    pytorch_result "$WORK/pytorch_$mode.log" >"$WORK/pytorch_$mode.result"
    [[ -s $WORK/pytorch_$mode.result ]] || failed "pytorch_$mode" "no ms/step line (bench.log)"
  done
}

# tools/eager_step.py's line as a result line: "eager gpt2 16x1024 bf16 on cuda, 2 threads: 47.7
# ms/step, 343,631 tokens/s over 30 steps (median step 47.6 ms, loss 7.1, peak memory 9.9 GiB)".
pytorch_result() {
  local line ms tokens memory
  line=$(grep -E ' ms/step, [0-9,]+ tokens/s' "$1" | tail -1) || return 0
  ms=$(sed -nE 's/.* ([0-9.]+) ms\/step, .*/\1/p' <<<"$line")
  tokens=$(sed -nE 's/.* ([0-9,]+) tokens\/s.*/\1/p' <<<"$line" | tr -d ',')
  memory=$(sed -nE 's/.*peak memory ([0-9.]+) GiB.*/\1/p' <<<"$line")
  echo "result ms_per_step=$ms tokens_per_s=$tokens${memory:+ peak_gib=$memory}"
}

# bench_model's arguments that tools/eager_step.py takes too, with --device cuda unless given.
eager_args() {
  local words out=() i=0
  read -r -a words <<<"$1"
  while ((i < ${#words[@]})); do
    case ${words[i]} in
      --preset|--batch|--seq|--steps|--warmup|--device|--dtype|--recompute|--sdpa) out+=("${words[i]}" "${words[i+1]:-}"); i=$((i + 2)) ;;
      --cuda-graph|--fit-batch) i=$((i + 1)) ;;
      *) i=$((i + 2)) ;;  # bench_model's own: --peak-tflops, --matmul-precision, --profile...
    esac
  done
  [[ " ${out[*]} " == *" --device "* ]] || out+=(--device cuda)
  echo "${out[*]}"
}

# The same step in both programs, profiled after its timed steps; the table of kernels by kind.
profile() {
  local steps=3 bench_log=$WORK/profile_bench.log eager_log=$WORK/profile_eager.log
  say "bench_model $BENCH_ARGS --profile"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
  ours "$BUILD/tools/bench_model" $BENCH_ARGS --profile "$WORK/pipeline_trace.json" --profile-steps $steps \
    >"$bench_log" 2>&1 || { tail -20 "$bench_log" >&2; echo "gpu_report: bench_model --profile failed" >&2; exit 1; }
  say "tools/eager_step.py $(eager_args "$BENCH_ARGS") --profile"
  # shellcheck disable=SC2046  # a list of words
  theirs "$TORCH_PY" "$ROOT/tools/eager_step.py" $(eager_args "$BENCH_ARGS") --profile "$WORK/eager_trace.json" \
    --profile-steps $steps >"$eager_log" 2>&1 ||
    { tail -20 "$eager_log" >&2; echo "gpu_report: eager_step.py --profile failed" >&2; exit 1; }
  { echo "## The same step, profiled: bench_model against PyTorch eager ($steps steps each)"
    echo
    echo '```'
    grep -E 'ms/step' "$bench_log" "$eager_log" | sed "s|$WORK/||"
    echo '```'
    echo
    theirs "$TORCH_PY" "$ROOT/tools/kernel_table.py" "pipeline=$WORK/pipeline_trace.json:$steps" "pytorch=$WORK/eager_trace.json:$steps"
  } >"$OUTDIR/profile.md"
  gzip -c "$WORK/pipeline_trace.json" >"$OUTDIR/pipeline_trace.json.gz"
  gzip -c "$WORK/eager_trace.json" >"$OUTDIR/eager_trace.json.gz"
  cat "$OUTDIR/profile.md"
}

# ---------------------------------------------------------------------------------------------
# The scale sweep: one row per SCALE_ROWS entry, PRESET:BATCH[:RECOMPUTE[:fit]]. Each phase of a
# row (bench_model; PyTorch eager; PyTorch compiled) leaves WORK/scale/ROW.PHASE.result or
# .failed, and a phase already there is not measured again: a call that runs out of time leaves
# the rest to the next (same warm machine; GPU_REPORT_SCALE_FRESH=1 starts over).
scale() {
  local dir=$WORK/scale spec
  [[ ${GPU_REPORT_SCALE_FRESH:-0} == 1 ]] && rm -rf "$dir"
  mkdir -p "$dir"
  : >>"$OUTDIR/bench.log"
  for spec in $SCALE_ROWS; do scale_row "$spec"; done
  scale_table | tee "$OUTDIR/scale.md"
}

scale_row() {
  local spec=$1 dir=$WORK/scale preset batch recompute fit row args device=cuda status line
  IFS=: read -r preset batch recompute fit <<<"$spec"
  recompute=${recompute:-none}
  row=${spec//:/_}
  [[ $CPU_MODE == 1 ]] && { device=cpu; fit=""; }  # the CPU test: no memory to fit
  if [[ ! -s $dir/$row.bench.result && ! -f $dir/$row.bench.failed ]]; then
    if (($(left) < 60)); then say "scale $spec: bench_model skipped, the time budget is spent (call scale again)"; return 0; fi
    args="--preset $preset --batch $batch --seq $SCALE_SEQ --steps $SCALE_STEPS --warmup 3 --dtype $SCALE_DTYPE --recompute $recompute --device $device $SCALE_ARGS"
    [[ $fit == fit ]] && args+=" --fit-batch"
    say "scale: bench_model $args"
    echo "== bench_model $args" >>"$OUTDIR/bench.log"
    status=0
    # shellcheck disable=SC2086  # a list of words
    ours "$BUILD/tools/bench_model" $args >"$dir/$row.bench.log" 2>&1 || status=$?
    cat "$dir/$row.bench.log" >>"$OUTDIR/bench.log"
    line=$(grep '^result ' "$dir/$row.bench.log" || true)
    if ((status != 0)) || [[ -z $line ]]; then
      FAILED=1
      echo "exit status $status: $(tail -1 "$dir/$row.bench.log") (bench.log)" >"$dir/$row.bench.failed"
    else
      echo "$line" >"$dir/$row.bench.result"
    fi
  fi
  [[ -s $dir/$row.bench.result ]] || return 0
  batch=$(sed -nE 's/.* batch=([0-9]+).*/\1/p' "$dir/$row.bench.result")  # what fit
  local mode need flag
  for mode in $SCALE_PYTORCH_MODES; do
    [[ -s $dir/$row.$mode.result || -f $dir/$row.$mode.failed ]] && continue
    if [[ ! -x $TORCH_PY ]]; then say "scale $spec: PyTorch $mode skipped: no python at $TORCH_PY"; continue; fi
    need=60 flag=""
    [[ $mode == compile ]] && { need=180; flag=--compile; }
    if (($(left) < need)); then say "scale $spec: PyTorch $mode skipped, the time budget is spent (call scale again)"; continue; fi
    args="--preset $preset --batch $batch --seq $SCALE_SEQ --steps $SCALE_STEPS --warmup 3 --dtype $SCALE_DTYPE --recompute $recompute --device $device $SCALE_ARGS $flag"
    say "scale: tools/eager_step.py $args"
    echo "== tools/eager_step.py $args" >>"$OUTDIR/bench.log"
    status=0
    # shellcheck disable=SC2086  # a list of words
    theirs "$TORCH_PY" "$ROOT/tools/eager_step.py" $args >"$dir/$row.$mode.log" 2>&1 || status=$?
    cat "$dir/$row.$mode.log" >>"$OUTDIR/bench.log"
    if ((status != 0)); then
      local why
      why=$(tail -1 "$dir/$row.$mode.log")
      grep -q "OutOfMemoryError\|out of memory" "$dir/$row.$mode.log" && why="out of memory at B=$batch"
      echo "exit status $status: $why (bench.log)" >"$dir/$row.$mode.failed"
      continue
    fi
    pytorch_result "$dir/$row.$mode.log" >"$dir/$row.$mode.result"
    [[ -s $dir/$row.$mode.result ]] || echo "no ms/step line (bench.log)" >"$dir/$row.$mode.failed"
  done
}

scale_table() {
  local py=$TORCH_PY gpu
  [[ -x $py ]] || py=python3
  gpu=$("$NVIDIA_SMI" -L 2>/dev/null | head -1 || true)
  theirs "$py" - "$WORK/scale" "${gpu:-no GPU seen by $NVIDIA_SMI}" "$SCALE_ROWS" "$SCALE_SEQ" "$SECONDS" <<'EOF'
import os, sys
work, gpu, rows, seq, seconds = sys.argv[1:6]
seq = int(seq)
PRESETS = {"tiny": (2, 64, 64), "small-cpu": (4, 128, 128), "gpt2": (12, 768, 1024), "gpt2-medium": (24, 1024, 1024),
           "gpt2-large": (36, 1280, 1024), "gpt2-xl": (48, 1600, 1024)}  # n_layer, n_embd, block_size

def flops_per_token(preset):  # PaLM: 6N + 12LCT, N every parameter (model/net/gpt_config.cpp)
    L, C, block = PRESETS[preset]
    layer = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    n = 50304 * C + block * C + L * layer + 2 * C
    return 6 * n + 12 * L * C * seq

def read(row, phase):
    path = os.path.join(work, f"{row}.{phase}.result")
    if os.path.exists(path) and open(path).read().strip():
        return dict(w.split("=", 1) for w in open(path).read().split()[1:])
    path = os.path.join(work, f"{row}.{phase}.failed")
    return {"failed": open(path).read().strip()} if os.path.exists(path) else None

def cell(r, peak, preset):
    if r is None:
        return "not run yet | | |"
    if "failed" in r:
        return f"failed: {r['failed']} | | |"
    tok = float(r["tokens_per_s"])
    mfu = f"{100 * tok * flops_per_token(preset) / (peak * 1e12):.1f}%" if peak else "\u2014"
    mem = f"{float(r['peak_gib']):.2f} GiB" if "peak_gib" in r else ""
    return f"{float(r['ms_per_step']):.1f} | {tok:,.0f} | {mfu} | {mem}"

print(f"\n## Scale sweep: {gpu}\n")
print("MFU by the PaLM formula: 6N + 12·L·C·T FLOPs a token (N every parameter, L layers, C width, "
      "T the context), over the peak bench_model took (its table or --peak-tflops); \u2014 where it had none. "
      "Peak memory: the caching allocator's peak over the timed steps (bench_model on the CPU: the peak "
      "resident set).\n")
print("| model | B×T | recompute | loss | pipeline ms/step | tokens/s | MFU | peak memory "
      "| eager ms/step | tokens/s | MFU | peak memory | compiled ms/step | tokens/s | MFU | peak memory "
      "| vs eager | vs compiled |")
print("| " + " | ".join(["---"] * 18) + " |")
for spec in rows.split():
    parts = spec.split(":")
    preset, batch = parts[0], parts[1]
    recompute = parts[2] if len(parts) > 2 else "none"
    row = spec.replace(":", "_")
    b = read(row, "bench")
    if b is None or "failed" in b:
        why = "not run yet (call scale again)" if b is None else "failed: " + b["failed"]
        print(f"| {preset} | {batch}×{seq} | {recompute} | | {why} |" + " |" * 13)
        continue
    peak = float(b.get("peak_tflops", 0)) or None
    e, c = read(row, "eager"), read(row, "compile")
    ratios = []
    for p in (e, c):
        ok = p is not None and "failed" not in p
        ratios.append(f"{float(p['ms_per_step']) / float(b['ms_per_step']):.2f}x" if ok else "")
    print(f"| {preset} | {b['batch']}×{seq} | {recompute} | {b.get('loss', '?')} | {cell(b, peak, preset)} | "
          f"{cell(e, peak, preset)} | {cell(c, peak, preset)} | {ratios[0]} | {ratios[1]} |")
print(f"\n(the call took {seconds} s; vs: PyTorch's ms/step over the pipeline's, above 1 the pipeline is faster)")
EOF
}

table() {
  local py=$TORCH_PY gpu
  [[ -x $py ]] || py=python3
  gpu=$("$NVIDIA_SMI" -L 2>/dev/null | head -1 || true)
  "$py" - "$WORK" "${gpu:-no GPU seen by $NVIDIA_SMI}" "$BENCH_ARGS" "$SECONDS" <<'EOF'
import json, os, sys
work, gpu, bench_args, seconds = sys.argv[1:5]

def failure(name):
    path = os.path.join(work, f"{name}.failed")
    return open(path).read().strip() if os.path.exists(path) else None

def bench(mode, prefix="bench"):
    path = os.path.join(work, f"{prefix}_{mode}.result")
    if not os.path.exists(path) or not open(path).read().strip():
        return None
    words = open(path).read().split()
    return dict(w.split("=", 1) for w in words[1:])

def mfu(b):
    x = float(b.get("mfu", "nan"))
    return f"{100 * x:.1f}%" if x == x else "\u2014"  # no peak for this GPU: no number

# Train's GPU-busy share over the steady state (the start-up and a graph's capture left out), as
# the verdict judges it; over the whole run when the run had no steady state.
def device_busy(train):
    steady = train.get("steady", {})
    if steady.get("seconds", 0) > 0 and "device_busy" in steady:
        return steady["device_busy"]
    return train["device_busy_s"] / train["wall_s"] if train["wall_s"] > 0 else 0.0

def run(cfg):
    d = os.path.join(work, f"run_{cfg}")
    if not os.path.exists(os.path.join(d, "stats_summary.json")):
        return None
    steps = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in l]
    summary = json.load(open(os.path.join(d, "stats_summary.json")))
    train = next(s for s in summary["stages"] if s["type"] == "train")
    last = steps[-1]
    return {
        "steps": last["step"],
        "tok_s": last["tokens_per_s"],
        "ms": last["ms_per_step"],
        "busy": device_busy(train),
        "phases": last.get("gpu_ms", last.get("host_ms", {})),
        "verdict": summary.get("verdict", {}).get("text", ""),
    }

summary_file = os.path.join(work, "ctest_summary.txt")
tests = open(summary_file).read().strip().splitlines() if os.path.exists(summary_file) else ["not run (tools/gpu_report.sh test or all)"]
print(f"\n## GPU report: {gpu}\n")
print(f"ctest -L gpu: {tests[0]}\n")
for t in tests[1:]:
    print(f"- {t}")
print()
print(f"| bench_model {bench_args} | ms/step | tokens/s | MFU (PaLM) | peak memory | loss |")
print("| --- | --- | --- | --- | --- | --- |")
for mode in ("eager", "cuda_graph"):
    b = bench(mode)
    if b is None:
        why = failure(f"bench_{mode}")
        print(f"| {mode} | {'failed: ' + why if why else 'not run'} | | | | |")
        continue
    print(f"| {mode} | {float(b['ms_per_step']):.1f} | {float(b['tokens_per_s']):,.0f} | "
          f"{mfu(b)} | {float(b['peak_gib']):.2f} GiB | {b.get('loss', '?')} |")
ours, against = bench("eager"), []
for mode, name in (("eager", "eager"), ("compile", "torch.compile")):
    p = bench(mode, "pytorch")
    if p is None:
        why = failure(f"pytorch_{mode}")
        print(f"| PyTorch {name} (tools/eager_step.py) | {'failed: ' + why if why else 'not run'} | | | | |")
        continue
    memory = f"{float(p['peak_gib']):.2f} GiB" if "peak_gib" in p else ""
    print(f"| PyTorch {name} (tools/eager_step.py) | {float(p['ms_per_step']):.1f} | {float(p['tokens_per_s']):,.0f} | | {memory} | |")
    if ours is not None and float(ours["ms_per_step"]) > 0:
        against.append(f"{float(p['ms_per_step']) / float(ours['ms_per_step']):.2f}x PyTorch {name}'s speed")
if against:
    print(f"\nbench_model eager, same machine and call: {', '.join(against)}")
rows = {cfg: run(cfg) for cfg in ("gpt2", "gpt2_synthetic")}
print()
print("| pipeline run | steps | tokens/s | ms/step | train GPU busy (steady state) | last step, ms per phase | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for cfg, r in rows.items():
    if r is None:
        why = failure(f"run_{cfg}")
        print(f"| {cfg}.toml | {'failed: ' + why if why else 'not run'} | | | | | |")
        continue
    phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
    print(f"| {cfg}.toml | {r['steps']} | {r['tok_s']:,.0f} | {r['ms']:.1f} | {100 * r['busy']:.0f}% | {phases} | {r['verdict']} |")
if rows["gpt2"] and rows["gpt2_synthetic"] and rows["gpt2_synthetic"]["tok_s"]:
    ratio = rows["gpt2"]["tok_s"] / rows["gpt2_synthetic"]["tok_s"]
    print(f"\ninput-side cost: gpt2 / gpt2_synthetic tokens/s = {ratio:.3f} (goal >= 0.99)")
print(f"\n(the report took {seconds} s)")
EOF
}

# `all`, `test` and `measure`: everything checked before anything is built.
prepare() {
  if [[ $CPU_MODE == 1 ]]; then  # the CPU test: the build directory as it is
    [[ -f $BUILD/build.ninja ]] || { echo "gpu_report: GPU_REPORT_CPU=1 needs a configured build in $BUILD" >&2; exit 2; }
    mkdir -p "$OUTDIR" "$WORK"
    : >"$OUTDIR/build.log"
    return
  fi
  check_present  # before anything is made
  mkdir -p "$OUTDIR" "$WORK"
  rm -f "$OUTDIR/build.log"
  use_debs
  "$NVIDIA_SMI" >"$OUTDIR/nvidia-smi.txt" 2>&1 || true
  configure
}

case $MODE in
  -h|--help|help) usage ;;
  packages) packages "${2:-}" ;;
  fetch-debs) fetch_debs ;;
  table) table ;;
  exec)
    shift
    (($#)) || { echo "gpu_report: exec needs a command" >&2; exit 2; }
    [[ -f $PREFIX/.unpacked ]] || { echo "gpu_report: no packages unpacked in $PREFIX (run check or all first)" >&2; exit 2; }
    use_debs
    export LD_LIBRARY_PATH=$DEB_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # a program of ours, by hand
    exec "$@" ;;
  rerun) mkdir -p "$OUTDIR" "$WORK"; measure; table | tee "$OUTDIR/gpu_report.md"; exit $FAILED ;;
  check)
    check_present
    mkdir -p "$OUTDIR" "$WORK"
    rm -f "$OUTDIR/build.log"
    use_debs
    configure force
    say "all present; configured $BUILD against the unpacked packages" ;;
  profile) prepare; build; profile ;;
  scale) prepare; build; scale; exit $FAILED ;;
  test|measure|all)
    prepare
    build
    status=0
    if [[ $MODE != measure ]]; then run_tests || status=$?; fi
    if [[ $MODE != test ]]; then measure; fi
    table | tee "$OUTDIR/gpu_report.md"
    ((status != 0)) || status=$FAILED
    exit $status
    ;;
  *) echo "gpu_report: unknown mode '$MODE' (packages | fetch-debs | check | test | measure | all | profile | scale | table | rerun | exec; see --help)" >&2; exit 2 ;;
esac
