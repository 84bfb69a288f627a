// A directory of llm.c / modded-nanogpt shards as a dataset: its manifest, derived from the file
// names and headers (llm.c directories carry none), and a split reader with the same positions
// as the zstd token reader's (shard, token, epoch), so checkpoints resume either kind exactly.
// TokenDatasetReader and Manifest::load use these when a directory holds llm.c shards.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "datasets/dataset_reader.h"
#include "datasets/llmc_shard.h"
#include "datasets/manifest.h"

namespace pipeline::datasets {

/// The manifest of an llm.c directory: kind tokens, format llmc, one ShardInfo per shard with
/// its file size and token count (documents and sha256 are not recorded by llm.c: 0 and "").
/// Every shard's header is checked (DatasetError with the file and byte offset).
Manifest llmc_manifest(const std::filesystem::path& dir);

/// Token ids of one split of an llm.c directory. Reads straight from the files (pread into the
/// caller's buffer); a position is reached by computing an offset, not by reading up to it.
class LlmcSplitReader {
 public:
  void open(const std::filesystem::path& dir, const std::string& split, DatasetPosition start = {}, bool loop = false);
  /// As TokenDatasetReader::read: fills `out` across shards (and epochs when looping); 0 only at
  /// the end of a non-looping split.
  size_t read(std::span<uint16_t> out);
  DatasetPosition position() const { return position_; }
  const Manifest& manifest() const { return manifest_; }

 private:
  std::filesystem::path dir_;
  Manifest manifest_;
  std::vector<ShardInfo> shards_;
  std::optional<LlmcShardReader> current_;
  DatasetPosition position_;
  bool loop_ = false;
};

}  // namespace pipeline::datasets
