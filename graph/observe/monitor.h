// The monitor (engine internals): a thread that samples the running flow graph and reports.
//
// What it measures, and where:
//   - busy: the time each worker slot spent in an invocation (invocation.cpp, exact) less the
//     device waits the stage reported in it (Emitter::add_device_wait), which are a share of their
//     own; and the CPU time of the stages' own code (thread CPU clock, sampled). A wait is reported
//     when it ends, so a report taken during one counts the part so far as busy and the next
//     report moves it to device wait (window shares are clamped to [0, 1]);
//   - idle worker time, split by cause at each sample (every sample_interval): `starved` when
//     nothing waits on the stage's input edges (items held by a producer for their ordering
//     turn do not count as waiting), `blocked` when input waits but an output edge has no
//     credit left, `order wait` when that full edge is full of the stage's own items waiting
//     for their turn in order, `ready` when input waits and there is room downstream but no
//     core ran the stage (CPU contention);
//   - each edge's load: a histogram of sampled occupancy, plus the exact high-water mark
//     counted at every put (edge.cpp).
// Every report_interval it builds a Snapshot: whole-run figures, and the same over the
// steady-state window (the last steady_window seconds, once every stage has started; marks of
// the cumulative counters kept at each report make a window a difference). It runs the verdict
// tracker (graph/observe/verdict.h) and the autotuner (graph/observe/autotune.h), logs their events, hands the
// snapshot to the observers (the live view) and appends it to stats.jsonl. It also acts on stop
// requests, which a signal handler can only record: a second request, or a drain longer than
// stop_grace, aborts the run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graph/runtime.h"
#include "graph/observe/stats.h"
#include "graph/observe/verdict.h"

namespace pipeline::graph {

class Autotuner;

class Monitor {
 public:
  explicit Monitor(Runtime& rt);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  void add_observer(std::function<void(const Snapshot&)> fn) { observers_.push_back(std::move(fn)); }
  /// Starts sampling (rt.t0 is the run's start); opens stats.jsonl when there is a run directory.
  void start();
  /// Ends the thread (idempotent).
  void stop();
  void set_status(std::string status);

  /// The stats now (thread-safe). `report`: the monitor's own reports, which start a new
  /// report window and leave a mark for the steady-state window.
  Snapshot snapshot(bool finished, bool report);
  /// The last report: the final snapshot to observers and stats.jsonl, stats_summary.json and
  /// trace.json into the run directory.
  void finish(Snapshot final_snapshot);
  /// Adds the caller's figures (EngineOptions::annotate; a failure is ignored).
  void annotate(Snapshot& s);
  /// Every event so far (verdict changes, autotune decisions).
  std::vector<Event> events() const;

 private:
  void main();
  void report();
  void sample(int64_t now);
  void log_event(Event e);
  void write_trace() const;
  void notify(const Snapshot& s);

  // The cumulative counters at one moment (a report): a window is the difference of two.
  struct StageMark {
    int64_t busy_ns = 0, wait_ns = 0, cpu_ns = 0, device_ns = 0;  // busy_ns: in an invocation, waits included
    double starved = 0, blocked = 0, order = 0, ready = 0;
    uint64_t in = 0, out = 0;
  };
  struct EdgeMark {
    uint64_t samples = 0, full = 0, empty = 0;
    double sum = 0;
  };
  struct Mark {
    int64_t t = 0;
    double process_cpu_s = 0;
    std::vector<StageMark> stages;
    std::vector<EdgeMark> edges;
  };
  Mark mark_now(int64_t now) const;  // under mu_
  void fill_steady(Snapshot& s, const Mark& now);  // under mu_

  Runtime& rt_;
  std::vector<std::function<void(const Snapshot&)>> observers_;
  mutable std::mutex mu_;  // samples, windows, marks, status, events
  std::string status_ = "not started";
  int64_t last_sample_ = 0;
  struct Window {
    int64_t t = 0;
    std::vector<uint64_t> items;
    std::vector<double> busy, wait;  // host busy and device-wait seconds at the window's start
  } window_;
  std::deque<Mark> marks_;
  std::vector<Event> events_;
  std::vector<Event> fresh_events_;  // since the last report (shown by the live view)
  VerdictTracker tracker_;
  /// The steady-state window starts no earlier than this (the last autotune change; ns).
  std::atomic<int64_t> steady_floor_{0};
  std::unique_ptr<Autotuner> autotuner_;
  std::ofstream jsonl_;
  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace pipeline::graph
