// A directory of llm.c / modded-nanogpt shards as a dataset: its manifest, derived from the file
// names and headers (llm.c directories carry none), and a split reader with the same positions
// as the zstd token reader's (shard, token, epoch), so checkpoints resume either kind exactly.
// TokenDatasetReader and Manifest::load use these when a directory holds llm.c shards.
//
// Data-parallel ranks split it by document as they split token shards (partition.h), but llm.c
// records no document counts, so documents are numbered within each shard: document k of a shard
// (the k-th end-of-text id, or the shard's first token when it is not one) belongs to rank
// k % world.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "datasets/plan/position.h"
#include "datasets/llmc/llmc_shard.h"
#include "datasets/shards/manifest.h"
#include "datasets/plan/partition.h"

namespace pipeline::datasets {

/// The manifest of an llm.c directory: kind tokens, format llmc, one ShardInfo per shard with
/// its file size and token count (documents and sha256 are not recorded by llm.c: 0 and "").
/// Every shard's header is checked (DatasetError with the file and byte offset).
Manifest llmc_manifest(const std::filesystem::path& dir);

/// Token ids of one split of an llm.c directory. Reads straight from the files (pread into the
/// caller's buffer); a position is reached by computing an offset, not by reading up to it.
class LlmcSplitReader {
 public:
  /// With `partition.done` (a resume), starts at the first document left and ignores `start`. A
  /// start inside a shard is reached by filtering the shard from its start (the filter must know
  /// which document it falls in).
  void open(const std::filesystem::path& dir, const std::string& split, DatasetPosition start = {}, bool loop = false,
            Partition partition = {});
  /// As TokenDatasetReader::read: fills `out` across shards (and epochs when looping), this
  /// rank's documents only; 0 only at the end of a non-looping split.
  size_t read(std::span<uint16_t> out, std::vector<DocMark>* marks = nullptr);
  DatasetPosition position() const { return position_; }
  const Manifest& manifest() const { return manifest_; }

 private:
  std::filesystem::path dir_;
  Manifest manifest_;
  std::vector<ShardInfo> shards_;
  void open_shard();                      // current_ and the filter, at position_.shard's start
  size_t read_shard(std::span<uint16_t> out, std::vector<DocMark>* marks);  // from current_, filtered

  std::optional<LlmcShardReader> current_;
  DatasetPosition position_;
  bool loop_ = false;
  Partition partition_;
  TokenDocumentFilter filter_;
  std::optional<DocMark> pending_;  // the document a stream that starts inside one continues
  uint64_t kept_in_epoch_ = 0;      // tokens kept since the last epoch began at its start
  bool whole_epoch_ = false;        // the current epoch was read from its start
};

}  // namespace pipeline::datasets
