// Parquet documents through Arrow C++ (see parquet_reader.h). A decoding thread walks the epoch's
// row-group order, reads the text column's values through Parquet's column reader and copies them
// into pieces of about 1 MiB, which go to the consumer through a queue bounded in bytes and come
// back to be refilled; the consumer hands out views of the rows and keeps the position.
//
// Measured on the Parquet benchmark's corpus (docs/parquet.md): reading through Arrow arrays cost
// the decoding thread about 4 ms of CPU per MB of text, a quarter of it copies (page -> Arrow
// builder, the builder's growth, the array's transfer) and a tenth page faults on fresh buffers;
// this path is about 3 ms per MB, two thirds of it snappy itself.
#include "datasets/parquet_reader.h"

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
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "datasets/splitmix.h"

namespace pipeline::datasets {
namespace fs = std::filesystem;
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

// One Parquet file opened for reading the text column.
struct OpenedFile {
  std::unique_ptr<parquet::arrow::FileReader> reader;
  int leaf = -1;  // the column's index among the file's leaf columns
};

OpenedFile open_parquet(std::shared_ptr<arrow::io::RandomAccessFile> in, const std::string& name,
                        const std::string& column) {
  OpenedFile f;
  try {
    parquet::arrow::FileReaderBuilder builder;
    parquet::ReaderProperties reader_props(pool());
    reader_props.set_page_checksum_verification(true);  // where the writer stored CRCs (cheap)
    check(builder.Open(std::move(in), reader_props),
          name + ": not a readable Parquet file (a truncated file or a corrupt footer)");
    parquet::ArrowReaderProperties props;
    props.set_use_threads(false);  // decode on the calling thread (the reader's own), not Arrow's pool
    props.set_pre_buffer(false);   // no reads on Arrow's I/O threads either
    auto built = builder.memory_pool(pool())->properties(props)->Build();
    check(built.status(), name + ": not a readable Parquet file");
    f.reader = std::move(built).ValueUnsafe();
    std::shared_ptr<arrow::Schema> schema;
    check(f.reader->GetSchema(&schema), name + ": unreadable schema");
    const int field = schema->GetFieldIndex(column);
    if (field < 0) {
      std::string names;
      for (const auto& fld : schema->fields()) names += (names.empty() ? "" : ", ") + fld->name();
      throw DatasetError(name + ": no column \"" + column + "\" (the file has: " + names +
                         "); choose one with the `column` option");
    }
    const auto& type = schema->field(field)->type();
    if (type->id() != arrow::Type::STRING && type->id() != arrow::Type::LARGE_STRING)
      throw DatasetError(name + ": column \"" + column + "\" holds " + type->ToString() +
                         ", expected string or large_string");
    f.leaf = f.reader->parquet_reader()->metadata()->schema()->ColumnIndex(column);
    if (f.leaf < 0) throw DatasetError(name + ": column \"" + column + "\" is not a top-level column");
  } catch (const parquet::ParquetException& e) {
    throw DatasetError(name + ": not a readable Parquet file: " + e.what());
  }
  return f;
}

OpenedFile open_parquet_file(const fs::path& path, const std::string& column) {
  auto in = arrow::io::ReadableFile::Open(path.string(), pool());
  check(in.status(), path.string() + ": cannot open");
  return open_parquet(std::move(in).ValueUnsafe(), path.string(), column);
}

// Calls on_row(v) for each row of row group g in order, v the row's text or nullptr for a null,
// until on_row returns false; returns the rows passed. Reads through Parquet's column reader
// rather than Arrow arrays: the values are views into the decompressed page (or its dictionary),
// copied once by on_row, with no Arrow builder, growth copies or array transfer in between.
template <class OnRow>
uint64_t for_each_row(const OpenedFile& f, int g, const std::string& where, int64_t batch_rows, OnRow&& on_row) {
  uint64_t rows = 0;
  try {
    std::shared_ptr<parquet::ColumnReader> column = f.reader->parquet_reader()->RowGroup(g)->Column(f.leaf);
    auto* reader = dynamic_cast<parquet::ByteArrayReader*>(column.get());
    if (!reader) throw DatasetError(where + ": the text column is not stored as BYTE_ARRAY");
    const int16_t max_def = column->descr()->max_definition_level();
    if (column->descr()->max_repetition_level() != 0) throw DatasetError(where + ": the text column is repeated");
    std::vector<int16_t> def(static_cast<size_t>(max_def > 0 ? batch_rows : 0));
    std::vector<parquet::ByteArray> values(static_cast<size_t>(batch_rows));
    while (reader->HasNext()) {
      int64_t got = 0;
      const int64_t levels = reader->ReadBatch(batch_rows, max_def > 0 ? def.data() : nullptr, nullptr, values.data(), &got);
      if (levels <= 0) break;
      if (got < 0 || got > levels) throw DatasetError(where + ": a page holds more values than rows");
      int64_t v = 0;
      for (int64_t i = 0; i < levels; ++i) {
        const bool present = max_def == 0 || def[static_cast<size_t>(i)] == max_def;
        if (present && v == got) throw DatasetError(where + ": a page holds fewer values than its levels say");
        const parquet::ByteArray* value = present ? &values[static_cast<size_t>(v++)] : nullptr;
        ++rows;
        if (!on_row(value)) return rows;
      }
    }
  } catch (const parquet::ParquetException& e) {
    throw DatasetError(where + ": " + e.what());
  }
  return rows;
}

std::string_view view(const parquet::ByteArray& v) { return {reinterpret_cast<const char*>(v.ptr), v.len}; }

// Decoded rows [first_row, first_row + ends.size()) of one row group: their text back to back,
// where each ends, and which are null.
struct Piece {
  enum class Kind { rows, unit_end, end, error } kind = Kind::rows;
  uint64_t epoch = 0, k = 0;  // position of the row group in the epoch's order
  uint64_t first_row = 0;     // within the row group
  uint64_t global_first = 0;  // index of first_row among the epoch's rows in order (document split)
  std::string text;
  std::vector<uint64_t> ends;
  std::vector<uint8_t> null;
  size_t bytes = 0;
  std::exception_ptr error;
};

// Text held in one piece: pieces this size are consumed while still in cache, and a row group
// (FineWeb's hold about 1,000 documents, some MB) is several pieces.
constexpr size_t kPieceBytes = size_t(1) << 20;

}  // namespace

bool parquet_available() { return true; }

struct ParquetDocumentReader::Impl {
  struct Unit {
    uint32_t file;
    int row_group;
    uint64_t rows;
  };

  // Set by open(), read-only afterwards (both threads read them).
  std::vector<fs::path> files;
  std::vector<Unit> units;
  uint64_t total_rows = 0;
  ParquetReaderOptions o;
  bool loop = false;
  bool by_row_group = true;  // the rank split: by row group, or by row within every row group

  // The queue between the decoding thread and the consumer.
  std::mutex mu;
  std::condition_variable can_push, can_pop;
  std::deque<Piece> queue;
  std::vector<Piece> spare;  // consumed pieces, for the decoder to fill again
  size_t queued_bytes = 0;
  bool stop = false;
  std::thread decoder;

  // Consumer state.
  DatasetPosition pos;
  Piece cur;
  size_t cur_row = 0;
  bool ended = false;
  uint64_t nulls = 0, documents = 0;
  uint64_t last_epoch_seen = 0, empty_epochs = 0, documents_at_epoch_start = 0;

  ~Impl() { shutdown(); }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    can_push.notify_all();
    if (decoder.joinable()) decoder.join();
  }

  // The epoch's order of row groups: indices into `units`.
  std::vector<uint32_t> order(uint64_t epoch) const {
    std::vector<uint32_t> ord(units.size());
    std::iota(ord.begin(), ord.end(), 0u);
    if (o.shuffle) {
      uint64_t state = splitmix64(o.seed ^ splitmix64(epoch + 0x5041525155455431ull));  // "PARQUET1"
      for (size_t i = ord.size(); i > 1; --i) {
        state = splitmix64(state);
        std::swap(ord[i - 1], ord[static_cast<size_t>(state % i)]);
      }
    }
    return ord;
  }

  bool owns_unit(uint64_t k) const { return !by_row_group || o.partition.owns(k); }

  // Decoding thread: false once the reader is closing.
  bool push(Piece p) {
    std::unique_lock<std::mutex> lock(mu);
    // Bounded in bytes; a piece larger than the bound still goes into an empty queue.
    can_push.wait(lock, [&] { return stop || queue.empty() || queued_bytes + p.bytes <= o.read_ahead_bytes; });
    if (stop) return false;
    queued_bytes += p.bytes;
    queue.push_back(std::move(p));
    can_pop.notify_one();
    return true;
  }

  void decode(DatasetPosition start) {
    try {
      decode_loop(start);
    } catch (...) {
      Piece p;
      p.kind = Piece::Kind::error;
      p.error = std::current_exception();
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(p));
      can_pop.notify_one();
    }
  }

  // A piece to fill: a recycled one (its buffers keep their capacity: no fresh pages to fault in
  // for every row group) or a new one.
  Piece fresh_piece() {
    std::lock_guard<std::mutex> lock(mu);
    if (spare.empty()) return Piece{};
    Piece p = std::move(spare.back());
    spare.pop_back();
    return p;
  }

  void recycle(Piece&& p) {
    if (p.kind != Piece::Kind::rows) return;
    p.text.clear();
    p.ends.clear();
    p.null.clear();
    std::lock_guard<std::mutex> lock(mu);
    if (spare.size() < 4) spare.push_back(std::move(p));
  }

  void decode_loop(DatasetPosition start) {
    uint64_t epoch = start.epoch, k = start.shard, skip = start.item;
    // The most recently used file stays open: consecutive row groups often share one.
    uint32_t open_index = UINT32_MAX;
    OpenedFile open;
    for (;;) {
      const std::vector<uint32_t> ord = order(epoch);
      uint64_t global = 0;
      for (uint64_t j = 0; j < k; ++j) global += units[ord[j]].rows;
      for (; k < ord.size(); global += units[ord[k]].rows, ++k, skip = 0) {
        if (!owns_unit(k)) continue;
        const Unit& u = units[ord[k]];
        if (open_index != u.file) {
          open = open_parquet_file(files[u.file], o.column);
          open_index = u.file;
        }
        const std::string where = files[u.file].string() + ": row group " + std::to_string(u.row_group);
        Piece p = fresh_piece();
        bool closing = false;
        // Queues the rows gathered so far; false once the reader is closing.
        auto flush = [&] {
          if (p.ends.empty()) return true;
          p.epoch = epoch;
          p.k = k;
          p.global_first = global + p.first_row;
          p.bytes = 64 + p.text.size() + p.ends.size() * (sizeof(uint64_t) + 1);  // the bound counts text bytes, and a little per row
          if (!push(std::move(p))) return false;
          p = fresh_piece();
          return true;
        };
        uint64_t row = 0;
        const uint64_t rows = for_each_row(open, u.row_group, where, o.batch_rows, [&](const parquet::ByteArray* v) {
          if (row++ < skip) return true;  // resumed inside this row group
          if (p.ends.empty()) p.first_row = row - 1;
          if (v) p.text.append(view(*v));
          p.ends.push_back(p.text.size());
          p.null.push_back(v == nullptr);
          if (p.ends.size() >= static_cast<size_t>(o.batch_rows) || p.text.size() >= kPieceBytes) {
            if (!flush()) closing = true;
          }
          return !closing;
        });
        if (closing || !flush()) return;
        if (rows != u.rows)
          throw DatasetError(where + ": decoded " + std::to_string(rows) + " rows, but the footer records " +
                             std::to_string(u.rows));
        Piece end;
        end.kind = Piece::Kind::unit_end;
        end.epoch = epoch;
        end.k = k;
        if (!push(std::move(end))) return;
      }
      if (!loop) {
        Piece end;
        end.kind = Piece::Kind::end;
        end.epoch = epoch;
        push(std::move(end));
        return;
      }
      ++epoch;
      k = 0;
    }
  }

  Piece pop() {
    std::unique_lock<std::mutex> lock(mu);
    can_pop.wait(lock, [&] { return !queue.empty(); });
    Piece p = std::move(queue.front());
    queue.pop_front();
    queued_bytes -= p.bytes;
    can_push.notify_one();
    return p;
  }

  bool next(std::string_view& doc, DocMark* mark) {
    for (;;) {
      if (cur_row < cur.ends.size()) {
        const size_t i = cur_row++;
        pos.item = cur.first_row + i + 1;
        // Rows dealt to other ranks, and (resumed) rows consumed whole, are passed over.
        const DocKey key{cur.epoch, static_cast<uint32_t>(cur.k), cur.first_row + i, cur.global_first + i};
        const uint64_t skip = o.partition.take(key, by_row_group ? key.shard : key.ordinal);
        if (skip == DataProgress::kAll) continue;
        if (cur.null[i]) {
          ++nulls;
          continue;
        }
        const size_t begin = i == 0 ? 0 : cur.ends[i - 1];
        doc = std::string_view(cur.text).substr(begin, cur.ends[i] - begin);
        ++documents;
        if (mark) *mark = DocMark{0, key, 0, skip, by_row_group};
        return true;
      }
      if (ended) return false;
      recycle(std::move(cur));
      cur = pop();
      cur_row = 0;
      switch (cur.kind) {
        case Piece::Kind::rows:
          note_epoch(cur.epoch);
          pos = DatasetPosition{static_cast<uint32_t>(cur.k), cur.first_row, cur.epoch};
          break;
        case Piece::Kind::unit_end:
          pos = DatasetPosition{static_cast<uint32_t>(cur.k + 1), 0, cur.epoch};
          break;
        case Piece::Kind::end:
          pos = DatasetPosition{static_cast<uint32_t>(units.size()), 0, cur.epoch};
          ended = true;
          return false;
        case Piece::Kind::error:
          ended = true;
          std::rethrow_exception(cur.error);
      }
    }
  }

  // Looping over data that holds no document for this rank would spin forever: two whole epochs
  // without one is an error.
  void note_epoch(uint64_t epoch) {
    if (epoch == last_epoch_seen) return;
    empty_epochs = documents == documents_at_epoch_start ? empty_epochs + (epoch - last_epoch_seen) : 0;
    last_epoch_seen = epoch;
    documents_at_epoch_start = documents;
    if (empty_epochs >= 2)
      throw DatasetError(files.front().string() + " (and the other files of the source): column \"" + o.column +
                         "\" holds no non-null document for " + o.partition.str() + " in a whole epoch");
  }
};

ParquetDocumentReader::ParquetDocumentReader() = default;
ParquetDocumentReader::~ParquetDocumentReader() = default;
ParquetDocumentReader::ParquetDocumentReader(ParquetDocumentReader&&) noexcept = default;
ParquetDocumentReader& ParquetDocumentReader::operator=(ParquetDocumentReader&&) noexcept = default;

void ParquetDocumentReader::open(const fs::path& source, DatasetPosition start, bool loop, ParquetReaderOptions options) {
  options.partition.check();
  if (options.batch_rows < 1) throw DatasetError("parquet reader: batch_rows must be at least 1");
  impl_.reset();
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  impl->loop = loop;
  impl->files = list_parquet_files(source);
  if (impl->files.size() > UINT32_MAX) throw DatasetError(source.string() + ": too many files");
  for (uint32_t f = 0; f < impl->files.size(); ++f) {
    OpenedFile opened = open_parquet_file(impl->files[f], options.column);
    auto meta = opened.reader->parquet_reader()->metadata();
    for (int g = 0; g < meta->num_row_groups(); ++g) {
      const int64_t rows = meta->RowGroup(g)->num_rows();
      if (rows < 0)
        throw DatasetError(impl->files[f].string() + ": row group " + std::to_string(g) + ": the footer records " +
                           std::to_string(rows) + " rows");
      if (rows == 0) continue;  // an empty row group takes no place in the order
      impl->units.push_back({f, g, static_cast<uint64_t>(rows)});
      impl->total_rows += static_cast<uint64_t>(rows);
    }
  }
  const std::string what = source.string() + " (" + std::to_string(impl->files.size()) + " Parquet files, " +
                           std::to_string(impl->units.size()) + " row groups, " + std::to_string(impl->total_rows) +
                           " rows)";
  if (impl->total_rows == 0) throw DatasetError(what + ": holds no rows");
  if (impl->units.size() > UINT32_MAX) throw DatasetError(what + ": too many row groups for a position");
  if (impl->total_rows <= options.partition.rank)
    throw DatasetError(what + ": too few rows to give one to each of " + std::to_string(options.partition.world) +
                       " data-parallel ranks");
  impl->by_row_group = impl->units.size() >= options.partition.world;
  if (options.partition.done) {  // resumed: from the first row that may hold something left
    const DocKey at = options.partition.done->start();
    start = DatasetPosition{at.shard, at.item, at.epoch};
  }
  const bool at_epoch_end = start.shard == impl->units.size() && start.item == 0;
  if (start.shard > impl->units.size() || (start.shard == impl->units.size() && !at_epoch_end))
    throw DatasetError(what + ": position " + start.str() + " is past the end of the epoch");
  if (!at_epoch_end) {
    const Impl::Unit& u = impl->units[impl->order(start.epoch)[start.shard]];
    if (start.item > u.rows)
      throw DatasetError(what + ": position " + start.str() + " is past the end of " +
                         impl->files[u.file].string() + " row group " + std::to_string(u.row_group) + ", which has " +
                         std::to_string(u.rows) + " rows");
  }
  impl->pos = start;
  impl->last_epoch_seen = start.epoch;
  DatasetPosition from = start;
  if (at_epoch_end) {
    if (loop) {
      from = DatasetPosition{0, 0, start.epoch + 1};
    } else {
      impl->ended = true;
    }
  }
  if (!impl->ended) impl->decoder = std::thread([p = impl.get(), from] { p->decode(from); });
  impl_ = std::move(impl);
}

bool ParquetDocumentReader::next(std::string& document, DocMark* mark) {
  std::string_view v;
  if (!next(v, mark)) return false;
  document.assign(v);
  return true;
}

bool ParquetDocumentReader::next(std::string_view& document, DocMark* mark) {
  if (!impl_) throw DatasetError("parquet reader used before open()");
  return impl_->next(document, mark);
}

DatasetPosition ParquetDocumentReader::position() const { return impl_ ? impl_->pos : DatasetPosition{}; }

std::string ParquetDocumentReader::describe(const DatasetPosition& p) const {
  if (!impl_) return p.str();
  if (p.shard >= impl_->units.size()) return "epoch " + std::to_string(p.epoch) + ", end of the epoch";
  const Impl::Unit& u = impl_->units[impl_->order(p.epoch)[p.shard]];
  return "epoch " + std::to_string(p.epoch) + ", " + impl_->files[u.file].string() + " row group " +
         std::to_string(u.row_group) + " row " + std::to_string(p.item);
}

const std::vector<fs::path>& ParquetDocumentReader::files() const {
  static const std::vector<fs::path> none;
  return impl_ ? impl_->files : none;
}
uint64_t ParquetDocumentReader::row_groups() const { return impl_ ? impl_->units.size() : 0; }
uint64_t ParquetDocumentReader::rows() const { return impl_ ? impl_->total_rows : 0; }
uint64_t ParquetDocumentReader::nulls_skipped() const { return impl_ ? impl_->nulls : 0; }
uint64_t ParquetDocumentReader::documents_read() const { return impl_ ? impl_->documents : 0; }

std::vector<std::string> read_parquet_buffer(std::string_view bytes, const std::string& name, const std::string& column,
                                             size_t max_documents) {
  auto buffer = std::make_shared<arrow::Buffer>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                static_cast<int64_t>(bytes.size()));
  OpenedFile f = open_parquet(std::make_shared<arrow::io::BufferReader>(buffer), name, column);
  std::vector<std::string> docs;
  auto meta = f.reader->parquet_reader()->metadata();
  for (int g = 0; g < meta->num_row_groups() && docs.size() < max_documents; ++g)
    for_each_row(f, g, name + ": row group " + std::to_string(g), 256, [&](const parquet::ByteArray* v) {
      if (v) docs.emplace_back(view(*v));
      return docs.size() < max_documents;
    });
  return docs;
}

}  // namespace pipeline::datasets
