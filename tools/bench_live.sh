#!/usr/bin/env bash
# What the live server costs a run: the quick start (shortened), alternately without the
# server and with it while a client polls it as the page does (api/snapshot and api/events each
# second, api/history and the page once), PAIRS times; prints each run's tokens/s (the log
# stage's figure at the last step) and the medians. Run it on an otherwise quiet machine, and
# note `uptime`: the two kinds of run alternate so that load changes hit both.
#
#   tools/bench_live.sh [PAIRS] [STEPS]       (defaults: 3 pairs of 60-step runs)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PIPELINE=${PIPELINE:-$ROOT/build/tools/pipeline}
PAIRS=${1:-3}
STEPS=${2:-60}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

poll() {  # polls the run's server until it goes away, as the page does
  python3 - "$1" <<'PY'
import re, sys, time, urllib.request
log = sys.argv[1]
url = None
for _ in range(600):
    m = re.search(r"live page: (http://\S+)", open(log).read())
    if m:
        url = m.group(1)
        break
    time.sleep(0.1)
if not url:
    sys.exit("no live page in " + log)
get = lambda p: urllib.request.urlopen(url + p, timeout=5).read()
try:
    get(""); get("api/history")
    while True:
        get("api/snapshot"); get("api/events")
        time.sleep(1)
except Exception:
    pass  # the run ended
PY
}

run() {  # $1: plain | served; prints tokens/s
  local log=$WORK/$1.log dir=$WORK/run-$1
  rm -rf "$dir"
  local args=(run quickstart.toml --set "training.steps=$STEPS" --set eval.every=0 --set checkpoint.at_end=false
              --set logging.live=off --set "run.dir=$dir")
  if [[ $1 == served ]]; then
    "$PIPELINE" "${args[@]}" --serve 0 > "$log" 2>&1 &
    local pid=$!
    poll "$log"
    wait "$pid"
  else
    "$PIPELINE" "${args[@]}" > "$log" 2>&1
  fi
  tail -n 1 "$dir/metrics.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])"
}

plain=() served=()
for ((i = 1; i <= PAIRS; i++)); do
  a=$(run plain); b=$(run served)
  plain+=("$a"); served+=("$b")
  echo "pair $i: without the server $a tokens/s, with it and a client polling $b tokens/s ($(uptime | sed 's/.*load/load/'))"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
m1=$(median "${plain[@]}"); m2=$(median "${served[@]}")
echo "median: without $m1 tokens/s, with $m2 tokens/s: $(python3 -c "print(f'{100*($m2/$m1-1):+.2f}%')")"
