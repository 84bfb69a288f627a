// The bottleneck verdict over time (engine side): analyze() (graph/observe/stats.h) judges one
// snapshot; a VerdictTracker holds the verdict the live view shows, so that it changes only
// when a new one has held for a few reports in a row instead of flickering between two
// stages that are nearly tied.
#pragma once

#include <string>

#include "graph/observe/stats.h"

namespace pipeline::graph {

class VerdictTracker {
 public:
  explicit VerdictTracker(int dwell = 3) : dwell_(dwell) {}
  /// The verdict to show for `s`. Sets `changed` when the named stage or the kind of limit
  /// changed (not when only its numbers did).
  Verdict update(const Snapshot& s, bool& changed);

 private:
  int dwell_;
  bool any_ = false;
  std::string shown_key_, pending_key_;
  int pending_n_ = 0;
};

/// "kind|stage": what a verdict names, without its numbers.
std::string verdict_key(const Verdict& v);

}  // namespace pipeline::graph
