// The neediest lane (lane_demand.h).
#include "datasets/lanes/lane_demand.h"

#include "datasets/dataset_error.h"

namespace pipeline::datasets {

LaneDemand::LaneDemand(size_t lanes)
    : published_(std::make_unique<CacheLinePadded<Published>[]>(lanes)), sent_(lanes, 0), ended_(lanes, false) {
  if (lanes == 0) throw DatasetError("lane demand: no lanes");
}

void LaneDemand::publish(size_t i, uint64_t buffered, uint64_t received_estimate) {
  // Release: a reader that sees the new `received` sees the `buffered` published with it.
  published_[i].value.buffered.store(buffered, std::memory_order_relaxed);
  published_[i].value.received.store(received_estimate, std::memory_order_release);
}

void LaneDemand::sent(size_t i, uint64_t estimate) { sent_[i] += estimate; }

void LaneDemand::ended(size_t i) { ended_[i] = true; }

uint64_t LaneDemand::supply(size_t i) const {
  const uint64_t received = published_[i].value.received.load(std::memory_order_acquire);
  const uint64_t buffered = published_[i].value.buffered.load(std::memory_order_relaxed);
  // Pack never receives more than was sent; a publication racing a send only makes the figure
  // stale, never negative.
  const uint64_t in_flight = sent_[i] > received ? sent_[i] - received : 0;
  return buffered + in_flight;
}

size_t LaneDemand::neediest() const {
  size_t best = sent_.size();
  uint64_t best_supply = UINT64_MAX;
  for (size_t i = 0; i < sent_.size(); ++i) {
    if (ended_[i]) continue;
    const uint64_t s = supply(i);
    if (best == sent_.size() || s < best_supply) {
      best = i;
      best_supply = s;
    }
  }
  return best;
}

}  // namespace pipeline::datasets
