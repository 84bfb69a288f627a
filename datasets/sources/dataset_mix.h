// The types of a weighted mix of datasets (MixedDocumentReader, document_mix.h): its sources and
// its position. Draw k picks source i with probability weight_i / sum(weights), decided by a hash
// of (seed, k), so a mix is reproducible and resumable from (draws, each source's position)
// without storing any RNG state. With a data-parallel partition, draw k goes to rank k % world
// (see partition.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "datasets/plan/position.h"

namespace pipeline::datasets {

struct MixSource {
  std::filesystem::path dir;  // a prepared text dataset, or Parquet (is_parquet_source)
  double weight = 1.0;        // > 0
};

/// A mix entry as a config writes it, "SOURCE=WEIGHT" ("SOURCE" alone weighs 1): its source as
/// written (a path or a remote URL) and weight. Throws DatasetError naming `key` (the config key,
/// "[stages.read] mix") and the entry, URLs redacted, for a weight that is not a number > 0.
std::pair<std::string, double> split_mix_entry(const std::string& entry, const std::string& key);

struct MixPosition {
  uint64_t draws = 0;                    // documents drawn so far (by every rank, when partitioned)
  std::vector<DatasetPosition> sources;  // one per source, in source order
  bool operator==(const MixPosition&) const = default;
};

}  // namespace pipeline::datasets
