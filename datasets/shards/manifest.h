// Dataset manifest (manifest.json next to the shards): what a prepared dataset holds, split
// by split, with each shard's size, counts and SHA-256, so a reader can refuse a dataset that
// is incomplete or was changed after it was written.
//
// {
//   "format": "pipeline-dataset", "version": 2, "kind": "text" | "tokens",
//   "created_by": "...", "seed": 1337, "val_fraction": 0.1, "split_rule": "blank-lines",
//   "block_bytes": 65536,
//   "splits": {
//     "train": [ {"name": "train_00000.text.zst", "bytes": 123, "documents": 9,
//                 "text_bytes": 4567 | "tokens": 890, "blocks": 3, "sha256": "<64 hex>"}, ... ],
//     "val": [ ... ]
//   }
// }
// "text_bytes" is recorded for text shards, "tokens" (EOT separators included) for token shards.
// Version 2 describes block shards (shard format 2): "block_bytes" is the block size they were
// written with, and each shard's "blocks" its number of blocks, so a catalogue knows how many
// units a dataset holds from the manifest alone (each shard's index says where they lie).
// Version 1 (shard format 1: one frame a shard) has neither, and is still read.
// A directory of llm.c shards has no manifest.json: load_dataset_manifest (sources/) derives one
// from the shards' names and headers (format llmc, see llmc/llmc_reader.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/shards/shard.h"

namespace pipeline::datasets {

inline constexpr uint32_t kManifestVersion = 2;         // block shards
inline constexpr uint32_t kManifestVersionOneFrame = 1;  // shards of one frame, still read
inline constexpr const char* kManifestFileName = "manifest.json";

struct ShardInfo {
  std::string name;  // file name, relative to the manifest's directory
  uint64_t bytes = 0;
  uint64_t documents = 0;
  uint64_t items = 0;  // text bytes (text) or tokens (tokens)
  std::string sha256;
  uint64_t blocks = 0;  // version 2: the shard's blocks
};

/// How the shards are stored: this project's zstd shards, or llm.c's raw .bin shards.
enum class DatasetFormat { pipeline, llmc };

struct Manifest {
  uint32_t version = kManifestVersion;
  DatasetFormat format = DatasetFormat::pipeline;
  ShardKind kind = ShardKind::text;
  std::string created_by;
  uint64_t seed = 0;
  double val_fraction = 0.0;
  std::string split_rule;
  uint64_t block_bytes = 0;  // version 2: the blocks' payload bytes as written
  std::map<std::string, std::vector<ShardInfo>> splits;  // "train", "val"

  /// Whether its shards are block shards (version 2).
  bool block_shards() const { return version == kManifestVersion; }

  uint64_t documents(const std::string& split) const;
  uint64_t items(const std::string& split) const;

  std::string to_json() const;
  /// `source` names the file in error messages.
  static Manifest parse(std::string_view json, const std::string& source);
  /// Reads dir/manifest.json (or `dir` itself when it is a file).
  static Manifest load(const std::filesystem::path& dir);
  void save(const std::filesystem::path& dir) const;
};

/// The directory holding the manifest for `path` (a directory, or a manifest file).
std::filesystem::path manifest_dir_of(const std::filesystem::path& path);

enum class VerifyMode {
  on_open,        // hash every shard of the split when the dataset is opened (default)
  while_reading,  // hash each shard as it streams past; the mismatch is raised at the shard's end
  off,            // check presence and size only
};

/// Checks that every shard of `split` exists and has the recorded size; with on_open also
/// compares SHA-256. Errors name the manifest, the shard and what differed.
void verify_split(const std::filesystem::path& dir, const Manifest& manifest, const std::string& split,
                  VerifyMode mode);

}  // namespace pipeline::datasets
