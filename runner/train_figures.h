// The training figures each stats report carries (graph::Snapshot::train): step, loss, val_loss,
// hellaswag_acc_norm, hellaswag_acc, tokens_per_s, ms_per_step, mfu, and the spike guard's
// guard_skips and guard_rollbacks, from the newest metrics lines the log, eval and train stages
// write, and device_busy, the busy share of the device over the last report (GPU time on CUDA,
// the train stage's host compute time on a CPU run). With them, stats.jsonl, the live page and
// /metrics show the run's progress beside its stages.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "graph/observe/stats.h"
#include "stages/types.h"

namespace pipeline::stages {

class TrainFigures {
 public:
  /// Listens to ctx.log's metrics lines (when the run has a log) until destroyed.
  explicit TrainFigures(RunContext& ctx);
  ~TrainFigures();
  TrainFigures(const TrainFigures&) = delete;
  TrainFigures& operator=(const TrainFigures&) = delete;

  /// For graph::EngineOptions::annotate: adds the newest figures to a report.
  void annotate(graph::Snapshot& s);
  /// Takes the numbers of one metrics line (public for tests).
  void take(const std::string& json);

 private:
  RunContext& ctx_;
  int listener_ = 0;
  std::mutex mu_;
  std::vector<std::pair<std::string, double>> figures_;  // in the order first seen
  double last_t_ = -1, last_device_s_ = 0;
};

}  // namespace pipeline::stages
