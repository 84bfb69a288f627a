#!/usr/bin/env python3
"""llm.c / modded-nanogpt token shards for tests/test_interop.cpp, written and read the way those
projects' Python scripts do, from the published layout: a header of 256 int32 (magic 20240520,
version 1, token count, zeros) followed by the tokens as uint16, one file per shard named
<prefix>_<split>_<index:06d>.bin.

    llmc_shards.py write --tokens IN.u16 --out DIR --prefix P --split S --shards K
        Cuts the uint16 token stream IN.u16 into K shards of (nearly) equal length.
    llmc_shards.py read --dir DIR --split S --out OUT.u16
        Reads DIR's shards of split S in name order, checking each header and file size as llm.c's
        loader does, and writes their tokens, concatenated, to OUT.u16.
"""
import argparse
import glob
import os
import sys

import numpy as np

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256


def write_shard(path, tokens):
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def read_shard(path):
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if header[0] != MAGIC or header[1] != VERSION:
        sys.exit(f"{path}: magic {header[0]} version {header[1]}")
    n = int(header[2])
    if os.path.getsize(path) != HEADER_INTS * 4 + 2 * n:
        sys.exit(f"{path}: {os.path.getsize(path)} bytes for {n} tokens")
    with open(path, "rb") as f:
        f.seek(HEADER_INTS * 4)
        return np.frombuffer(f.read(), dtype=np.uint16)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--tokens", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--prefix", required=True)
    w.add_argument("--split", required=True)
    w.add_argument("--shards", type=int, default=1)
    r = sub.add_parser("read")
    r.add_argument("--dir", required=True)
    r.add_argument("--split", required=True)
    r.add_argument("--out", required=True)
    args = p.parse_args()
    if args.cmd == "write":
        tokens = np.fromfile(args.tokens, dtype=np.uint16)
        os.makedirs(args.out, exist_ok=True)
        for i, part in enumerate(np.array_split(tokens, args.shards)):
            write_shard(os.path.join(args.out, f"{args.prefix}_{args.split}_{i:06d}.bin"), part)
    else:
        files = sorted(glob.glob(os.path.join(args.dir, f"*_{args.split}_*.bin")))
        if not files:
            sys.exit(f"{args.dir}: no *_{args.split}_*.bin shards")
        np.concatenate([read_shard(f) for f in files]).astype(np.uint16).tofile(args.out)


if __name__ == "__main__":
    main()
