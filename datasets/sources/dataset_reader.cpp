// Split readers over shards. Seeking to a position streams the shard from its start and
// discards what precedes the position: shards carry no index, and decompressing is fast
// enough that a resume costs at most one shard's read.
#include "datasets/sources/dataset_reader.h"

#include <algorithm>

#include "datasets/llmc/llmc_reader.h"
#include "datasets/sources/dataset_manifest.h"

namespace pipeline::datasets {

namespace detail {

void SplitCursor::open(const std::filesystem::path& manifest_dir, const std::string& split, DatasetPosition start,
                       bool loop, const DatasetReaderOptions& options, ShardKind kind) {
  reader_.reset();
  dir_ = manifest_dir_of(manifest_dir);
  manifest_ = load_dataset_manifest(dir_);
  std::string source = (dir_ / kManifestFileName).string();
  if (manifest_.kind != kind)
    throw DatasetError(source + ": dataset kind is \"" + shard_kind_name(manifest_.kind) + "\" but a " +
                       shard_kind_name(kind) + " reader was asked to open it");
  verify_split(dir_, manifest_, split, options.verify);
  split_ = split;
  shards_ = manifest_.splits.at(split);
  verified_.assign(shards_.size(), options.verify != VerifyMode::while_reading);
  if (manifest_.items(split) == 0 && manifest_.documents(split) == 0)
    throw DatasetError(source + ": split \"" + split + "\" holds no data");
  options.partition.check();
  first_document_.clear();
  uint64_t documents = 0;
  for (const ShardInfo& info : shards_) {
    first_document_.push_back(documents);
    documents += info.documents;
  }
  if (documents <= options.partition.rank)
    throw DatasetError(source + ": split \"" + split + "\" holds " + std::to_string(documents) +
                       " documents, too few to give one to each of " + std::to_string(options.partition.world) +
                       " data-parallel ranks (rank " + std::to_string(options.partition.rank) + " would read nothing)");
  // Resumed: start at the first document that may hold something left. For tokens that document's
  // first token is an end-of-text id at a known offset, so the filter starts there.
  const DocKey resume_at = options.partition.done ? options.partition.done->start() : DocKey{};
  if (options.partition.done) start = DatasetPosition{resume_at.shard, resume_at.item, resume_at.epoch};
  bool at_epoch_end = start.shard == shards_.size() && start.item == 0;
  if (start.shard > shards_.size() || (start.shard == shards_.size() && !at_epoch_end))
    throw DatasetError(source + ": position " + start.str() + " is past the split \"" + split + "\", which has " +
                       std::to_string(shards_.size()) + " shards");
  if (!at_epoch_end) {
    const ShardInfo& s = shards_[start.shard];
    uint64_t limit = kind == ShardKind::text ? s.documents : s.items;
    if (start.item > limit)
      throw DatasetError(source + ": position " + start.str() + " is past the end of shard \"" + s.name + "\", which holds " +
                         std::to_string(limit) + (kind == ShardKind::text ? " documents" : " tokens"));
  }
  loop_ = loop;
  options_ = options;
  kind_ = kind;
  position_ = start;
  open_ = true;
  pending_.reset();
  if (!at_epoch_end && start.item > 0) {
    current();
    if (kind == ShardKind::text) {
      reader_->skip(start.item);
    } else if (options.partition.done) {
      reader_->skip(start.item);
      filter_ = TokenDocumentFilter(options_.partition, resume_at, kShardEotId);
    } else {
      // A position inside a document: the filter reads up to it from the shard's start, to know
      // which document it falls in (and whether this rank keeps it).
      skip_filtered(start.item);
      pending_ = filter_.continuation();
    }
  }
}

void SplitCursor::skip_filtered(uint64_t tokens) {
  // The filter must see every skipped token to know which document the position falls in.
  uint16_t scratch[4096];
  for (uint64_t left = tokens; left > 0;) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(left, std::size(scratch)));
    size_t n = reader_->read_tokens(std::span<uint16_t>(scratch, want));
    if (n == 0)
      throw DatasetError(reader_->path().string() + ": cannot skip " + std::to_string(tokens) +
                         " tokens: the shard ends after " + std::to_string(tokens - left));
    filter_.filter(std::span<const uint16_t>(scratch, n), scratch);
    left -= n;
  }
}

ShardReader* SplitCursor::current() {
  if (!open_) throw DatasetError("dataset reader used before open()");
  if (reader_) return reader_.get();
  if (position_.shard >= shards_.size()) {
    if (!loop_) return nullptr;
    ++position_.epoch;
    position_.shard = 0;
    position_.item = 0;
  }
  bool hash = !verified_[position_.shard];
  reader_ = std::make_unique<ShardReader>(dir_ / shards_[position_.shard].name, kind_, hash);
  if (kind_ == ShardKind::tokens)
    filter_ = TokenDocumentFilter(options_.partition,
                                  {position_.epoch, position_.shard, 0, first_document_[position_.shard]}, kShardEotId);
  const ShardInfo& info = shards_[position_.shard];
  const ShardHeader& h = reader_->header();
  if (h.documents != info.documents || h.items != info.items)
    throw DatasetError(reader_->path().string() + ": header (byte offset 24) declares " + std::to_string(h.documents) +
                       " documents and " + std::to_string(h.items) + " items, but " +
                       (dir_ / kManifestFileName).string() + " records " + std::to_string(info.documents) + " and " +
                       std::to_string(info.items));
  return reader_.get();
}

void SplitCursor::shard_done() {
  high_water_ = std::max(high_water_, reader_->memory_high_water());
  if (!verified_[position_.shard]) {
    const ShardInfo& info = shards_[position_.shard];
    std::string actual = reader_->sha256_hex();
    if (actual != info.sha256)
      throw DatasetError(reader_->path().string() + ": sha256 mismatch: the file hashes to " + actual + " but " +
                         (dir_ / kManifestFileName).string() + " records " + info.sha256 +
                         " (the shard changed after it was written)");
    verified_[position_.shard] = true;
  }
  reader_.reset();
  ++position_.shard;
  position_.item = 0;
}

}  // namespace detail

void TextDatasetReader::open(const std::filesystem::path& manifest_dir, const std::string& split,
                             DatasetPosition start, bool loop, DatasetReaderOptions options) {
  c_.open(manifest_dir, split, start, loop, options, ShardKind::text);
}

bool TextDatasetReader::next(std::string& document, DocMark* mark) {
  for (;;) {
    ShardReader* r = c_.current();
    if (!r) return false;
    // Another rank's documents, and those consumed whole before a resume, are read and dropped.
    const DocKey key = c_.next_document();
    const uint64_t skip = c_.options_.partition.take(key, key.ordinal);
    if (r->next_document(document)) {
      c_.consumed(1);
      if (skip == DataProgress::kAll) continue;
      if (mark) *mark = DocMark{0, key, 0, skip, false};
      return true;
    }
    c_.shard_done();
  }
}

size_t TextDatasetReader::memory_high_water() const {
  return std::max(c_.high_water_, c_.reader_ ? c_.reader_->memory_high_water() : 0);
}

TokenDatasetReader::TokenDatasetReader() = default;
TokenDatasetReader::~TokenDatasetReader() = default;
TokenDatasetReader::TokenDatasetReader(TokenDatasetReader&&) noexcept = default;
TokenDatasetReader& TokenDatasetReader::operator=(TokenDatasetReader&&) noexcept = default;

void TokenDatasetReader::open(const std::filesystem::path& manifest_dir, const std::string& split,
                              DatasetPosition start, bool loop, DatasetReaderOptions options) {
  llmc_.reset();
  if (is_llmc_dataset(manifest_dir)) {
    llmc_ = std::make_unique<LlmcSplitReader>();
    llmc_->open(manifest_dir, split, start, loop, options.partition);
    return;
  }
  c_.open(manifest_dir, split, start, loop, options, ShardKind::tokens);
}

DatasetPosition TokenDatasetReader::position() const { return llmc_ ? llmc_->position() : c_.position_; }

const Manifest& TokenDatasetReader::manifest() const { return llmc_ ? llmc_->manifest() : c_.manifest_; }

size_t TokenDatasetReader::read(std::span<uint16_t> out, std::vector<DocMark>* marks) {
  if (llmc_) return llmc_->read(out, marks);
  if (c_.pending_ && !out.empty()) {
    if (marks) marks->push_back(*c_.pending_);
    c_.pending_.reset();
  }
  size_t filled = 0;
  while (filled < out.size()) {
    ShardReader* r = c_.current();
    if (!r) break;
    auto room = out.subspan(filled);
    size_t n = r->read_tokens(room);
    c_.consumed(n);
    // Keep this rank's documents (all of them, on one rank), compacting them to the front of
    // `room`, and mark where each starts.
    const size_t first_mark = marks ? marks->size() : 0;
    const size_t kept = c_.filter_.filter(room.first(n), room.data(), marks);
    if (marks)
      for (size_t i = first_mark; i < marks->size(); ++i) (*marks)[i].at += static_cast<uint32_t>(filled);
    filled += kept;
    if (r->finished()) c_.shard_done();
  }
  return filled;
}

size_t TokenDatasetReader::memory_high_water() const {
  return std::max(c_.high_water_, c_.reader_ ? c_.reader_->memory_high_water() : 0);
}

}  // namespace pipeline::datasets
