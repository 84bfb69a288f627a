// Autotune (engine internals): while the graph runs, moves the concurrency of CPU stages and
// the capacity of edges toward the bottleneck, one knob at a time, keeping a change only if
// the pipeline's throughput went up. It acts on stages and edges set to "auto" ([run] autotune
// = true sets them all), and stops moving workers once a stage with a thread of its own
// (train) is the bottleneck or the CPU stages have used up the cores. Every decision is an
// Event, with its reason and the throughput before and after; batch order never depends on
// worker counts or capacities, so losses stay the same.
//
// The rule, at each report (about once a second), after a few reports of warm-up:
//   - a trial in progress is judged after it settled: kept if the throughput rose by 3% or
//     more, else undone, and that knob is left alone from then on;
//   - otherwise, if the bottleneck (the verdict, steady state) is a tunable CPU stage and the
//     cores are not used up, its workers grow by half (at least one);
//   - otherwise, if the bottleneck is a side stage (the fetch stage: the network) that may be
//     tuned, its first knob not yet tried doubles (connections, then prefetch);
//   - otherwise, if an edge is bursty (its producer often blocked while its consumer often
//     waits for input) or the bottleneck's input edge is often empty while its producer is
//     blocked, that edge's capacity doubles.
// Throughput is the input rate of the last stage in graph order that takes every item (log in
// gpt2.toml, or the sink), averaged over reports.
#pragma once

#include <deque>
#include <set>
#include <string>
#include <vector>

#include "graph/runtime.h"
#include "graph/observe/stats.h"

namespace pipeline::graph {

class Autotuner {
 public:
  explicit Autotuner(Runtime& rt);
  /// Whether anything is tunable in this run.
  bool active() const { return active_; }
  /// Looks at one report and maybe moves one knob; the decisions made, as events.
  std::vector<Event> step(const Snapshot& s);
  /// Whether the last step() moved a knob (the graph changed: its steady state starts again).
  bool moved() const { return moved_; }

 private:
  struct Knob {
    StageRt* stage = nullptr;  // workers of this stage (or, with side_knob, that knob of it), or
    EdgeRt* edge = nullptr;    // capacity of this edge
    std::string name;          // "tokenize workers", "capacity pack <- tokenize"
    std::string side_knob = {};  // a side stage's knob: "connections"
    int get() const;
    void set(int value) const;
  };
  struct Trial {
    Knob knob;
    int before = 0, after = 0;
    double rate_before = 0;
    int reports = 0;
    std::string reason;
  };
  double throughput(const Snapshot& s) const;
  std::vector<Event> judge(const Snapshot& s);
  std::vector<Event> propose(const Snapshot& s);
  std::vector<Event> start(const Snapshot& s, Knob knob, int value, std::string reason);

  Runtime& rt_;
  bool active_ = false;
  size_t measured_ = 0;  // the stage whose input rate is the throughput
  int reports_ = 0, quiet_until_ = 0;
  std::deque<double> rates_;  // recent throughputs
  bool trial_on_ = false, moved_ = false;
  Trial trial_;
  std::set<std::string> exhausted_;  // knobs a trial did not help
  std::string last_note_;            // the last "nothing to do" reason logged (logged once)
};

}  // namespace pipeline::graph
