// libpipeline_parquet.so: the Arrow C++ half of the Parquet reader (parquet_module.h), loaded by
// parquet_reader.cpp the first time a Parquet file is opened. It opens a file or a buffer for one
// string column, checks the footer and the column's type, and reads a row group's values through
// Parquet's column reader; everything else (order, ranks, positions, the decoding thread) is the
// reader's. Exported: pipeline_parquet_module() alone.
//
// Measured on the Parquet benchmark's corpus (docs/parquet.md): reading through Arrow arrays cost
// the decoding thread about 4 ms of CPU per MB of text, a quarter of it copies (page -> Arrow
// builder, the builder's growth, the array's transfer) and a tenth page faults on fresh buffers;
// this path is about 3 ms per MB, two thirds of it snappy itself.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/io/memory.h>
#include <parquet/arrow/reader.h>
#include <parquet/column_reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>
#include <parquet/schema.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "datasets/parquet/parquet_module.h"
#include "datasets/dataset_error.h"

namespace pipeline::datasets {
namespace {

// Arrow's large buffers (a row group's column chunk as read from the file, the decompressed page)
// come and go once per row group. From malloc they are fresh pages each time, faulted in and
// zeroed by the kernel: measured, that was about 5% of the decoding thread. This pool keeps a few
// freed large blocks, by power-of-two size class, to hand out again. Underneath is the system
// allocator, not the wheel's bundled mimalloc/jemalloc: malloc is what the sanitizers see.
class RecyclingPool final : public arrow::MemoryPool {
 public:
  arrow::Status Allocate(int64_t size, int64_t alignment, uint8_t** out) override {
    const int c = size_class(size);
    if (c >= 0) {
      std::lock_guard<std::mutex> lock(mu_);
      auto& blocks = cached_[c];
      if (!blocks.empty()) {
        *out = blocks.back();
        blocks.pop_back();
        cached_bytes_ -= class_bytes(c);
        count(size);
        return arrow::Status::OK();
      }
    }
    ARROW_RETURN_NOT_OK(base()->Allocate(c >= 0 ? class_bytes(c) : size, alignment, out));
    count(size);
    return arrow::Status::OK();
  }

  arrow::Status Reallocate(int64_t old_size, int64_t new_size, int64_t alignment, uint8_t** ptr) override {
    const int old_class = size_class(old_size), new_class = size_class(new_size);
    if (old_class < 0 && new_class < 0) {
      ARROW_RETURN_NOT_OK(base()->Reallocate(old_size, new_size, alignment, ptr));
    } else if (old_class != new_class) {  // a class' block holds the whole class: no copy within one
      uint8_t* fresh = nullptr;
      ARROW_RETURN_NOT_OK(Allocate(new_size, alignment, &fresh));
      std::memcpy(fresh, *ptr, static_cast<size_t>(std::min(old_size, new_size)));
      Free(*ptr, old_size, alignment);
      *ptr = fresh;
      return arrow::Status::OK();
    }
    bytes_ += new_size - old_size;
    return arrow::Status::OK();
  }

  void Free(uint8_t* buffer, int64_t size, int64_t alignment) override {
    bytes_ -= size;
    const int c = size_class(size);
    if (c < 0) return base()->Free(buffer, size, alignment);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_[c].size() < 2 && cached_bytes_ + class_bytes(c) <= kMaxCachedBytes) {
        cached_[c].push_back(buffer);
        cached_bytes_ += class_bytes(c);
        return;
      }
    }
    base()->Free(buffer, class_bytes(c), alignment);
  }

  int64_t bytes_allocated() const override { return bytes_; }
  int64_t total_bytes_allocated() const override { return total_; }
  int64_t num_allocations() const override { return allocations_; }
  std::string backend_name() const override { return "recycling(" + base()->backend_name() + ")"; }

 private:
  static constexpr int kMinShift = 16, kMaxShift = 26;          // 64 KiB to 64 MiB blocks are kept
  static constexpr int64_t kMaxCachedBytes = int64_t(64) << 20;  // at most this much held unused
  static arrow::MemoryPool* base() { return arrow::system_memory_pool(); }
  static int64_t class_bytes(int c) { return int64_t(1) << (kMinShift + c); }
  static int size_class(int64_t size) {
    if (size < (int64_t(1) << (kMinShift - 1)) || size > (int64_t(1) << kMaxShift)) return -1;
    int c = 0;
    while (class_bytes(c) < size) ++c;
    return c;
  }
  void count(int64_t size) {
    bytes_ += size;
    total_ += size;
    ++allocations_;
  }

  std::mutex mu_;
  std::vector<uint8_t*> cached_[kMaxShift - kMinShift + 1];
  int64_t cached_bytes_ = 0;
  std::atomic<int64_t> bytes_{0}, total_{0}, allocations_{0};
};

arrow::MemoryPool* pool() {
  static RecyclingPool* p = new RecyclingPool;  // never destroyed: buffers may outlive static destruction order
  return p;
}

void check(const arrow::Status& st, const std::string& where) {
  if (!st.ok()) throw DatasetError(where + ": " + st.ToString());
}

std::string_view view(const parquet::ByteArray& v) { return {reinterpret_cast<const char*>(v.ptr), v.len}; }

// A store's file (datasets/io/store.h) as Arrow's RandomAccessFile: every read is a read at an
// offset, so Arrow's own position is all this keeps. Errors come back as an IOError status whose
// message is the store's (naming the file and the offset).
class RangeFileAdapter final : public arrow::io::RandomAccessFile {
 public:
  explicit RangeFileAdapter(std::shared_ptr<io::RangeFile> file) : file_(std::move(file)) {}

  arrow::Status Close() override {
    closed_ = true;
    return arrow::Status::OK();
  }
  bool closed() const override { return closed_; }
  arrow::Result<int64_t> Tell() const override { return position_; }
  arrow::Status Seek(int64_t position) override {
    if (position < 0) return arrow::Status::Invalid(file_->name(), ": seek to a negative offset");
    position_ = position;
    return arrow::Status::OK();
  }
  arrow::Result<int64_t> GetSize() override { return static_cast<int64_t>(file_->size()); }

  arrow::Result<int64_t> Read(int64_t nbytes, void* out) override {
    ARROW_ASSIGN_OR_RAISE(const int64_t n, ReadAt(position_, nbytes, out));
    position_ += n;
    return n;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t nbytes) override {
    ARROW_ASSIGN_OR_RAISE(auto buffer, ReadAt(position_, nbytes));
    position_ += buffer->size();
    return buffer;
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, bool, void* out) override {
    return ReadAt(position, nbytes, out);
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t nbytes, void* out) override {
    if (position < 0 || nbytes < 0) return arrow::Status::Invalid(file_->name(), ": a read at a negative offset or size");
    try {
      return static_cast<int64_t>(file_->read_at(static_cast<uint64_t>(position), out, static_cast<size_t>(nbytes)));
    } catch (const std::exception& e) {  // DatasetError: the file, the offset and why
      return arrow::Status::IOError(e.what());
    }
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes, bool) override {
    return ReadAt(position, nbytes);
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t nbytes) override {
    const int64_t size = static_cast<int64_t>(file_->size());
    const int64_t n = position >= size ? 0 : std::min(nbytes, size - position);
    ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::ResizableBuffer> buffer, arrow::AllocateResizableBuffer(n, pool()));
    ARROW_ASSIGN_OR_RAISE(const int64_t got, ReadAt(position, n, buffer->mutable_data()));
    ARROW_RETURN_NOT_OK(buffer->Resize(got, /*shrink_to_fit=*/false));
    return buffer;
  }

 private:
  std::shared_ptr<io::RangeFile> file_;
  int64_t position_ = 0;
  bool closed_ = false;
};

// A row group's rows, pulled: one batch of levels and values (views into the current page) at a
// time. ReadBatch never crosses a page, so a batch's views stay valid until the next ReadBatch.
class ArrowRowCursor final : public ParquetRowCursor {
 public:
  ArrowRowCursor(std::shared_ptr<parquet::ColumnReader> column, std::string where, int64_t batch_rows)
      : column_(std::move(column)), where_(std::move(where)), batch_rows_(batch_rows) {
    reader_ = dynamic_cast<parquet::ByteArrayReader*>(column_.get());
    if (!reader_) throw DatasetError(where_ + ": the text column is not stored as BYTE_ARRAY");
    if (column_->descr()->max_repetition_level() != 0) throw DatasetError(where_ + ": the text column is repeated");
    max_def_ = column_->descr()->max_definition_level();
    def_.resize(static_cast<size_t>(max_def_ > 0 ? batch_rows : 0));
    values_.resize(static_cast<size_t>(batch_rows));
  }

  bool next(std::string_view& text, bool& null) override {
    try {
      while (level_ == levels_) {
        if (!reader_->HasNext()) return false;
        int64_t got = 0;
        levels_ = reader_->ReadBatch(batch_rows_, max_def_ > 0 ? def_.data() : nullptr, nullptr, values_.data(), &got);
        if (levels_ <= 0) return false;
        if (got < 0 || got > levels_) throw DatasetError(where_ + ": a page holds more values than rows");
        values_in_batch_ = got;
        level_ = value_ = 0;
      }
      const bool present = max_def_ == 0 || def_[static_cast<size_t>(level_)] == max_def_;
      ++level_;
      ++rows_;
      null = !present;
      if (present) {
        if (value_ == values_in_batch_) throw DatasetError(where_ + ": a page holds fewer values than its levels say");
        text = view(values_[static_cast<size_t>(value_++)]);
      }
      return true;
    } catch (const parquet::ParquetException& e) {
      throw DatasetError(where_ + ": " + e.what());
    }
  }

  uint64_t skip(uint64_t rows) override {
    uint64_t done = 0;
    std::string_view text;
    bool null = false;
    while (done < rows && next(text, null)) ++done;
    return done;
  }

  uint64_t rows() const override { return rows_; }
  size_t memory() const override {
    return def_.capacity() * sizeof(int16_t) + values_.capacity() * sizeof(parquet::ByteArray);
  }

 private:
  std::shared_ptr<parquet::ColumnReader> column_;
  parquet::ByteArrayReader* reader_ = nullptr;
  std::string where_;
  int64_t batch_rows_;
  int16_t max_def_ = 0;
  std::vector<int16_t> def_;
  std::vector<parquet::ByteArray> values_;
  int64_t levels_ = 0, level_ = 0, values_in_batch_ = 0, value_ = 0;
  uint64_t rows_ = 0;
};

// One Parquet file opened for reading the text column.
class ArrowFile final : public ParquetFile {
 public:
  ArrowFile(std::unique_ptr<parquet::arrow::FileReader> reader, int leaf, std::string name, int64_t size)
      : reader_(std::move(reader)), leaf_(leaf), name_(std::move(name)), size_(size) {}

  int row_groups() const override { return metadata().num_row_groups(); }
  int64_t row_group_rows(int row_group) const override {
    try {
      return metadata().RowGroup(row_group)->num_rows();
    } catch (const parquet::ParquetException& e) {  // nothing but DatasetError leaves the module
      throw DatasetError(name_ + ": row group " + std::to_string(row_group) + ": " + e.what());
    }
  }

  std::pair<uint64_t, uint64_t> row_group_range(int g) const override {
    try {
      const auto chunk = metadata().RowGroup(g)->ColumnChunk(leaf_);
      int64_t start = chunk->data_page_offset();
      if (chunk->has_dictionary_page() && chunk->dictionary_page_offset() > 0)
        start = std::min(start, chunk->dictionary_page_offset());
      const int64_t bytes = chunk->total_compressed_size();
      if (start < 0 || bytes < 0 || start > size_ || bytes > size_ - start)
        throw DatasetError(name_ + ": row group " + std::to_string(g) + ": the footer puts the text column at bytes " +
                           std::to_string(start) + "+" + std::to_string(bytes) + ", outside the file's " +
                           std::to_string(size_) + " bytes");
      return {static_cast<uint64_t>(start), static_cast<uint64_t>(bytes)};
    } catch (const parquet::ParquetException& e) {
      throw DatasetError(name_ + ": row group " + std::to_string(g) + ": " + e.what());
    }
  }

  std::unique_ptr<ParquetRowCursor> open_rows(int g, const std::string& where, int64_t batch_rows) const override {
    if (batch_rows < 1) throw DatasetError(where + ": batch_rows must be at least 1");
    try {
      return std::make_unique<ArrowRowCursor>(reader_->parquet_reader()->RowGroup(g)->Column(leaf_), where, batch_rows);
    } catch (const parquet::ParquetException& e) {
      throw DatasetError(where + ": " + e.what());
    }
  }

  // Reads through Parquet's column reader rather than Arrow arrays: the values are views into the
  // decompressed page (or its dictionary), copied once by the caller's fn, with no Arrow builder,
  // growth copies or array transfer in between.
  uint64_t for_each_row(int g, const std::string& where, int64_t batch_rows, ParquetRowFn fn,
                        void* context) const override {
    uint64_t rows = 0;
    try {
      std::shared_ptr<parquet::ColumnReader> column = reader_->parquet_reader()->RowGroup(g)->Column(leaf_);
      auto* reader = dynamic_cast<parquet::ByteArrayReader*>(column.get());
      if (!reader) throw DatasetError(where + ": the text column is not stored as BYTE_ARRAY");
      const int16_t max_def = column->descr()->max_definition_level();
      if (column->descr()->max_repetition_level() != 0) throw DatasetError(where + ": the text column is repeated");
      std::vector<int16_t> def(static_cast<size_t>(max_def > 0 ? batch_rows : 0));
      std::vector<parquet::ByteArray> values(static_cast<size_t>(batch_rows));
      while (reader->HasNext()) {
        int64_t got = 0;
        const int64_t levels =
            reader->ReadBatch(batch_rows, max_def > 0 ? def.data() : nullptr, nullptr, values.data(), &got);
        if (levels <= 0) break;
        if (got < 0 || got > levels) throw DatasetError(where + ": a page holds more values than rows");
        int64_t v = 0;
        for (int64_t i = 0; i < levels; ++i) {
          const bool present = max_def == 0 || def[static_cast<size_t>(i)] == max_def;
          if (present && v == got) throw DatasetError(where + ": a page holds fewer values than its levels say");
          std::string_view text;
          if (present) text = view(values[static_cast<size_t>(v++)]);
          ++rows;
          if (!fn(context, present ? &text : nullptr)) return rows;
        }
      }
    } catch (const parquet::ParquetException& e) {
      throw DatasetError(where + ": " + e.what());
    }
    return rows;
  }

 private:
  const parquet::FileMetaData& metadata() const { return *reader_->parquet_reader()->metadata(); }

  std::unique_ptr<parquet::arrow::FileReader> reader_;
  int leaf_ = -1;  // the column's index among the file's leaf columns
  std::string name_;
  int64_t size_ = 0;  // the file's bytes
};

// `paged`: read a column chunk page by page (a buffered stream) instead of whole: what a cursor
// that holds one batch of rows needs.
std::unique_ptr<ParquetFile> open_parquet(std::shared_ptr<arrow::io::RandomAccessFile> in, const std::string& name,
                                          const std::string& column, bool paged = false) {
  try {
    int64_t size = 0;
    if (auto s = in->GetSize(); s.ok()) size = *s;
    parquet::arrow::FileReaderBuilder builder;
    parquet::ReaderProperties reader_props(pool());
    reader_props.set_page_checksum_verification(true);  // where the writer stored CRCs (cheap)
    if (paged) {
      reader_props.enable_buffered_stream();
      reader_props.set_buffer_size(int64_t(64) << 10);
    }
    check(builder.Open(std::move(in), reader_props),
          name + ": not a readable Parquet file (a truncated file or a corrupt footer)");
    parquet::ArrowReaderProperties props;
    props.set_use_threads(false);  // decode on the calling thread (the reader's own), not Arrow's pool
    props.set_pre_buffer(false);   // no reads on Arrow's I/O threads either
    auto built = builder.memory_pool(pool())->properties(props)->Build();
    check(built.status(), name + ": not a readable Parquet file");
    std::unique_ptr<parquet::arrow::FileReader> reader = std::move(built).ValueUnsafe();
    std::shared_ptr<arrow::Schema> schema;
    check(reader->GetSchema(&schema), name + ": unreadable schema");
    const int field = schema->GetFieldIndex(column);
    if (field < 0) {
      std::string names;
      for (const auto& fld : schema->fields()) names += (names.empty() ? "" : ", ") + fld->name();
      throw DatasetError(name + ": no column \"" + column + "\" (the file has: " + names +
                         "); name the text column with --column (pipeline prepare) or the reading stage's "
                         "`column` option (pipeline run)");
    }
    // Text as Arrow wrote it: string, large_string, string_view, or a dictionary of one of those
    // (a column Arrow held dictionary-encoded). Each is a UTF-8 BYTE_ARRAY column in the file,
    // read below by the Parquet reader itself, whatever the Arrow type recorded beside it.
    auto is_text = [](const arrow::DataType& t) {
      return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING || t.id() == arrow::Type::STRING_VIEW;
    };
    const auto& type = schema->field(field)->type();
    const bool text = is_text(*type) || (type->id() == arrow::Type::DICTIONARY &&
                                         is_text(*static_cast<const arrow::DictionaryType&>(*type).value_type()));
    if (!text)
      throw DatasetError(name + ": column \"" + column + "\" holds " + type->ToString() +
                         ", expected text (string, large_string, string_view, or a dictionary of strings)");
    const int leaf = reader->parquet_reader()->metadata()->schema()->ColumnIndex(column);
    if (leaf < 0) throw DatasetError(name + ": column \"" + column + "\" is not a top-level column");
    return std::make_unique<ArrowFile>(std::move(reader), leaf, name, size);
  } catch (const parquet::ParquetException& e) {
    throw DatasetError(name + ": not a readable Parquet file: " + e.what());
  }
}

std::unique_ptr<ParquetFile> open_file(const std::filesystem::path& path, const std::string& column) {
  auto in = arrow::io::ReadableFile::Open(path.string(), pool());
  check(in.status(), path.string() + ": cannot open");
  return open_parquet(std::move(in).ValueUnsafe(), path.string(), column);
}

std::unique_ptr<ParquetFile> open_buffer(std::string_view bytes, const std::string& name, const std::string& column) {
  auto buffer = std::make_shared<arrow::Buffer>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                static_cast<int64_t>(bytes.size()));
  return open_parquet(std::make_shared<arrow::io::BufferReader>(std::move(buffer)), name, column);
}

std::unique_ptr<ParquetFile> open_range_file(std::shared_ptr<io::RangeFile> file, const std::string& column) {
  const std::string name = file->name();
  return open_parquet(std::make_shared<RangeFileAdapter>(std::move(file)), name, column, /*paged=*/true);
}

}  // namespace
}  // namespace pipeline::datasets

extern "C" __attribute__((visibility("default"))) const pipeline::datasets::ParquetModule* pipeline_parquet_module() {
  using namespace pipeline::datasets;
  static_assert(std::is_same_v<decltype(&pipeline_parquet_module), ParquetModuleEntry>);
  static const ParquetModule module{kParquetModuleVersion, &open_file, &open_buffer, &open_range_file};
  return &module;
}
