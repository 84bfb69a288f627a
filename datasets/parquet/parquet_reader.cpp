// Parquet documents (see parquet_reader.h). A decoding thread walks the epoch's row-group order,
// reads the text column's values through the Arrow module (parquet_module.h, loaded at the first
// open) and copies them into pieces of about 1 MiB, which go to the consumer through a queue
// bounded in bytes and come back to be refilled; the consumer hands out views of the rows and
// keeps the position.
#include "datasets/parquet/parquet_reader.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "datasets/parquet/parquet_module.h"
#include "datasets/plan/splitmix.h"

namespace pipeline::datasets {
namespace fs = std::filesystem;
namespace {

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

struct ParquetDocumentReader::Impl {
  struct Unit {
    uint32_t file;
    int row_group;
    uint64_t rows;
  };

  // Set by open(), read-only afterwards (both threads read them).
  const ParquetModule* module = nullptr;
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
    std::unique_ptr<ParquetFile> open;
    for (;;) {
      const std::vector<uint32_t> ord = order(epoch);
      uint64_t global = 0;
      for (uint64_t j = 0; j < k; ++j) global += units[ord[j]].rows;
      for (; k < ord.size(); global += units[ord[k]].rows, ++k, skip = 0) {
        if (!owns_unit(k)) continue;
        const Unit& u = units[ord[k]];
        if (open_index != u.file) {
          open = module->open_file(files[u.file], o.column);
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
        const uint64_t rows = open->for_each_row(u.row_group, where, o.batch_rows, [&](const std::string_view* v) {
          if (row++ < skip) return true;  // resumed inside this row group
          if (p.ends.empty()) p.first_row = row - 1;
          if (v) p.text.append(*v);
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
  impl->module = &parquet_module(source.string());
  for (uint32_t f = 0; f < impl->files.size(); ++f) {
    const std::unique_ptr<ParquetFile> opened = impl->module->open_file(impl->files[f], options.column);
    for (int g = 0; g < opened->row_groups(); ++g) {
      const int64_t rows = opened->row_group_rows(g);
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
  const std::unique_ptr<ParquetFile> f = parquet_module(name).open_buffer(bytes, name, column);
  std::vector<std::string> docs;
  for (int g = 0; g < f->row_groups() && docs.size() < max_documents; ++g)
    f->for_each_row(g, name + ": row group " + std::to_string(g), 256, [&](const std::string_view* v) {
      if (v) docs.emplace_back(*v);
      return docs.size() < max_documents;
    });
  return docs;
}

}  // namespace pipeline::datasets
