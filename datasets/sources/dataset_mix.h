// The types of a weighted mix of datasets (MixedDocumentReader, document_mix.h): its sources and
// its position. Draw k picks source i with probability weight_i / sum(weights), decided by a hash
// of (seed, k), so a mix is reproducible and resumable from (draws, each source's position)
// without storing any RNG state. With a data-parallel partition, draw k goes to rank k % world
// (see partition.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "datasets/plan/position.h"

namespace pipeline::datasets {

struct MixSource {
  std::filesystem::path dir;  // a prepared text dataset, or Parquet (is_parquet_source)
  double weight = 1.0;        // > 0
};

struct MixPosition {
  uint64_t draws = 0;                    // documents drawn so far (by every rank, when partitioned)
  std::vector<DatasetPosition> sources;  // one per source, in source order
  bool operator==(const MixPosition&) const = default;
};

}  // namespace pipeline::datasets
