"""Writes a FineWeb-Edu-like Parquet corpus from the bundled tiny-shakespeare, for the Parquet
benchmark (tools/parquet_bench/run.sh). No network.

    make_corpus.py OUT_DIR [--mb 520] [--file-mb 260] [--rows-per-group 1000] [--compression snappy] [--seed 1]

Documents are runs of consecutive speeches (blank-line separated) of about 1 to 8 KB, as web
documents are, drawn in a shuffled order, repeated until the corpus holds --mb MB of text.
Files are named like the hub's (OUT_DIR/data/CC-MAIN-2024-10/000_00000.parquet, ...) with a
`text` (string) and an `id` column, and row groups of --rows-per-group documents (datatrove,
which wrote FineWeb, writes 1,000-row batches).
"""
import argparse
import os
import random
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def speeches():
    raw = subprocess.run(["zstd", "-q", "-d", "-c", os.path.join(ROOT, "datasets/data/tinyshakespeare/tinyshakespeare.txt.zst")],
                         check=True, capture_output=True).stdout.decode("utf-8")
    return [s.strip("\n") + "\n" for s in raw.split("\n\n") if s.strip()]


def documents(parts, rng):
    """Runs of consecutive speeches of 1 to 8 KB each, in one shuffled pass over the text."""
    docs, i = [], 0
    while i < len(parts):
        want = rng.randint(1000, 8000)
        j, size = i, 0
        while j < len(parts) and size < want:
            size += len(parts[j]) + 1
            j += 1
        docs.append("\n".join(parts[i:j]))
        i = j
    rng.shuffle(docs)
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=520)
    ap.add_argument("--file-mb", type=float, default=260)
    ap.add_argument("--rows-per-group", type=int, default=1000)
    ap.add_argument("--compression", default="snappy")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    parts = speeches()
    total, file_no, doc_id = 0, 0, 0
    limit, per_file = a.mb * 1e6, a.file_mb * 1e6
    schema = pa.schema([("text", pa.string()), ("id", pa.string())])
    while total < limit:
        path = os.path.join(a.out, "data", "CC-MAIN-2024-10", "%03d_00000.parquet" % file_no)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        in_file = 0
        with pq.ParquetWriter(path, schema, compression=a.compression) as w:
            pending = []
            while in_file < per_file and total < limit:
                for d in documents(parts, rng):
                    pending.append(d)
                    in_file += len(d.encode())
                    total += len(d.encode())
                    if len(pending) == a.rows_per_group:
                        ids = ["<urn:uuid:%d>" % (doc_id + k) for k in range(len(pending))]
                        w.write_table(pa.table({"text": pending, "id": ids}, schema=schema))
                        doc_id += len(pending)
                        pending = []
                    if in_file >= per_file or total >= limit:
                        break
            if pending:
                ids = ["<urn:uuid:%d>" % (doc_id + k) for k in range(len(pending))]
                w.write_table(pa.table({"text": pending, "id": ids}, schema=schema))
                doc_id += len(pending)
        print("%s: %.1f MB of text, %.1f MB on disk" % (path, in_file / 1e6, os.path.getsize(path) / 1e6))
        file_no += 1
    print("corpus: %d documents, %.1f MB of text in %d files" % (doc_id, total / 1e6, file_no))


if __name__ == "__main__":
    main()
