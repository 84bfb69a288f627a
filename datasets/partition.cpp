// Document partition of a split between data-parallel ranks (see partition.h).
#include "datasets/partition.h"

#include "datasets/shard.h"

namespace pipeline::datasets {

std::string Partition::str() const { return "rank " + std::to_string(rank) + " of " + std::to_string(world); }

void Partition::check() const {
  if (world < 1 || rank >= world)
    throw DatasetError("data partition: rank " + std::to_string(rank) + " of " + std::to_string(world) +
                       " ranks: expected a world size of at least 1 and a rank below it");
}

size_t TokenDocumentFilter::filter(std::span<const uint16_t> in, uint16_t* out) {
  size_t kept = 0;
  for (uint16_t t : in) {
    if (t == eot_) owned_ = p_.owns(next_document_++);
    if (owned_) out[kept++] = t;
  }
  return kept;
}

}  // namespace pipeline::datasets
