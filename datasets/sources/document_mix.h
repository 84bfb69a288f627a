// Weighted mixing of document sources of either kind, prepared text datasets and Parquet
// (parquet_reader.h): draw k picks source i with probability weight_i / sum(weights) by a hash of
// (seed, k), so a mix is reproducible and resumable from its MixPosition (dataset_mix.h);
// partitioned, draw k goes to rank k % world. Parquet sources read every row group (the mix
// partitions its draws, not the sources), shuffled with the mix's seed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "datasets/plan/mix_pick.h"
#include "datasets/sources/dataset_mix.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/parquet/parquet_reader.h"

namespace pipeline::datasets {

/// Every source loops over its epochs, so next() never runs dry.
class MixedDocumentReader {
 public:
  /// A source's `dir` is a prepared text dataset, or Parquet (is_parquet_source); `column` names
  /// Parquet's text column.
  void open(const std::vector<MixSource>& sources, const std::string& split, uint64_t seed,
            const MixPosition& start = {}, DatasetReaderOptions options = {}, const std::string& column = "text");
  /// The next document; `source` (optional) receives the index of the source it came from, and
  /// `mark` (optional) its place in the mix (key: the draw) and the tokens of it to drop. With
  /// `options.partition.done` (a resume), draws consumed whole are passed over: `start` must be a
  /// position at or before the first draw left.
  void next(std::string& document, size_t* source = nullptr, DocMark* mark = nullptr);
  MixPosition position() const;

 private:
  struct Source {
    TextDatasetReader text;
    std::unique_ptr<ParquetDocumentReader> parquet;  // set for a Parquet source
    bool next(std::string& document) { return parquet ? parquet->next(document) : text.next(document); }
    DatasetPosition position() const { return parquet ? parquet->position() : text.position(); }
  };
  std::vector<Source> sources_;
  std::vector<double> cumulative_;
  uint64_t seed_ = 0, draws_ = 0;
  Partition partition_;
};

}  // namespace pipeline::datasets
