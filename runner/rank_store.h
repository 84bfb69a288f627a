// The store side of the ranks' stage statistics (runner/rank_stats.h): ranks other than 0 publish
// their snapshots in the rendezvous store, rank 0 collects and merges them.
#pragma once

#include <chrono>
#include <vector>

#include "graph/observe/stats.h"
#include "model/dist/dist_group.h"
#include "runner/rank_stats.h"

namespace pipeline::stages {

/// The store side.
class RankStats {
 public:
  explicit RankStats(dist::Group& group) : group_(group) {}
  /// Ranks other than 0: the latest snapshot, or the final one when the graph has ended.
  void publish(const graph::Snapshot& s, bool final);
  /// Rank 0: `own` merged with the other ranks' latest published snapshots (never waits).
  graph::Snapshot merged_latest(const graph::Snapshot& own);
  /// Rank 0, at the end: `own` merged with every other rank's final snapshot, waiting up to
  /// `timeout` for them; `missing` receives the ranks that sent none.
  graph::Snapshot merged_final(const graph::Snapshot& own, std::chrono::milliseconds timeout, std::vector<int>* missing);

 private:
  dist::Group& group_;
};

}  // namespace pipeline::stages
