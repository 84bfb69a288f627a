// Live view of a running graph: on a terminal, a screen redrawn at each report (about once a
// second) with one row per stage and one bar per queue, the bottleneck highlighted; otherwise
// one compact line per report. It renders from the engine's monitor thread, off the hot path.
#pragma once

#include <functional>
#include <iosfwd>
#include <mutex>
#include <string>
#include <vector>

#include "graph/engine.h"

namespace pipeline::graph {

struct LiveViewOptions {
  enum class Mode { automatic, tty, line, off };
  Mode mode = Mode::automatic;  // automatic: tty when the stream is a terminal (stderr/stdout)
  /// Extra text shown above the table (the run command's loss/tokens line); set via set_status.
  int bar_width = 30;
  /// Line mode (not a terminal: logs, CI): seconds between lines, so a long run's log stays
  /// readable. The final snapshot is always printed.
  double line_interval_s = 10.0;
  /// Called once, with errno, when a write to the stream fails (a closed pipe or terminal): the
  /// view stops writing then, and the run goes on.
  std::function<void(int err)> on_write_error = {};
};

class LiveView {
 public:
  /// Registers itself as an observer of `engine`: construct before engine.run().
  LiveView(Engine& engine, std::ostream& os, LiveViewOptions opts = {});
  /// A line the caller wants shown with each refresh (e.g. "step 120 loss 4.31 tok/s 81k").
  void set_status(std::string line);
  /// Renders one snapshot (used by the observer; public for tests and `pipeline stats`).
  std::string render(const Snapshot& s, bool tty) const;

 private:
  void on_snapshot(const Snapshot& s);
  /// False (and the error reported) once the stream failed.
  bool stream_ok();
  std::ostream& os_;
  LiveViewOptions opts_;
  bool tty_ = false;
  int lines_drawn_ = 0;
  bool lost_ = false;  // the stream failed: nothing more is written
  double last_line_t_ = -1e300;
  mutable std::mutex mu_;
  std::string status_;
  std::vector<Event> recent_;  // the last few events, shown under the table on a terminal
};

}  // namespace pipeline::graph
