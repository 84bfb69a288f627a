// llm.c directories as datasets (see llmc_reader.h).
#include "datasets/llmc_reader.h"

#include "datasets/shard.h"

namespace pipeline::datasets {

Manifest llmc_manifest(const std::filesystem::path& dir) {
  Manifest m;
  m.format = DatasetFormat::llmc;
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

void LlmcSplitReader::open(const std::filesystem::path& dir, const std::string& split, DatasetPosition start, bool loop) {
  dir_ = dir;
  manifest_ = llmc_manifest(dir);
  current_.reset();
  auto it = manifest_.splits.find(split);
  if (it == manifest_.splits.end()) {
    std::string have;
    for (const auto& [name, _] : manifest_.splits) have += (have.empty() ? "" : ", ") + name;
    throw DatasetError(dir.string() + ": no llm.c shards for split \"" + split + "\" (expected files named *_" + split +
                       "_NNNNNN.bin; the directory has splits: " + have + ")");
  }
  shards_ = it->second;
  if (manifest_.items(split) == 0) throw DatasetError(dir.string() + ": split \"" + split + "\" holds no tokens");
  const bool at_epoch_end = start.shard == shards_.size() && start.item == 0;
  if (start.shard > shards_.size() || (start.shard == shards_.size() && !at_epoch_end))
    throw DatasetError(dir.string() + ": position " + start.str() + " is past the split \"" + split + "\", which has " +
                       std::to_string(shards_.size()) + " shards");
  if (!at_epoch_end && start.item > shards_[start.shard].items)
    throw DatasetError(dir.string() + ": position " + start.str() + " is past the end of shard \"" +
                       shards_[start.shard].name + "\", which holds " + std::to_string(shards_[start.shard].items) +
                       " tokens");
  position_ = start;
  loop_ = loop;
}

size_t LlmcSplitReader::read(std::span<uint16_t> out) {
  size_t filled = 0;
  while (filled < out.size()) {
    if (position_.shard >= shards_.size()) {
      if (!loop_) break;
      ++position_.epoch;
      position_.shard = 0;
      position_.item = 0;
      current_.reset();
    }
    if (!current_) {
      current_.emplace(dir_ / shards_[position_.shard].name);
      if (current_->tokens() != shards_[position_.shard].items)
        throw DatasetError(current_->path().string() + ": byte offset 8: the header now counts " +
                           std::to_string(current_->tokens()) + " tokens, " +
                           std::to_string(shards_[position_.shard].items) +
                           " when the dataset was opened (the shard changed during the run)");
    }
    const size_t n = current_->read(position_.item, out.subspan(filled));
    filled += n;
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
