// Merging and judging the ranks' stage statistics (see rank_stats.h).
#include "runner/rank_stats.h"

#include "graph/observe/percent.h"

#include <algorithm>
#include <cstdio>

namespace pipeline::stages {

namespace {

using graph::pct;

constexpr const char* kTrainType = "train";
// A rank is named as the straggler when its train stage waited for input at least this share of
// its time, and this much more than the rank that waited least.
constexpr double kStragglerStarved = 0.10;

// Rank r's rows of a merged snapshot. Rank 0's keep its queues and the verdict its engine
// tracked; another rank's share rank 0's clock and steady-state window (the ranks start together
// and step together) and are judged afresh.
graph::Snapshot rank_snapshot(const graph::Snapshot& merged, int rank) {
  graph::Snapshot s = merged;
  s.stages.clear();
  s.events.clear();
  for (const auto& st : merged.stages)
    if (st.rank == rank) s.stages.push_back(st);
  if (rank != 0) {
    s.queues.clear();
    s.verdict = {};
  }
  return s;
}

// The engine's own verdict when the snapshot carries one, else the rule applied now.
graph::Verdict verdict_of(const graph::Snapshot& s) { return s.verdict.kind.empty() ? graph::analyze(s) : s.verdict; }

int max_rank(const graph::Snapshot& s) {
  int m = -1;
  for (const auto& st : s.stages) m = std::max(m, st.rank);
  return m;
}

const graph::StageStats* train_of(const graph::Snapshot& s) {
  for (const auto& st : s.stages)
    if (st.type == kTrainType && st.wall_s > 0) return &st;
  return nullptr;
}

// The share of its time a train stage waited for input: over its steady state when its engine
// found one (the start, filling the queues, would make every rank look starved), else the run.
double input_wait(const graph::StageStats& train) { return train.steady.seconds > 0 ? train.steady.starved : train.starved(); }

}  // namespace

graph::Snapshot merge_rank_snapshots(const std::vector<graph::Snapshot>& by_rank) {
  graph::Snapshot out;
  if (by_rank.empty()) return out;
  out = by_rank[0];
  for (auto& st : out.stages) st.rank = 0;
  for (size_t r = 1; r < by_rank.size(); ++r)
    for (auto st : by_rank[r].stages) {
      st.rank = static_cast<int>(r);
      out.stages.push_back(std::move(st));
    }
  return out;
}

graph::Snapshot rank_rows(const graph::Snapshot& merged) {
  graph::Snapshot out = merged;
  out.stages.clear();
  for (const auto& st : merged.stages)
    if (st.rank <= 0) out.stages.push_back(st);
  for (const auto& st : merged.stages)
    if (st.rank > 0 && st.own_thread && !st.sink) {  // the device path: pin, h2d, train
      out.stages.push_back(st);
      out.stages.back().name += "@" + std::to_string(st.rank);
    }
  return out;
}

graph::Verdict analyze_ranks(const graph::Snapshot& merged) {
  const int last = max_rank(merged);
  if (last <= 0) return verdict_of(last < 0 ? merged : rank_snapshot(merged, 0));
  graph::Verdict v = verdict_of(rank_snapshot(merged, 0));
  int slow = -1, calm = -1;
  double most = 0, least = 1;
  for (int r = 0; r <= last; ++r) {
    const graph::Snapshot mine = rank_snapshot(merged, r);  // t points into it
    const auto* t = train_of(mine);
    if (!t) continue;
    const double waited = input_wait(*t);
    if (slow < 0 || waited > most) slow = r, most = waited;
    if (calm < 0 || waited < least) calm = r, least = waited;
  }
  if (slow < 0 || slow == calm || most < kStragglerStarved || most - least < kStragglerStarved) return v;
  // Everyone waits for `slow` at each all-reduce; what holds `slow` back is its own bottleneck.
  graph::Verdict own = verdict_of(rank_snapshot(merged, slow));
  const std::string r = "rank " + std::to_string(slow);
  graph::Verdict out;
  out.kind = "straggler";
  out.stage = own.stage.empty() ? "" : own.stage + "@" + std::to_string(slow);
  out.text = r + ": " + own.text + "; its train waited for input " + pct(most) + " of the time (rank " +
             std::to_string(calm) + ": " + pct(least) + "), and every rank waits for it at each gradient all-reduce";
  out.suggestion = own.suggestion.empty() ? "" : "on " + r + ": " + own.suggestion;
  out.span = own.span;
  out.notes.push_back("rank 0 alone: " + v.text);
  out.notes.insert(out.notes.end(), v.notes.begin(), v.notes.end());
  return out;
}

}  // namespace pipeline::stages
