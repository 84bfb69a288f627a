// Document partition of a split between data-parallel ranks, and what earlier runs consumed
// (see partition.h).
#include "datasets/plan/partition.h"

#include <algorithm>

#include "datasets/dataset_error.h"

namespace pipeline::datasets {

std::string DocKey::str() const {
  return "epoch=" + std::to_string(epoch) + " shard=" + std::to_string(shard) + " item=" + std::to_string(item);
}

uint64_t DataProgress::consumed(const DocKey& doc) const {
  uint64_t tokens = 0;
  for (const auto& layer : layers) {
    const uint64_t deal = layer.by_shard ? doc.shard : doc.ordinal;
    const Frontier& f = layer.next[deal % layer.world];
    if (doc < f.doc) return kAll;
    if (doc == f.doc) tokens = std::max(tokens, f.token);
  }
  return tokens;
}

DocKey DataProgress::start() const {
  // Every document before a layer's smallest frontier is consumed, so none before the largest of
  // those minima holds anything left.
  DocKey out;
  for (const auto& layer : layers) {
    auto least = std::min_element(layer.next.begin(), layer.next.end(),
                                  [](const Frontier& a, const Frontier& b) { return a.doc < b.doc; });
    if (least != layer.next.end() && out < least->doc) out = least->doc;
  }
  return out;
}

void DataProgress::add(ProgressLayer layer) {
  if (layer.world < 1 || layer.next.size() != layer.world)
    throw DatasetError("data progress: a run of " + std::to_string(layer.world) + " ranks with " +
                       std::to_string(layer.next.size()) + " positions");
  const DocKey least =
      std::min_element(layer.next.begin(), layer.next.end(), [](const Frontier& a, const Frontier& b) {
        return a.doc < b.doc;
      })->doc;
  // An older layer whose frontiers all lie before the new one's smallest says nothing new: the new
  // layer consumes every document before that.
  std::erase_if(layers, [&](const ProgressLayer& old) {
    return std::all_of(old.next.begin(), old.next.end(), [&](const Frontier& f) { return f.doc < least; });
  });
  layers.push_back(std::move(layer));
}

std::string Partition::str() const { return "rank " + std::to_string(rank) + " of " + std::to_string(world); }

void Partition::check() const {
  if (world < 1 || rank >= world)
    throw DatasetError("data partition: rank " + std::to_string(rank) + " of " + std::to_string(world) +
                       " ranks: expected a world size of at least 1 and a rank below it");
  if (done)
    for (const auto& layer : done->layers)
      if (layer.world < 1 || layer.next.size() != layer.world)
        throw DatasetError("data partition: a resumed run of " + std::to_string(layer.world) + " ranks with " +
                           std::to_string(layer.next.size()) + " positions");
}

size_t TokenDocumentFilter::filter(std::span<const uint16_t> in, uint16_t* out, std::vector<DocMark>* marks) {
  size_t kept = 0;
  for (uint16_t t : in) {
    if (t == eot_ || !started_) {
      started_ = true;
      doc_ = next_;
      doc_.item = raw_;
      ++next_.ordinal;
      token_ = 0;
      const uint64_t skip = p_.take(doc_, doc_.ordinal);
      owned_ = skip != DataProgress::kAll;
      drop_ = owned_ ? skip : 0;
      if (owned_ && marks) marks->push_back(DocMark{static_cast<uint32_t>(kept), doc_, skip, 0, false});
    }
    ++raw_;
    ++token_;
    if (!owned_) continue;
    if (drop_ > 0) {
      --drop_;
      continue;
    }
    out[kept++] = t;
  }
  return kept;
}

std::optional<DocMark> TokenDocumentFilter::continuation() const {
  if (!started_ || !owned_) return std::nullopt;
  return DocMark{0, doc_, token_ + drop_, 0, false};
}

}  // namespace pipeline::datasets
