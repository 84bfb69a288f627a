"""The way GPT-2 trainers prepare FineWeb-Edu today, re-implemented for a measured comparison:
llm.c's dev/data/fineweb.py approach (build-nanogpt's is the same). Every document is tokenized
with tiktoken's GPT-2 encoding in a multiprocessing pool, an <|endoftext|> before each, and the
ids are written as uint16 into .bin shards of 10^8 tokens in llm.c's layout (256 int32 of header:
magic 20240520, version 1, token count); shard 0 is val, the rest train. Training can start only
after this pass. Differences, both in the reference's favour: pyarrow reads the Parquet files
directly (llm.c goes through `datasets.load_dataset`, which first converts them to its Arrow
cache), and nothing is downloaded.

    TIKTOKEN_CACHE_DIR=DIR fineweb_reference.py PARQUET_DIR OUT_DIR [--procs 2] [--shard-tokens 100000000]

tiktoken is offline: write_tiktoken_cache.py puts the project's GPT-2 vocabulary in DIR.
Prints one JSON line: documents, tokens, seconds, tokens_per_s, first_train_shard_s.
"""
import argparse
import glob
import json
import multiprocessing as mp
import os
import time

import numpy as np
import pyarrow.parquet as pq
import tiktoken

enc = tiktoken.get_encoding("gpt2")
EOT = enc._special_tokens["<|endoftext|>"]


def documents(parquet_dir):
    """The `text` column of every file, in file order, as the dicts a datasets.Dataset yields."""
    files = sorted(glob.glob(os.path.join(parquet_dir, "**", "*.parquet"), recursive=True))
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(columns=["text"], batch_size=1024):
            for text in batch.column(0).to_pylist():
                yield {"text": text}


def tokenize(doc):
    ids = np.array([EOT] + enc.encode_ordinary(doc["text"]))
    assert (0 <= ids).all() and (ids < 2**16).all(), "token id outside uint16"
    return ids.astype(np.uint16)


def write_shard(path, ids):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(ids.tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("parquet_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--shard-tokens", type=int, default=10**8)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    start = time.time()
    first_train_shard_s = None
    shard = np.empty((a.shard_tokens,), dtype=np.uint16)
    filled, index, total, docs = 0, 0, 0, 0

    def flush(ids):
        nonlocal index, first_train_shard_s
        split = "val" if index == 0 else "train"
        write_shard(os.path.join(a.out_dir, "edufineweb_%s_%06d.bin" % (split, index)), ids)
        if split == "train" and first_train_shard_s is None:
            first_train_shard_s = time.time() - start
        index += 1

    with mp.Pool(a.procs) as pool:
        for ids in pool.imap(tokenize, documents(a.parquet_dir), chunksize=16):
            docs += 1
            total += len(ids)
            if filled + len(ids) < a.shard_tokens:
                shard[filled:filled + len(ids)] = ids
                filled += len(ids)
                continue
            room = a.shard_tokens - filled  # fill this shard to the brim, the rest starts the next
            shard[filled:] = ids[:room]
            flush(shard)
            shard[:len(ids) - room] = ids[room:]
            filled = len(ids) - room
    if filled:
        flush(shard[:filled])
    seconds = time.time() - start
    print(json.dumps({"documents": docs, "tokens": total, "seconds": round(seconds, 2),
                      "tokens_per_s": round(total / seconds), "shards": index,
                      "first_train_shard_s": None if first_train_shard_s is None else round(first_train_shard_s, 2)}))


if __name__ == "__main__":
    main()
