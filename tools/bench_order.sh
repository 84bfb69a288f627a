#!/usr/bin/env bash
# The input side of two builds of `pipeline` side by side, in alternating trials (the machine's
# speed moves, so each trial of one is next to a trial of the other): a build before the data
# order of issue 38 (the documents order, format-1 shards) against one with it (the lanes order,
# block shards), or any two builds. A benchmark to run on a quiet machine and report, not a test.
#
#   tools/bench_order.sh BASE_BUILD NEW_BUILD [TRIALS] [SECONDS] [COPIES]
#
#   W = 1: BUILD/tools/bench_input (read_shards -> tokenize x auto -> pack, B = 16, T = 1024),
#          looping, SECONDS a trial after a 2 s warm-up, on the corpus below as each build's own
#          `pipeline prepare` writes it with its defaults (one zstd frame a shard before, blocks of
#          64 KiB after): MB/s of text, and MB per CPU-second of the process (which holds better
#          than MB/s on a loaded machine). And on the bundled tiny-shakespeare of each build's own
#          checkout (1.1 MB, level 19: one frame before, blocks of 16 KiB after): MB/s.
#   W = 2: two ranks under torchrun (CPU, Gloo), `pipeline run` of the input side alone (no
#          model: read_shards -> tokenize x auto -> pack) once over the corpus: MB/s of text, the
#          corpus over the slower rank's time (from rank 0's stats_summary.json; start-up not
#          counted).
#   The corpus: COPIES copies of tiny-shakespeare, each line's words shuffled per copy (below).
# Defaults: 5 trials, 10 s, 40 copies (44 MB). Each line is a trial; the last lines are the
# medians and NEW / BASE. Needs set-up's torchrun (~/.cache/pipeline/torch-2.11.0/bin/torchrun,
# or TORCHRUN) and python3.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if (($# < 2)); then
  echo "usage: tools/bench_order.sh BASE_BUILD NEW_BUILD [TRIALS] [SECONDS] [COPIES]" >&2
  exit 2
fi
BASE=$(cd "$1" && pwd)
NEW=$(cd "$2" && pwd)
TRIALS=${3:-5}
SECONDS_=${4:-10}
COPIES=${5:-40}
TORCHRUN=${TORCHRUN:-${PIPELINE_CACHE:-$HOME/.cache/pipeline}/torch-2.11.0/bin/torchrun}
for b in "$BASE" "$NEW"; do
  [[ -x $b/tools/bench_input && -x $b/tools/pipeline ]] || { echo "bench_order.sh: $b has no tools/bench_input or tools/pipeline" >&2; exit 2; }
done
[[ -x $TORCHRUN ]] || { echo "bench_order.sh: no torchrun at $TORCHRUN (set TORCHRUN)" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The corpus, and each build's dataset of it (`pipeline prepare` with that build's defaults).
# Copy k of tiny-shakespeare has the words of each line shuffled by a seed of (k, line): the same
# words and pieces for the tokenizer, but no copy repeats another. Copies of one text would let a
# shard of one zstd frame (format 1) decode the later copies as long matches, nearly for free,
# where blocks of 64 KiB cannot reach back: a corpus no one trains on, favouring one layout.
zstd -q -d -c "$ROOT/datasets/data/tinyshakespeare/tinyshakespeare.txt.zst" > "$WORK/one.txt"
python3 - "$WORK/one.txt" "$COPIES" > "$WORK/corpus.txt" <<'PY'
import random, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
out = sys.stdout
for k in range(int(sys.argv[2])):
    for i, line in enumerate(lines):
        words = line.split(" ")
        random.Random(k * 1_000_003 + i).shuffle(words)
        out.write(" ".join(words) + "\n")
    out.write("\n\n")
PY
CORPUS_BYTES=$(stat -c %s "$WORK/corpus.txt")
for tag in base new; do
  build=$BASE
  [[ $tag == new ]] && build=$NEW
  "$build/tools/pipeline" prepare "$WORK/corpus.txt" --out "$WORK/data_$tag" --val-fraction 0 --quiet >/dev/null 2>&1
done
# Each build finds its own pipelines/ and bundled data (its checkout), not this directory's.
cd "$WORK"

# The input side alone: no model trains (the tiny preset only sizes the run), the data read once.
cat > "$WORK/input.toml" <<EOF
[run]
device = "cpu"
[model]
preset = "tiny"
block_size = 1024
[data]
dataset = "$WORK/data_base"
loop = false
[training]
batch_size = 16
seq_len = 1024
[eval]
every = 0
[checkpoint]
at_end = false
[logging]
live = "off"
trace = false
[stages.read]
type = "read_shards"
[stages.tokenize]
type = "tokenize"
input = "read"
workers = "auto"
capacity = 64
[stages.pack]
type = "pack"
input = "tokenize"
capacity = 64
EOF

# W = 1: "MB/s MB/CPU-s" of one bench_input trial (a dataset given: on it; none: the bundled one).
w1() {
  "$1/tools/bench_input" --seconds "$SECONDS_" --warmup 2 --trials 1 ${2:+--dataset "$2"} |
    awk '$1 == "0" && $2 == "0" { print $3, $8 }'
}

# W = 2: MB/s of two ranks reading the corpus once.
w2() {
  local build=$1 tag=$2 run=$WORK/run_$2_$3
  "$TORCHRUN" --standalone --nproc-per-node=2 --no-python "$build/tools/pipeline" run "$WORK/input.toml" \
    --set "data.dataset=\"$WORK/data_$tag\"" --set "run.dir=\"$run\"" >"$run.log" 2>&1 ||
    { echo "bench_order.sh: the 2-rank run of $build failed:" >&2; tail -20 "$run.log" >&2; exit 1; }
  python3 - "$run/stats_summary.json" "$CORPUS_BYTES" <<'PY'
import json, sys
stages = json.load(open(sys.argv[1]))["stages"]
slowest = max(s["wall_s"] for s in stages)  # every rank's read, tokenize and pack: the slower rank's end
print("%.1f" % (int(sys.argv[2]) / slowest / 1e6))
PY
}

echo "load: $(uptime | sed 's/.*load average/load average/')"
echo "base: $BASE"
echo "new:  $NEW"
echo "corpus: $COPIES copies of tiny-shakespeare, words shuffled per copy, $CORPUS_BYTES bytes"
printf '%6s %-5s %12s %14s %14s %12s\n' trial build "W=1 MB/s" "W=1 MB/CPU-s" "bundled MB/s" "W=2 MB/s"
declare -A r1 c1 rb r2
for t in $(seq "$TRIALS"); do
  order=(base new)
  ((t % 2 == 0)) && order=(new base)  # alternate which goes first
  for tag in "${order[@]}"; do
    build=$BASE
    [[ $tag == new ]] && build=$NEW
    read -r mbs cpu < <(w1 "$build" "$WORK/data_$tag")
    read -r mbb _ < <(w1 "$build")
    mb2=$(w2 "$build" "$tag" "$t")
    r1[$tag]+="$mbs "
    c1[$tag]+="$cpu "
    rb[$tag]+="$mbb "
    r2[$tag]+="$mb2 "
    printf '%6d %-5s %12s %14s %14s %12s\n' "$t" "$tag" "$mbs" "$cpu" "$mbb" "$mb2"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
for tag in base new; do
  printf '%6s %-5s %12s %14s %14s %12s\n' median "$tag" "$(median <<<"${r1[$tag]}")" "$(median <<<"${c1[$tag]}")" \
    "$(median <<<"${rb[$tag]}")" "$(median <<<"${r2[$tag]}")"
done
ratio() { awk -v a="$(median <<<"$1")" -v b="$(median <<<"$2")" 'BEGIN { printf "%.1f%%", 100 * a / b }'; }
printf '%6s %-5s %12s %14s %14s %12s\n' "" "new/base" "$(ratio "${r1[new]}" "${r1[base]}")" \
  "$(ratio "${c1[new]}" "${c1[base]}")" "$(ratio "${rb[new]}" "${rb[base]}")" "$(ratio "${r2[new]}" "${r2[base]}")"
