// Unit readers (unit_reader.h), one class per way a unit is laid out.
#include "datasets/units/unit_reader.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <list>
#include <string>

#include "datasets/dataset_error.h"
#include "datasets/parquet/parquet_module.h"
#include "datasets/shards/block_shard.h"
#include "datasets/shards/shard.h"

namespace pipeline::datasets {
namespace {

[[noreturn]] void too_few(const Catalog& c, const Unit& u, uint64_t asked, uint64_t has, const char* what) {
  throw DatasetError(c.describe(u) + ": cannot pass over " + std::to_string(asked) + " " + what + ": the unit holds " +
                     std::to_string(has));
}

// ---- block shards: the block decoded whole --------------------------------------------------

class BlockDocuments final : public DocumentUnit {
 public:
  explicit BlockDocuments(std::vector<char> payload, const Catalog& c, const Unit& u)
      : payload_(std::move(payload)), catalog_(c), unit_(u) {}

  bool next(std::string_view& document, uint64_t& item) override {
    if (at_ == payload_.size()) return false;
    uint32_t length = 0;  // the block's layout was checked when it was decoded
    std::memcpy(&length, payload_.data() + at_, 4);
    document = std::string_view(payload_.data() + at_ + 4, length);
    at_ += 4 + size_t(length);
    item = item_++;
    return true;
  }
  void skip(uint64_t items) override {
    for (uint64_t i = 0; i < items; ++i) {
      std::string_view d;
      uint64_t item = 0;
      if (!next(d, item)) too_few(catalog_, unit_, items, i, "documents");
    }
  }
  size_t memory() const override { return payload_.capacity(); }

 private:
  std::vector<char> payload_;
  const Catalog& catalog_;
  const Unit& unit_;
  size_t at_ = 0;
  uint64_t item_ = 0;
};

class BlockTokens final : public TokenUnit {
 public:
  BlockTokens(std::vector<char> payload, const Catalog& c, const Unit& u)
      : payload_(std::move(payload)), catalog_(c), unit_(u), tokens_(payload_.size() / 2) {}

  size_t read(std::span<uint16_t> out) override {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), tokens_ - offset_));
    std::memcpy(out.data(), payload_.data() + 2 * offset_, 2 * n);
    offset_ += n;
    return n;
  }
  void skip(uint64_t tokens) override {
    if (tokens > tokens_ - offset_) too_few(catalog_, unit_, tokens, tokens_ - offset_, "tokens");
    offset_ += tokens;
  }
  uint64_t offset() const override { return offset_; }
  size_t memory() const override { return payload_.capacity(); }

 private:
  std::vector<char> payload_;
  const Catalog& catalog_;
  const Unit& unit_;
  uint64_t tokens_, offset_ = 0;
};

// ---- shards of format 1: the shard's frame streamed from its start --------------------------

class StreamDocuments final : public DocumentUnit {
 public:
  StreamDocuments(std::unique_ptr<io::RangeFile> file, const Catalog& c, const Unit& u)
      : reader_(std::move(file), ShardKind::text), catalog_(c), unit_(u) {
    reader_.skip(u.first);  // the documents of the shard before this unit's range
  }

  bool next(std::string_view& document, uint64_t& item) override {
    if (item_ == unit_.documents) return false;
    if (!reader_.next_document(doc_))
      throw DatasetError(catalog_.describe(unit_) + ": the shard ends after " + std::to_string(unit_.first + item_) +
                         " documents");
    document = doc_;
    item = item_++;
    return true;
  }
  void skip(uint64_t items) override {
    if (items > unit_.documents) too_few(catalog_, unit_, items, unit_.documents, "documents");
    reader_.skip(items);
    item_ = items;
  }
  size_t memory() const override { return reader_.memory_high_water() + doc_.capacity(); }

 private:
  ShardReader reader_;
  const Catalog& catalog_;
  const Unit& unit_;
  std::string doc_;
  uint64_t item_ = 0;
};

// Token shards of format 1: a range of documents is found by counting the end-of-text ids that
// start them, so the stream is read through a small buffer that can stop at a document's start.
class StreamTokens final : public TokenUnit {
 public:
  StreamTokens(std::unique_ptr<io::RangeFile> file, const Catalog& c, const Unit& u)
      : reader_(std::move(file), ShardKind::tokens), catalog_(c), unit_(u), buf_(4096) {
    // Up to the end-of-text id that starts document `first`.
    for (uint64_t seen = 0;;) {
      if (pos_ == end_ && !fill())
        throw DatasetError(catalog_.describe(unit_) + ": the shard ends after " + std::to_string(seen) + " documents");
      if (buf_[pos_] == kShardEotId && seen++ == u.first) break;
      ++pos_;
    }
  }

  size_t read(std::span<uint16_t> out) override {
    size_t n = 0;
    while (n < out.size()) {
      if (pos_ == end_ && !fill()) break;
      const uint16_t t = buf_[pos_];
      if (t == kShardEotId && documents_ == unit_.documents) break;  // the next range's first document
      documents_ += t == kShardEotId;
      out[n++] = t;
      ++pos_;
    }
    offset_ += n;
    return n;
  }
  void skip(uint64_t tokens) override {
    std::vector<uint16_t> scratch(4096);
    for (uint64_t left = tokens; left > 0;) {
      const size_t n = read(std::span<uint16_t>(scratch).first(static_cast<size_t>(std::min<uint64_t>(left, 4096))));
      if (n == 0) too_few(catalog_, unit_, tokens, tokens - left, "tokens");
      left -= n;
    }
  }
  uint64_t offset() const override { return offset_; }
  size_t memory() const override { return reader_.memory_high_water() + buf_.capacity() * sizeof(uint16_t); }

 private:
  bool fill() {
    pos_ = 0;
    end_ = reader_.read_tokens(buf_);
    return end_ > 0;
  }

  ShardReader reader_;
  const Catalog& catalog_;
  const Unit& unit_;
  std::vector<uint16_t> buf_;
  size_t pos_ = 0, end_ = 0;
  uint64_t documents_ = 0, offset_ = 0;
};

// ---- llm.c: tokens read where they lie -------------------------------------------------------

class LlmcTokens final : public TokenUnit {
 public:
  LlmcTokens(std::unique_ptr<io::RangeFile> file, const Catalog& c, const Unit& u)
      : file_(std::move(file)), catalog_(c), unit_(u) {}

  size_t read(std::span<uint16_t> out) override {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), unit_.items - offset_));
    if (n == 0) return 0;
    const uint64_t at = unit_.offset + 2 * offset_;
    if (file_->read_at(at, out.data(), 2 * n) != 2 * n)
      throw DatasetError(catalog_.describe(unit_) + ": the file ends before byte offset " + std::to_string(at + 2 * n));
    offset_ += n;
    return n;
  }
  void skip(uint64_t tokens) override {
    if (tokens > unit_.items - offset_) too_few(catalog_, unit_, tokens, unit_.items - offset_, "tokens");
    offset_ += tokens;
  }
  uint64_t offset() const override { return offset_; }
  size_t memory() const override { return 0; }

 private:
  std::unique_ptr<io::RangeFile> file_;
  const Catalog& catalog_;
  const Unit& unit_;
  uint64_t offset_ = 0;
};

// ---- Parquet: a row cursor over the row group ------------------------------------------------

constexpr int64_t kParquetBatchRows = 256;

class ParquetDocuments final : public DocumentUnit {
 public:
  ParquetDocuments(std::shared_ptr<ParquetFile> file, const Catalog& c, const Unit& u)
      : file_(std::move(file)), catalog_(c), unit_(u),
        cursor_(file_->open_rows(static_cast<int>(u.place), c.describe(u), kParquetBatchRows)) {}

  bool next(std::string_view& document, uint64_t& item) override {
    bool null = false;
    while (cursor_->next(document, null)) {
      if (null) continue;  // counted as an item, never returned
      item = cursor_->rows() - 1;
      return true;
    }
    if (cursor_->rows() != unit_.items)
      throw DatasetError(catalog_.describe(unit_) + ": decoded " + std::to_string(cursor_->rows()) +
                         " rows, but the footer records " + std::to_string(unit_.items));
    return false;
  }
  void skip(uint64_t items) override {
    if (const uint64_t n = cursor_->skip(items); n < items) too_few(catalog_, unit_, items, n, "rows");
  }
  size_t memory() const override { return cursor_->memory(); }

 private:
  std::shared_ptr<ParquetFile> file_;  // before the cursor, which must not outlive it
  const Catalog& catalog_;
  const Unit& unit_;
  std::unique_ptr<ParquetRowCursor> cursor_;
};

// Unit `index` of a catalogue that must hold `wanted`.
const Unit& unit_of(const Catalog& c, uint64_t index, UnitContent wanted) {
  if (c.content != wanted)
    throw DatasetError(c.source + ": holds " + (wanted == UnitContent::documents ? "tokens" : "documents") + " (" +
                       source_format_name(c.format) + "), not " +
                       (wanted == UnitContent::documents ? "documents" : "tokens"));
  if (index >= c.units.size())
    throw DatasetError(c.source + ": unit " + std::to_string(index) + " of " + std::to_string(c.units.size()));
  return c.units[index];
}

// Files kept open by an opener (most recently used first): Parquet files, whose footers are read
// once, and a local source's block shards, whose blocks (16-64 KiB) would otherwise each cost an
// open and a close.
constexpr size_t kFilesOpen = 16;

template <typename File>
File& kept_open(std::list<std::pair<uint32_t, File>>& open, uint32_t file, const std::function<File()>& make) {
  auto it = std::find_if(open.begin(), open.end(), [&](const auto& f) { return f.first == file; });
  if (it == open.end()) {
    open.emplace_front(file, make());
    if (open.size() > kFilesOpen) open.pop_back();
  } else {
    open.splice(open.begin(), open, it);
  }
  return open.front().second;
}

}  // namespace

struct UnitOpener::Shared {
  BlockDecoder decoder;
  std::list<std::pair<uint32_t, std::shared_ptr<ParquetFile>>> parquet;
  std::list<std::pair<uint32_t, std::shared_ptr<io::RangeFile>>> blocks;  // local stores only
};

namespace {

// A block shard's unit: its block read by its byte range and decoded whole. A remote store's
// file is opened for each unit (its cache lets a unit go when the lanes are done with it).
std::vector<char> block_payload(io::Store& store, UnitOpener::Shared& shared, const Catalog& c, const Unit& u,
                                ShardKind kind) {
  const io::ObjectInfo& info = c.files[u.file].object;
  std::shared_ptr<io::RangeFile> file =
      store.remote() ? std::shared_ptr<io::RangeFile>(store.open(info))
                     : kept_open<std::shared_ptr<io::RangeFile>>(shared.blocks, u.file, [&] { return store.open(info); });
  std::vector<char> payload;
  const uint64_t items = kind == ShardKind::text ? u.text_bytes : u.items;
  shared.decoder.decode(*file, kind, {u.offset, u.bytes, u.documents, items}, u.place, payload);
  return payload;
}

}  // namespace

UnitOpener::UnitOpener(io::Store& store, std::shared_ptr<const Catalog> catalog)
    : store_(store), catalog_(std::move(catalog)), shared_(std::make_unique<Shared>()) {}
UnitOpener::~UnitOpener() = default;

std::unique_ptr<DocumentUnit> UnitOpener::documents(uint64_t index) {
  const Catalog& c = *catalog_;
  const Unit& u = unit_of(c, index, UnitContent::documents);
  const io::ObjectInfo& info = c.files[u.file].object;
  switch (c.format) {
    case SourceFormat::shards_v2:
      return std::make_unique<BlockDocuments>(block_payload(store_, *shared_, c, u, ShardKind::text), c, u);
    case SourceFormat::shards_v1:
      return std::make_unique<StreamDocuments>(store_.open(info), c, u);
    case SourceFormat::parquet: {
      auto file = kept_open<std::shared_ptr<ParquetFile>>(shared_->parquet, u.file, [&] {
        return parquet_module(c.source).open_range_file(std::shared_ptr<io::RangeFile>(store_.open(info)), c.column);
      });
      return std::make_unique<ParquetDocuments>(std::move(file), c, u);
    }
    case SourceFormat::llmc:
      break;
  }
  throw DatasetError(c.source + ": " + source_format_name(c.format) + " hold no documents");
}

std::unique_ptr<TokenUnit> UnitOpener::tokens(uint64_t index) {
  const Catalog& c = *catalog_;
  const Unit& u = unit_of(c, index, UnitContent::tokens);
  const io::ObjectInfo& info = c.files[u.file].object;
  switch (c.format) {
    case SourceFormat::shards_v2:
      return std::make_unique<BlockTokens>(block_payload(store_, *shared_, c, u, ShardKind::tokens), c, u);
    case SourceFormat::shards_v1:
      return std::make_unique<StreamTokens>(store_.open(info), c, u);
    case SourceFormat::llmc:
      return std::make_unique<LlmcTokens>(store_.open(info), c, u);
    case SourceFormat::parquet:
      break;
  }
  throw DatasetError(c.source + ": " + source_format_name(c.format) + " hold no tokens");
}

size_t UnitOpener::memory() const { return shared_->decoder.memory(); }

}  // namespace pipeline::datasets
