// Documents from the text column of Parquet files (the Hugging Face hub's format: FineWeb-Edu is
// `data/*/*.parquet` with a `text` column), read with Arrow C++ one row group at a time, as a
// document source with the shape of TextDatasetReader: open at a position, next() documents,
// position() to resume from.
//
// The unit of order is the row group. An epoch reads every row group of every file once, in the
// files' sorted path order and each file's row-group order, or (shuffle, the default) in an order
// drawn from (seed, epoch): a new order each epoch, the same for the same seed. Inside a row group
// rows keep their order. Empty row groups take no place in the order.
//
// Data-parallel ranks: with at least as many (non-empty) row groups as ranks, rank r reads the row groups at
// positions k = r, r + world, ... of the epoch's order and decodes nothing else; with fewer, every
// rank reads every row group and keeps the rows whose index in the epoch's order is r modulo world
// (as text shards do). Either way the split depends only on the files, the seed and the world
// size, and the ranks together read every document of an epoch exactly once.
//
// Position: DatasetPosition{epoch, shard = k, item = rows of the row group at position k already
// consumed}. It names (file, row group, row) through the epoch's order (describe() says which), so
// a resumed reader continues at the exact row. (k == row groups, item == 0) ends an epoch.
//
// Decoding (decompression included) happens on a thread of the reader's own, never on the
// caller's (a TBB worker in a training graph), at most `read_ahead_bytes` of decoded text ahead of
// the consumer. Null rows are skipped and counted. A missing column, a column that is not text
// (string, large_string, string_view or a dictionary of them), a file that is not Parquet (bad
// magic, corrupt footer, truncated) each throw DatasetError naming the file; a row group that
// fails to decode names the file and row group.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/plan/position.h"
#include "datasets/plan/partition.h"

namespace pipeline::datasets {

/// Whether `source` names Parquet input: a *.parquet file, a glob whose pattern ends in .parquet,
/// or a directory without manifest.json that holds *.parquet files (at any depth).
bool is_parquet_source(const std::filesystem::path& source);

/// The Parquet files `source` names, sorted by path: the file itself; the matches of a glob
/// (`*`, `?`, `[...]`); or a directory's *.parquet files at any depth, names starting with '.'
/// skipped, and only those under `data/` when it has one (a hub snapshot, `data/*/*.parquet`).
/// Throws DatasetError when nothing matches.
std::vector<std::filesystem::path> list_parquet_files(const std::filesystem::path& source);

struct ParquetReaderOptions {
  std::string column = "text";  // a text column (string, large_string, string_view, dictionary)
  bool shuffle = true;          // row groups in an order drawn from (seed, epoch)
  uint64_t seed = 0;
  Partition partition = {};
  size_t read_ahead_bytes = size_t(64) << 20;  // decoded text held ahead of the consumer
  int64_t batch_rows = 4096;                   // rows read at a time, and at most in one queued piece
};

/// Single consumer; the decoding thread is the reader's own.
/// Example:
///   ParquetDocumentReader r;
///   r.open("fineweb-edu/sample/10BT", {}, /*loop=*/true, {.seed = 1337});
///   for (std::string doc; r.next(doc);) use(doc);
class ParquetDocumentReader {
 public:
  ParquetDocumentReader();
  ~ParquetDocumentReader();
  ParquetDocumentReader(ParquetDocumentReader&&) noexcept;
  ParquetDocumentReader& operator=(ParquetDocumentReader&&) noexcept;

  /// Lists the files, reads and checks every footer and the column's type, and starts decoding
  /// at `start`. Throws DatasetError naming the file.
  void open(const std::filesystem::path& source, DatasetPosition start = {}, bool loop = false,
            ParquetReaderOptions options = {});
  /// The next non-null document of this rank; false at the end of the data when not looping.
  /// `mark` (optional) receives its place (shard: the row group's place in the epoch's order,
  /// item: the row) and the tokens of it to drop (partition.h). With `partition.done` (a resume),
  /// open() starts at the first row left and ignores its `start`.
  bool next(std::string& document, DocMark* mark = nullptr);
  /// The same, as a view into the reader's decoded text, valid until the next call (read_shards
  /// appends it to its chunk: one copy of the text fewer).
  bool next(std::string_view& document, DocMark* mark = nullptr);
  DatasetPosition position() const;
  /// "epoch E, FILE row group G row R" for a position (in logs and errors).
  std::string describe(const DatasetPosition& p) const;

  const std::vector<std::filesystem::path>& files() const;
  uint64_t row_groups() const;  // non-empty ones, in all files
  uint64_t rows() const;        // in all files, nulls included
  uint64_t nulls_skipped() const;
  uint64_t documents_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The open-and-first-read path on one Parquet file held in memory: checks the footer and the
/// column as open() does, then returns up to `max_documents` non-null documents from the first
/// row groups. For the fuzz target and tests. Throws DatasetError naming `name`.
std::vector<std::string> read_parquet_buffer(std::string_view bytes, const std::string& name,
                                             const std::string& column = "text", size_t max_documents = 16);

}  // namespace pipeline::datasets
