#!/usr/bin/env bash
# Benchmark (a program to run and report, not a test): training data streamed from S3, ours
# against the way Python users stream it. In one call, on this machine, over the same
# FineWeb-shaped Parquet files served by `rclone serve s3` on loopback:
#   1. ours (build/tests/bench_remote_input): the lanes read through the S3 store with the fetch
#      threads ahead, W tokenizer threads, a stand-in for training taking B x T tokens a step:
#      tokens/s and the time to the first batch at the server's full speed; then, through a proxy
#      throttled to 1.5x the bytes training consumes, with the cache capped at 2 units, the share of
#      steps training waited for input and the cache's high water against its cap;
#   2. the reference: Hugging Face `datasets` streaming the same bucket (through s3fs) and
#      tiktoken tokenizing, in 2 processes: tokens/s and the time to the first batch. tiktoken's
#      GPT-2 files are written from the project's own vocabulary (nothing is downloaded at run time).
# Prints every trial, the medians, the ratio, and the machine's load before and after.
#
#   tools/bench_remote.sh [--files N] [--rows N] [--seconds S] [--trials N] [--lanes K] [--workers W]
#
# Needs the build (tools/setup.sh --no-run), rclone (tools/setup.sh installs it) and, for the
# reference, PyPI's datasets, tiktoken and s3fs, installed pinned into the cache on first use.
# The figures belong to a quiet machine: with other work on the cores, they measure the load.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PIPELINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pipeline}
BUILD=${PIPELINE_BUILD_DIR:-$ROOT/build}
FILES=4 ROWS=6000 SECONDS_=20 TRIALS=3 LANES=8 WORKERS=2
while (($#)); do
  case $1 in
    --files) FILES=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --seconds) SECONDS_=$2; shift 2 ;;
    --trials) TRIALS=$2; shift 2 ;;
    --lanes) LANES=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench_remote.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
say() { printf '\033[1m[bench_remote]\033[0m %s\n' "$*" >&2; }
# shellcheck source=tools/pinned_venv.sh
source "$ROOT/tools/pinned_venv.sh"

BENCH=$BUILD/tests/bench_remote_input
RCLONE=$CACHE/remote-tools/bin/rclone
ARROW_PY=$(ls -d "$CACHE"/arrow-*/bin/python 2>/dev/null | head -1)
[[ -x $BENCH ]] || { echo "bench_remote.sh: $BENCH is not built (tools/setup.sh --no-run)" >&2; exit 1; }
[[ -x $RCLONE ]] || { echo "bench_remote.sh: skipped: rclone is not installed ($RCLONE; tools/setup.sh installs it)" >&2; exit 77; }
[[ -n $ARROW_PY ]] || { echo "bench_remote.sh: skipped: no pyarrow venv in $CACHE (tools/setup.sh installs it)" >&2; exit 77; }

WORK=$(mktemp -d /tmp/bench_remote.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

# 1. FineWeb-shaped files: a text column of web-page-length documents (a few kB, words drawn from
#    a Zipf-like vocabulary), row groups of 1,000 rows, zstd, as the Hub's shards are written.
say "writing $FILES Parquet files of $ROWS documents into $WORK/srv/fineweb"
"$ARROW_PY" - "$WORK/srv/fineweb" "$FILES" "$ROWS" <<'PY'
import os, random, sys
import pyarrow as pa, pyarrow.parquet as pq
out, files, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
rng = random.Random(1337)
vocab = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
         "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
         "learning", "students", "education", "research", "history", "science", "development", "children", "health",
         "water", "energy", "system", "process", "teachers", "language", "information", "example", "important"]
weights = [1.0 / (i + 1) for i in range(len(vocab))]
for f in range(files):
    docs = []
    for _ in range(rows):
        n = int(rng.lognormvariate(6.3, 0.7))  # about 550 words, a long tail
        words = rng.choices(vocab, weights, k=n)
        docs.append(" ".join(words).capitalize() + ".\n")
    pq.write_table(pa.table({"text": docs}), os.path.join(out, "%03d_00000.parquet" % f), row_group_size=1000,
                   compression="zstd")
PY
du -sh "$WORK/srv/fineweb" | sed 's/^/files: /'

# 2. Ours (the program starts its own rclone and proxy).
say "ours: $TRIALS trials of ${SECONDS_} s, $LANES lanes, $WORKERS tokenizer threads"
"$BENCH" "$WORK/srv" fineweb --lanes "$LANES" --workers "$WORKERS" --seconds "$SECONDS_" --trials "$TRIALS" \
  --batch 8 --seq 1024 --cache-units 2 | tee "$WORK/ours.txt"

# 3. The reference: HF datasets streaming + tiktoken, 2 processes, over the same bucket.
VENV=$CACHE/bench-remote
pinned_install "$VENV" bench "datasets==5.2.0 tiktoken==0.14.0 s3fs==2026.9.0" \
  "HF datasets, tiktoken and s3fs for tools/bench_remote.sh's reference" new
TIK=$WORK/tiktoken
mkdir -p "$TIK"
# tiktoken names its cached GPT-2 files by the SHA-1 of their download URLs.
zstd -q -d -c "$ROOT/datasets/tokenizer/vocab/gpt2_vocab.bpe.zst" >"$TIK/6d1cbeee0f20b3d9449abfede4726ed8212e3aee"
zstd -q -d -c "$ROOT/datasets/tokenizer/vocab/gpt2_encoder.json.zst" >"$TIK/6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"
PORT=$("$ARROW_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$RCLONE" serve s3 "$WORK/srv" --addr "127.0.0.1:$PORT" --auth-key BENCHKEY,BENCHsecret0123 --config /dev/null \
  --log-level ERROR >"$WORK/rclone.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
say "reference: HF datasets streaming + tiktoken, 2 processes, $TRIALS trials of ${SECONDS_} s"
for t in $(seq "$TRIALS"); do
  TIKTOKEN_CACHE_DIR=$TIK HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" - "$PORT" "$SECONDS_" "$FILES" <<'PY'
import multiprocessing as mp, sys, time
def worker(rank, port, seconds, files, out):
    import tiktoken
    from datasets import load_dataset
    enc = tiktoken.get_encoding("gpt2")
    opts = {"key": "BENCHKEY", "secret": "BENCHsecret0123", "client_kwargs": {"endpoint_url": "http://127.0.0.1:%s" % port}}
    mine = ["s3://fineweb/%03d_00000.parquet" % f for f in range(files) if f % 2 == rank]
    t0 = time.time()
    ds = load_dataset("parquet", data_files=mine, split="train", streaming=True, storage_options=opts)
    tokens, first, start, start_tokens, now = 0, None, None, 0, 0.0
    while now <= seconds:  # the files again when they end before the trial does, as ours loops
        for row in ds:
            tokens += len(enc.encode_ordinary(row["text"])) + 1
            now = time.time() - t0
            if first is None and tokens >= 8 * 1024:
                first = now
            if start is None and first is not None and now > first + 3:
                start, start_tokens = now, tokens
            if now > seconds:
                break
    end = time.time() - t0
    out.put((rank, (tokens - start_tokens) / (end - start) if start and end > start else 0.0, first or end))
if __name__ == "__main__":
    port, seconds, files = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    q = mp.Queue()
    ps = [mp.Process(target=worker, args=(r, port, seconds, files, q)) for r in range(2)]
    for p in ps: p.start()
    res = [q.get() for _ in ps]
    for p in ps: p.join()
    rate = sum(r[1] for r in res)
    first = min(r[2] for r in res)
    print("reference trial: %.0f tokens/s, first batch after %.2f s" % (rate, first), flush=True)
PY
done | tee "$WORK/reference.txt"

ours=$(sed -n 's/^ours: median \([0-9]*\) tokens.*/\1/p' "$WORK/ours.txt")
ref=$(sed -n 's/^reference trial: \([0-9]*\) tokens.*/\1/p' "$WORK/reference.txt" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "ratio: ours ${ours} tokens/s / reference ${ref} tokens/s (medians) = $(awk -v a="$ours" -v b="$ref" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
