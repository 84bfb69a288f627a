// The error of the data layer: every problem with a data file (a shard, a manifest, Parquet, llm.c
// shards, safetensors, a position or a partition) is a DatasetError whose message names the file
// and, where there is one, the byte offset. The floor of datasets/: every room may include it.
#pragma once

#include <stdexcept>

namespace pipeline::datasets {

struct DatasetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace pipeline::datasets
