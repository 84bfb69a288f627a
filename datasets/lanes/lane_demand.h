// Which lane a reader feeds next (docs/data_order.md): the one furthest behind what pack needs.
// Lanes consume at one rate (a row each per step), so the neediest lane is the one whose supply
// (tokens pack holds for it, plus what the reader sent that pack has not received) is smallest.
// Pack publishes, per lane, the tokens it holds and how much of the reader's estimate it has
// received; the reader counts its estimate of what it sent (tokens for a token source; for
// text, its estimate from bytes). The choice depends on timing, which is fine: only a lane's
// content must be deterministic, and it is.
//
// Pack and the reader run on different threads: each lane's published counters sit on a cache
// line of their own, written by pack alone and read by the reader. The reader's own counts are
// the reader thread's alone.
//
// Example:
//   LaneDemand demand(lanes);                       // shared by read and pack
//   size_t i = demand.neediest();                   // read thread
//   demand.sent(i, estimate);  ...  chunk.estimate = estimate;
//   demand.publish(i, rows.buffered(i), received += chunk.estimate);  // pack thread
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/cache_line.h"

namespace pipeline::datasets {

class LaneDemand {
 public:
  explicit LaneDemand(size_t lanes);

  /// Pack: the i-th lane holds `buffered` tokens, and the pieces pack has received for it total
  /// `received_estimate` of the reader's estimates.
  void publish(size_t i, uint64_t buffered, uint64_t received_estimate);
  /// Reader: it sent the i-th lane a piece it estimates at `estimate` tokens.
  void sent(size_t i, uint64_t estimate);
  /// Reader: the i-th lane has ended (it is never the neediest again).
  void ended(size_t i);
  /// Reader: the lane with the smallest supply (ties: the lowest index); size() when every lane
  /// has ended.
  size_t neediest() const;
  /// Reader: the i-th lane's supply (buffered + in flight, in estimated tokens).
  uint64_t supply(size_t i) const;
  size_t size() const { return sent_.size(); }

 private:
  struct Published {
    std::atomic<uint64_t> buffered{0};
    std::atomic<uint64_t> received{0};
  };
  std::unique_ptr<CacheLinePadded<Published>[]> published_;  // written by pack
  std::vector<uint64_t> sent_;                                // the reader's
  std::vector<bool> ended_;                                   // the reader's
};

}  // namespace pipeline::datasets
