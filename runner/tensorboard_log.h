// [logging] tensorboard = true: a TensorBoard event file in the run directory (graph/observe/tensorboard.h),
// fed from two places, so that `tensorboard --logdir runs/` plots a run while it trains:
//   - every metrics.jsonl line: each number except "step" becomes a scalar at that step, tagged
//     train/<key> (loss, lr, grad_norm, tokens_per_s, ms_per_step, mfu, ...) or, for evaluation
//     lines, val/<key without "val_"> (val/loss), and HellaSwag's hellaswag/<key without
//     "hellaswag_"> (hellaswag/acc_norm, hellaswag/acc, hellaswag/items);
//   - every stats snapshot of the engine (about once a second): each stage's busy share and
//     items/s and each queue's occupancy (graph::snapshot_scalars), at the training step reached
//     when it was taken, one point per step at most (so the series stays ordered on resume).
// A resumed run's file starts with a session start at the step after its checkpoint: TensorBoard
// drops what earlier files hold from there on (trained before a crash, and again since), so each
// step shows once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/engine.h"
#include "stages/types.h"

namespace pipeline::stages {

/// The scalars of one metrics.jsonl line, and its step; false when the line has no integer "step".
bool metric_scalars(const std::string& json, int64_t& step, std::vector<std::pair<std::string, double>>& scalars);

class TensorBoardLog {
 public:
  /// When ctx.cfg.logging.tensorboard is on, the run has a directory and this process writes it
  /// (rank 0, or the only process), starts the event file and
  /// attaches it to ctx.log and to `engine` (call before engine.run()); else returns nullptr.
  /// Keep the result until the run is over: destroying it detaches from ctx.log.
  static std::unique_ptr<TensorBoardLog> attach(graph::Engine& engine, RunContext& ctx);
  ~TensorBoardLog();

  struct State;

 private:
  explicit TensorBoardLog(RunContext& ctx) : ctx_(ctx) {}
  RunContext& ctx_;
  std::shared_ptr<State> state_;
  int listener_ = 0;  // the id of its metrics listener in ctx.log
};

}  // namespace pipeline::stages
