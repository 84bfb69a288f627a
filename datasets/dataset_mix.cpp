// Deterministic weighted interleave of text datasets (see dataset_mix.h).
#include "datasets/dataset_mix.h"

#include <cmath>

#include "datasets/document_mix.h"  // mix_pick, the draw rule both mixes share

namespace pipeline::datasets {

void MixedTextReader::open(const std::vector<MixSource>& sources, const std::string& split, uint64_t seed,
                           const MixPosition& start, DatasetReaderOptions options) {
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
  readers_ = std::vector<TextDatasetReader>(sources.size());
  cumulative_.clear();
  double acc = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    acc += sources[i].weight / total;
    cumulative_.push_back(acc);
    readers_[i].open(sources[i].dir, split, start.sources.empty() ? DatasetPosition{} : start.sources[i],
                     /*loop=*/true, options);
  }
  cumulative_.back() = 1.0;  // rounding must not leave a gap at the top
  seed_ = seed;
  draws_ = start.draws;
}

void MixedTextReader::next(std::string& document, size_t* source) {
  for (;;) {  // with a partition, other ranks' draws are read and dropped
    const size_t i = mix_pick(cumulative_, seed_, draws_);
    if (!readers_[i].next(document)) throw DatasetError("dataset mix: source " + std::to_string(i) + " ran dry");
    if (!partition_.owns(draws_++)) continue;
    if (source) *source = i;
    return;
  }
}

MixPosition MixedTextReader::position() const {
  MixPosition p;
  p.draws = draws_;
  for (const auto& r : readers_) p.sources.push_back(r.position());
  return p;
}

}  // namespace pipeline::datasets
