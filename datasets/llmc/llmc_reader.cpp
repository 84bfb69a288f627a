// llm.c directories as datasets (see llmc_reader.h).
#include "datasets/llmc/llmc_reader.h"

#include <algorithm>

#include "datasets/shards/shard.h"

namespace pipeline::datasets {

Manifest llmc_manifest(const std::filesystem::path& dir) {
  Manifest m;
  m.format = DatasetFormat::llmc;
  m.version = kManifestVersionOneFrame;  // no block shards: block_shards() is false
  m.kind = ShardKind::tokens;
  m.created_by = "llm.c shards";
  for (const auto& [split, files] : llmc_splits(dir)) {
    auto& shards = m.splits[split];
    for (const auto& f : files) {
      LlmcShardReader r(f);  // checks the header against the file size
      shards.push_back(ShardInfo{f.filename().string(), kLlmcHeaderBytes + 2 * r.tokens(), 0, r.tokens(), ""});
    }
  }
  if (m.splits.empty())
    throw DatasetError(dir.string() + ": no llm.c shards (expected files named <prefix>_<split>_<index>.bin)");
  return m;
}

void LlmcSplitReader::open(const std::filesystem::path& dir, const std::string& split, DatasetPosition start, bool loop,
                          Partition partition) {
  partition.check();
  dir_ = dir;
  manifest_ = llmc_manifest(dir);
  current_.reset();
  pending_.reset();
  auto it = manifest_.splits.find(split);
  if (it == manifest_.splits.end()) {
    std::string have;
    for (const auto& [name, _] : manifest_.splits) have += (have.empty() ? "" : ", ") + name;
    throw DatasetError(dir.string() + ": no llm.c shards for split \"" + split + "\" (expected files named *_" + split +
                       "_NNNNNN.bin; the directory has splits: " + have + ")");
  }
  shards_ = it->second;
  if (manifest_.items(split) == 0) throw DatasetError(dir.string() + ": split \"" + split + "\" holds no tokens");
  const DocKey resume_at = partition.done ? partition.done->start() : DocKey{};
  if (partition.done) start = DatasetPosition{resume_at.shard, resume_at.item, resume_at.epoch};
  const bool at_epoch_end = start.shard == shards_.size() && start.item == 0;
  if (start.shard > shards_.size() || (start.shard == shards_.size() && !at_epoch_end))
    throw DatasetError(dir.string() + ": position " + start.str() + " is past the split \"" + split + "\", which has " +
                       std::to_string(shards_.size()) + " shards");
  if (!at_epoch_end && start.item > shards_[start.shard].items)
    throw DatasetError(dir.string() + ": position " + start.str() + " is past the end of shard \"" +
                       shards_[start.shard].name + "\", which holds " + std::to_string(shards_[start.shard].items) +
                       " tokens");
  loop_ = loop;
  partition_ = std::move(partition);
  kept_in_epoch_ = 0;
  whole_epoch_ = start.shard == 0 && start.item == 0;
  position_ = DatasetPosition{start.shard, 0, start.epoch};
  if (at_epoch_end || start.item == 0) return;
  open_shard();
  if (partition_.done) {  // the start is a document's first token, numbered in the position
    filter_ = TokenDocumentFilter(partition_, resume_at, kShardEotId);
    position_.item = start.item;
    return;
  }
  std::vector<uint16_t> scratch(size_t(1) << 16);
  while (position_.item < start.item) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(scratch.size(), start.item - position_.item));
    const size_t n = current_->read(position_.item, std::span<uint16_t>(scratch.data(), want));
    if (n == 0) throw DatasetError(current_->path().string() + ": ends before token " + std::to_string(start.item));
    filter_.filter(std::span<const uint16_t>(scratch.data(), n), scratch.data());
    position_.item += n;
  }
  pending_ = filter_.continuation();
}

void LlmcSplitReader::open_shard() {
  current_.emplace(dir_ / shards_[position_.shard].name);
  if (current_->tokens() != shards_[position_.shard].items)
    throw DatasetError(current_->path().string() + ": byte offset 8: the header now counts " +
                       std::to_string(current_->tokens()) + " tokens, " + std::to_string(shards_[position_.shard].items) +
                       " when the dataset was opened (the shard changed during the run)");
  filter_ = TokenDocumentFilter(partition_, {position_.epoch, position_.shard, 0, 0}, kShardEotId);
}

size_t LlmcSplitReader::read(std::span<uint16_t> out, std::vector<DocMark>* marks) {
  size_t filled = 0;
  if (pending_ && !out.empty()) {
    if (marks) marks->push_back(*pending_);
    pending_.reset();
  }
  while (filled < out.size()) {
    if (position_.shard >= shards_.size()) {
      if (!loop_) break;
      // A whole epoch that held nothing for this rank would loop for ever.
      if (whole_epoch_ && kept_in_epoch_ == 0)
        throw DatasetError(dir_.string() + ": a whole epoch of the split holds no document for data-parallel " +
                           partition_.str() + " (llm.c shards deal documents within each shard: too few of them)");
      ++position_.epoch;
      position_.shard = 0;
      position_.item = 0;
      current_.reset();
      kept_in_epoch_ = 0;
      whole_epoch_ = true;
    }
    if (!current_) open_shard();
    auto room = out.subspan(filled);
    const size_t n = current_->read(position_.item, room);
    const size_t first_mark = marks ? marks->size() : 0;
    const size_t kept = filter_.filter(room.first(n), room.data(), marks);
    if (marks)
      for (size_t i = first_mark; i < marks->size(); ++i) (*marks)[i].at += static_cast<uint32_t>(filled);
    filled += kept;
    kept_in_epoch_ += kept;
    position_.item += n;
    if (position_.item >= current_->tokens()) {
      current_.reset();
      ++position_.shard;
      position_.item = 0;
    }
  }
  return filled;
}

}  // namespace pipeline::datasets
