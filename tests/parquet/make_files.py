"""Writes the Parquet files test_parquet reads, with pyarrow (tools/setup.sh's venv).

    make_files.py OUT_DIR

Document i is doc(i) below; tests/test_parquet.cpp computes the same strings. Files:
  snappy.parquet, zstd.parquet, none.parquet  documents 0..999, row groups of 100, by codec
  layout.parquet    row groups of 40, 0 (empty), 40, 25 rows; every 7th row null
  large.parquet     the same 100 documents as large_string, row groups of 30
  single.parquet    documents 0..9 in one row group
  checksums.parquet documents 0..299, zstd, page checksums, row groups of 100; checksums.parquet.rg1
                    holds "OFFSET BYTES" of row group 1's column chunk
  content.parquet   no "text" column: "content" (string) and "id" (int64)
  int_text.parquet  a "text" column of int64
  dict.parquet      documents 0..99 as dictionary<string> (what a categorical column round-trips as)
  view.parquet      documents 0..99 as string_view
  hub/data/CC-MAIN-2024-10/000_00000.parquet, hub/data/CC-MAIN-2024-18/000_00000.parquet,
  hub/README.md     a hub snapshot's layout: documents 0..49 and 50..99
  lanes/a.parquet   documents 0..399 in row groups of 25, every 11th row null (test_data_order)
  lanes/b.parquet   documents 400..639 in row groups of 40 and an empty one after the first
"""
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = ["the", "quick", "brown", "fox", "h\u00e9llo", "\u65e5\u672c", "jumps", "over", "lazy", "dog", "\U0001f600"]


def doc(i):
    return "document %d:" % i + "".join(" " + WORDS[(i * 7 + j) % len(WORDS)] for j in range(i % 13 + 1)) + "\n"


def write(path, values, row_group, type_=pa.string(), compression="snappy", name="text", **kw):
    t = pa.table({name: pa.array(values, type_)})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with pq.ParquetWriter(path, t.schema, compression=compression, **kw) as w:
        for start in range(0, len(values), row_group):
            w.write_table(t.slice(start, row_group))


def main(out):
    docs = [doc(i) for i in range(1000)]
    for codec in ("snappy", "zstd", "none"):
        write(os.path.join(out, codec + ".parquet"), docs, 100, compression=codec)
    layout = [None if i % 7 == 3 else doc(i) for i in range(105)]
    t = pa.table({"text": pa.array(layout, pa.string())})
    with pq.ParquetWriter(os.path.join(out, "layout.parquet"), t.schema, compression="zstd") as w:
        w.write_table(t.slice(0, 40))
        w.write_table(t.slice(0, 0))  # an empty row group
        w.write_table(t.slice(40, 40))
        w.write_table(t.slice(80, 25))
    write(os.path.join(out, "large.parquet"), docs[:100], 30, type_=pa.large_string())
    write(os.path.join(out, "single.parquet"), docs[:10], 10)
    path = os.path.join(out, "checksums.parquet")
    write(path, docs[:300], 100, compression="zstd", write_page_checksum=True)
    col = pq.ParquetFile(path).metadata.row_group(1).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    with open(path + ".rg1", "w") as f:  # where row group 1's column chunk lies: "OFFSET BYTES"
        f.write("%d %d\n" % (start, col.total_compressed_size))
    pq.write_table(pa.table({"content": docs[:10], "id": list(range(10))}), os.path.join(out, "content.parquet"))
    pq.write_table(pa.table({"text": pa.array(range(10), pa.int64())}), os.path.join(out, "int_text.parquet"))
    write(os.path.join(out, "dict.parquet"), docs[:100], 30, type_=pa.dictionary(pa.int32(), pa.string()))
    write(os.path.join(out, "view.parquet"), docs[:100], 30, type_=pa.string_view())
    write(os.path.join(out, "hub/data/CC-MAIN-2024-10/000_00000.parquet"), docs[:50], 20)
    write(os.path.join(out, "hub/data/CC-MAIN-2024-18/000_00000.parquet"), docs[50:100], 20)
    with open(os.path.join(out, "hub/README.md"), "w") as f:
        f.write("a dataset card\n")
    lanes = [None if i % 11 == 5 else doc(i) for i in range(400)]
    write(os.path.join(out, "lanes/a.parquet"), lanes, 25, compression="zstd")
    t = pa.table({"text": pa.array([doc(i) for i in range(400, 640)], pa.string())})
    with pq.ParquetWriter(os.path.join(out, "lanes/b.parquet"), t.schema, compression="snappy") as w:
        w.write_table(t.slice(0, 40))
        w.write_table(t.slice(0, 0))  # an empty row group: no unit
        for start in range(40, 240, 40):
            w.write_table(t.slice(start, 40))


if __name__ == "__main__":
    main(sys.argv[1])
