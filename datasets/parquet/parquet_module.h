// The line between the Parquet reader (parquet_reader.cpp, in pipeline_datasets) and Arrow C++
// (parquet_arrow.cpp, in the module libpipeline_parquet.so). libarrow and libparquet carry about
// 86,000 relocations between them, most of what the dynamic loader did when `pipeline` started
// (issue 17): linked into the executable, every command paid for them, including those that
// never read Parquet. So only the module links Arrow, and the reader loads it the first time a
// Parquet file is opened.
//
// What crosses the line is small on purpose: open a file (a path, a store's file, or bytes in
// memory) for a column, ask its row groups' row counts and byte ranges, walk a row group's rows
// (all at once with a callback, or pulled one at a time through a cursor that holds one batch of
// rows and Arrow's page buffers). The order of row groups, the ranks' split,
// positions and the decoding thread stay on this side, in code every build compiles. The module
// is built from the same tree as its caller (CMake builds it with pipeline_datasets), so C++
// types may cross; kParquetModuleVersion catches a module left over from another build.
// Exceptions cross too: the module throws DatasetError, caught here as DatasetError (libstdc++
// matches exception types across shared objects by name).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "datasets/io/store.h"

namespace pipeline::datasets {

inline constexpr const char* kParquetModuleFile = "libpipeline_parquet.so";
inline constexpr const char* kParquetModuleEntry = "pipeline_parquet_module";
/// Changes whenever ParquetModule, ParquetFile or ParquetRowCursor below change.
inline constexpr uint32_t kParquetModuleVersion = 2;

/// Receives a row group's rows in order: the row's text (a view into the decoded page, valid for
/// the call), or nullptr for a null. Returns false to stop.
using ParquetRowFn = bool (*)(void* context, const std::string_view* text);

/// A row group's rows, pulled one at a time: holds one batch of values (views into the current
/// page, or its dictionary) and the column reader's page buffers, never the whole row group.
/// The file it came from must outlive it.
class ParquetRowCursor {
 public:
  virtual ~ParquetRowCursor() = default;
  /// The next row: false at the end of the row group; else `null` says whether it is null and,
  /// if not, `text` views its value until the next call. Throws DatasetError naming the file and
  /// row group.
  virtual bool next(std::string_view& text, bool& null) = 0;
  /// Passes over the next `rows` rows; returns how many there were (fewer at the end).
  virtual uint64_t skip(uint64_t rows) = 0;
  /// Rows returned or skipped so far.
  virtual uint64_t rows() const = 0;
  /// Bytes of the batch it holds (Arrow's page buffers come on top: about one page).
  virtual size_t memory() const = 0;
};

/// One Parquet file opened for reading one string column: its footer and the column's type
/// checked. Not safe to share between threads.
class ParquetFile {
 public:
  virtual ~ParquetFile() = default;
  virtual int row_groups() const = 0;
  /// Rows of a row group as the footer records them (may be negative in a corrupt footer).
  virtual int64_t row_group_rows(int row_group) const = 0;
  /// The byte range of the row group's text column chunk (dictionary page included): what a
  /// unit of the row group reads. Throws DatasetError when the footer's range lies outside the file.
  virtual std::pair<uint64_t, uint64_t> row_group_range(int row_group) const = 0;
  /// A cursor over the row group's rows, reading `batch_rows` at a time. Throws DatasetError
  /// starting with `where`.
  virtual std::unique_ptr<ParquetRowCursor> open_rows(int row_group, const std::string& where,
                                                      int64_t batch_rows) const = 0;
  /// Calls fn(context, text) for each row of the row group, at most `batch_rows` read at a time,
  /// until fn returns false; returns the rows passed. Throws DatasetError starting with `where`.
  virtual uint64_t for_each_row(int row_group, const std::string& where, int64_t batch_rows, ParquetRowFn fn,
                                void* context) const = 0;

  /// The same with a callable `bool(const std::string_view*)`.
  template <class OnRow>
  uint64_t for_each_row(int row_group, const std::string& where, int64_t batch_rows, OnRow&& on_row) const {
    return for_each_row(
        row_group, where, batch_rows,
        [](void* c, const std::string_view* text) { return (*static_cast<std::remove_reference_t<OnRow>*>(c))(text); },
        &on_row);
  }
};

/// The module's entry point returns this table.
struct ParquetModule {
  uint32_t version = kParquetModuleVersion;
  /// Opens `path` for `column`. Throws DatasetError naming the file.
  std::unique_ptr<ParquetFile> (*open_file)(const std::filesystem::path& path, const std::string& column);
  /// Opens a file held in memory (`bytes` must outlive the result). Throws DatasetError naming `name`.
  std::unique_ptr<ParquetFile> (*open_buffer)(std::string_view bytes, const std::string& name,
                                              const std::string& column);
  /// Opens a store's file (datasets/io/store.h), read at offsets page by page rather than a
  /// column chunk at once. The file is used from the calling thread only. Throws DatasetError
  /// naming the file.
  std::unique_ptr<ParquetFile> (*open_range_file)(std::shared_ptr<io::RangeFile> file, const std::string& column);
};

using ParquetModuleEntry = const ParquetModule* (*)();

/// The module, loaded on first use and kept for the life of the process: from the executable's
/// directory, else from where the build put it (so tests and fuzz targets find it). Throws
/// DatasetError naming `source`, each path tried and why it did not load.
const ParquetModule& parquet_module(const std::string& source);

/// Loads the module from the first of `candidates` that loads (a new handle each call; for
/// parquet_module() and tests). Throws DatasetError naming `source` and, for each path, dlerror().
const ParquetModule& load_parquet_module(const std::vector<std::filesystem::path>& candidates,
                                         const std::string& source);

}  // namespace pipeline::datasets
