#!/usr/bin/env bash
# Regenerates the bundled tiny-shakespeare dataset (datasets/data/tinyshakespeare/{text,tokens})
# with `pipeline prepare`. The output is byte-for-byte reproducible: same input, same flags,
# same bytes (prepare is deterministic for a seed; zstd output is fixed for a level).
#
# usage: tools/make_bundled_data.sh [PIPELINE_EXE] [TINYSHAKESPEARE_TXT]
#   defaults: build/tools/pipeline and the corpus the repository ships,
#   datasets/data/tinyshakespeare/tinyshakespeare.txt.zst (unpacked into a temporary file)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${1:-$root/build/tools/pipeline}
out=$root/datasets/data/tinyshakespeare
input=${2:-}
if [[ -z $input ]]; then
  input=$(mktemp --suffix=.txt)
  trap 'rm -f "$input"' EXIT
  zstd -q -d -f "$out/tinyshakespeare.txt.zst" -o "$input"
fi

# One speech per document (blank-line rule), 10% of documents in val, zstd level 19 to keep
# the repository small. Block shards of 16 KiB blocks: the train split makes 62 units of
# text and 37 of tokens, enough for the lanes of a run of up to 36 rows a step (the quick start's
# 8, and every world size of 1 to 4 at 12 or 24), where 64 KiB blocks would make 16 and 10.
flags=(--split blank-lines --val-fraction 0.1 --seed 1337 --level 19 --block-bytes 16K --force)
set -x
"$exe" prepare "$input" --out "$out/text" "${flags[@]}"
"$exe" prepare "$input" --out "$out/tokens" --tokens "${flags[@]}"
