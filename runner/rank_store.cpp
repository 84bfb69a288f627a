// Publishing and gathering the ranks' stage statistics through the store (see rank_store.h).
#include "runner/rank_store.h"

#include <algorithm>
#include <exception>
#include <string>

namespace pipeline::stages {

void RankStats::publish(const graph::Snapshot& s, bool final) {
  group_.set((final ? "stats_final/" : "stats/") + std::to_string(group_.rank()), graph::to_json(s));
}

graph::Snapshot RankStats::merged_latest(const graph::Snapshot& own) {
  std::vector<graph::Snapshot> by_rank(static_cast<size_t>(group_.size()));
  by_rank[0] = own;
  for (int r = 1; r < group_.size(); ++r) {
    try {
      if (auto j = group_.try_get("stats/" + std::to_string(r))) by_rank[static_cast<size_t>(r)] = graph::snapshot_from_json(*j);
    } catch (const std::exception&) {
      // Not there yet, or the store is going away: show what there is.
    }
  }
  return merge_rank_snapshots(by_rank);
}

graph::Snapshot RankStats::merged_final(const graph::Snapshot& own, std::chrono::milliseconds timeout,
                                        std::vector<int>* missing) {
  std::vector<graph::Snapshot> by_rank(static_cast<size_t>(group_.size()));
  by_rank[0] = own;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 1; r < group_.size(); ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      by_rank[static_cast<size_t>(r)] =
          graph::snapshot_from_json(group_.get("stats_final/" + std::to_string(r), std::max(left, std::chrono::milliseconds(0))));
    } catch (const std::exception&) {
      if (missing) missing->push_back(r);
    }
  }
  return merge_rank_snapshots(by_rank);
}

}  // namespace pipeline::stages
