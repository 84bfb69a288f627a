#!/usr/bin/env bash
# Start-up time and resident memory of the commands that need no tensors, for one or more builds
# of `pipeline` measured side by side (a reference in the same run: the machine is shared).
#
#   tools/bench_startup.sh [PIPELINE ...]     default: build/tools/pipeline
#
# For each program: `--version`, `check CONFIG` (pipelines/gpt2.toml) and `tokenize FILE --out
# /dev/null` (the first 10 kB of tiny-shakespeare), each the median of 10 warm runs (hyperfine,
# 3 warm-up runs) and the median of 10 runs' maximum resident set size (/usr/bin/time). Needs
# hyperfine and GNU time (Debian: hyperfine, time).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROGRAMS=("$@")
((${#PROGRAMS[@]})) || PROGRAMS=("$ROOT/build/tools/pipeline")
command -v hyperfine >/dev/null || { echo "bench_startup.sh: needs hyperfine (apt-get install hyperfine)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "bench_startup.sh: needs GNU time (apt-get install time)" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
zstd -q -d -c "$ROOT/datasets/data/tinyshakespeare/tinyshakespeare.txt.zst" > "$WORK/all.txt"
head -c 10000 "$WORK/all.txt" > "$WORK/small.txt"
CONFIG=$ROOT/pipelines/gpt2.toml
COMMANDS=("--version" "check $CONFIG" "tokenize $WORK/small.txt --out /dev/null")

echo "load: $(uptime | sed 's/.*load average/load average/')"
printf '%-44s %-26s %12s %12s\n' program command "median ms" "max RSS MB"
for prog in "${PROGRAMS[@]}"; do
  for cmd in "${COMMANDS[@]}"; do
    # shellcheck disable=SC2086  # the command's words
    hyperfine -N --warmup 3 --runs 10 --export-json "$WORK/h.json" "$prog $cmd" >/dev/null 2>&1
    ms=$(python3 -c "import json,sys; print('%.1f' % (1000*json.load(open(sys.argv[1]))['results'][0]['median']))" "$WORK/h.json")
    rss=()
    for _ in $(seq 10); do
      # shellcheck disable=SC2086
      rss+=("$(/usr/bin/time -f %M $prog $cmd 2>&1 >/dev/null | tail -1)")
    done
    mb=$(printf '%s\n' "${rss[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", (a[int((NR+1)/2)]+a[int(NR/2)+1])/2/1024}')
    printf '%-44s %-26s %12s %12s\n' "$(basename "$(dirname "$prog")")/$(basename "$prog")" "${cmd%% *}" "$ms" "$mb"
  done
done
