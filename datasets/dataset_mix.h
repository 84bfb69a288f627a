// Weighted mixing of several text datasets: draw k picks source i with probability
// weight_i / sum(weights), decided by a hash of (seed, k), so a mix is reproducible and
// resumable from (draws, each source's position) without storing any RNG state. With a
// data-parallel partition in the options, draw k goes to rank k % world (see partition.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "datasets/dataset_reader.h"

namespace pipeline::datasets {

struct MixSource {
  std::filesystem::path dir;  // a prepared text dataset
  double weight = 1.0;        // > 0
};

struct MixPosition {
  uint64_t draws = 0;                    // documents drawn so far (by every rank, when partitioned)
  std::vector<DatasetPosition> sources;  // one per source, in source order
  bool operator==(const MixPosition&) const = default;
};

/// Every source loops over its epochs, so next() never runs dry.
class MixedTextReader {
 public:
  void open(const std::vector<MixSource>& sources, const std::string& split, uint64_t seed,
            const MixPosition& start = {}, DatasetReaderOptions options = {});
  /// The next document; `source` (optional) receives the index of the dataset it came from.
  void next(std::string& document, size_t* source = nullptr);
  MixPosition position() const;

 private:
  std::vector<TextDatasetReader> readers_;
  std::vector<double> cumulative_;  // normalised cumulative weights
  uint64_t seed_ = 0, draws_ = 0;
  Partition partition_;
};

}  // namespace pipeline::datasets
