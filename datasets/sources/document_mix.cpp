// Deterministic weighted interleave of text datasets and Parquet (see document_mix.h).
#include "datasets/sources/document_mix.h"

namespace pipeline::datasets {

void MixedDocumentReader::open(const std::vector<MixSource>& sources, const std::string& split, uint64_t seed,
                               const MixPosition& start, DatasetReaderOptions options, const std::string& column) {
  std::vector<double> weights;
  std::vector<std::string> names;
  for (const auto& s : sources) {
    weights.push_back(s.weight);
    names.push_back(s.dir.string());
  }
  cumulative_ = mix_cumulative(weights, names);
  if (!start.sources.empty() && start.sources.size() != sources.size())
    throw DatasetError("dataset mix: the start position has " + std::to_string(start.sources.size()) +
                       " source positions but the mix has " + std::to_string(sources.size()) + " sources");
  options.partition.check();
  partition_ = options.partition;
  options.partition = {};  // each source is read whole: the mix partitions its draws
  sources_ = std::vector<Source>(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
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
