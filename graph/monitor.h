// The monitor (engine internals): a thread that samples the running flow graph and reports.
//
// What it measures, and where:
//   - busy: the time each worker slot spent in an invocation (invocation.cpp, exact);
//   - idle worker time, split by cause at each sample (every sample_interval): `starved` when
//     nothing waits on the stage's input edges (items held by a producer for their ordering
//     turn do not count as waiting), `blocked` when input waits but an output edge has no
//     credit left, `ready` when input waits and there is room downstream but no core ran the
//     stage (CPU contention);
//   - each edge's load: a histogram of sampled occupancy, plus the exact high-water mark
//     counted at every put (edge.cpp).
// Every report_interval it builds a Snapshot for the observers (the live view) and appends it
// to stats.jsonl. It also acts on stop requests, which a signal handler can only record: a
// second request, or a drain longer than stop_grace, aborts the run.
#pragma once

#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graph/runtime.h"
#include "graph/stats.h"

namespace pipeline::graph {

class Monitor {
 public:
  explicit Monitor(Runtime& rt) : rt_(rt) {}
  ~Monitor() { stop(); }
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  void add_observer(std::function<void(const Snapshot&)> fn) { observers_.push_back(std::move(fn)); }
  /// Starts sampling (rt.t0 is the run's start); opens stats.jsonl when there is a run directory.
  void start();
  /// Ends the thread (idempotent).
  void stop();
  void set_status(std::string status);

  /// The stats now (thread-safe). `advance_window`: start a new report window (the monitor's
  /// own reports only).
  Snapshot snapshot(bool finished, bool advance_window);
  /// The last report: the final snapshot to observers and stats.jsonl, stats_summary.json and
  /// trace.json into the run directory.
  void finish(const Snapshot& final_snapshot);

 private:
  void main();
  void sample(int64_t now);
  void write_trace() const;
  void notify(const Snapshot& s);

  Runtime& rt_;
  std::vector<std::function<void(const Snapshot&)>> observers_;
  std::mutex mu_;  // samples, windows, status
  std::string status_ = "not started";
  int64_t last_sample_ = 0;
  struct Window {
    int64_t t = 0;
    std::vector<uint64_t> items;
    std::vector<double> busy;
  } window_;
  std::ofstream jsonl_;
  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace pipeline::graph
