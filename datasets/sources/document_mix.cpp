// Deterministic weighted interleave of text datasets and Parquet (see document_mix.h).
#include "datasets/sources/document_mix.h"

#include <algorithm>
#include <cmath>

#include "datasets/plan/splitmix.h"

namespace pipeline::datasets {
size_t mix_pick(const std::vector<double>& cumulative, uint64_t seed, uint64_t draw) {
  const double u = static_cast<double>(splitmix64(seed ^ splitmix64(draw)) >> 11) * 0x1.0p-53;  // [0, 1)
  const size_t i = static_cast<size_t>(std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin());
  return std::min(i, cumulative.size() - 1);
}

void MixedDocumentReader::open(const std::vector<MixSource>& sources, const std::string& split, uint64_t seed,
                               const MixPosition& start, DatasetReaderOptions options, const std::string& column) {
  if (sources.empty()) throw DatasetError("dataset mix: no sources given");
  if (!start.sources.empty() && start.sources.size() != sources.size())
    throw DatasetError("dataset mix: the start position has " + std::to_string(start.sources.size()) +
                       " source positions but the mix has " + std::to_string(sources.size()) + " sources");
  double total = 0;
  for (const auto& s : sources) {
    if (!(s.weight > 0) || !std::isfinite(s.weight))
      throw DatasetError("dataset mix: " + s.dir.string() + ": weight " + std::to_string(s.weight) +
                         " must be a positive number");
    total += s.weight;
  }
  options.partition.check();
  partition_ = options.partition;
  options.partition = {};  // each source is read whole: the mix partitions its draws
  sources_ = std::vector<Source>(sources.size());
  cumulative_.clear();
  double acc = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    acc += sources[i].weight / total;
    cumulative_.push_back(acc);
    const DatasetPosition from = start.sources.empty() ? DatasetPosition{} : start.sources[i];
    if (is_parquet_source(sources[i].dir)) {  // Parquet has no splits: its files are the split
      ParquetReaderOptions po;
      po.column = column;
      po.seed = seed;
      sources_[i].parquet = std::make_unique<ParquetDocumentReader>();
      sources_[i].parquet->open(sources[i].dir, from, /*loop=*/true, po);
    } else {
      sources_[i].text.open(sources[i].dir, split, from, /*loop=*/true, options);
    }
  }
  cumulative_.back() = 1.0;  // rounding must not leave a gap at the top
  seed_ = seed;
  draws_ = start.draws;
}

void MixedDocumentReader::next(std::string& document, size_t* source, DocMark* mark) {
  for (;;) {  // with a partition, other ranks' draws (and, resumed, those consumed) are read and dropped
    const size_t i = mix_pick(cumulative_, seed_, draws_);
    if (!sources_[i].next(document)) throw DatasetError("dataset mix: source " + std::to_string(i) + " ran dry");
    const DocKey key{0, 0, draws_, draws_};
    ++draws_;
    const uint64_t skip = partition_.take(key, key.ordinal);
    if (skip == DataProgress::kAll) continue;
    if (source) *source = i;
    if (mark) *mark = DocMark{0, key, 0, skip, false};
    return;
  }
}

MixPosition MixedDocumentReader::position() const {
  MixPosition p;
  p.draws = draws_;
  for (const auto& s : sources_) p.sources.push_back(s.position());
  return p;
}

}  // namespace pipeline::datasets
