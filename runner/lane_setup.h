// The data order of a run, as the run layer settles it before the engine starts
// (docs/data_order.md):
//   - a fresh run trains in [data] order ("lanes" by default); a resumed run in the order its
//     checkpoint was written in: "order" and "lanes" (K) in its metadata, or, in a checkpoint
//     written before lanes existed, the documents order (rank r of W keeps documents d % W == r);
//   - in the lanes order: K ([data] lanes, or the rule for "auto"), the rows of a step
//     N = batch_size x grad_accum x ranks, checked (K divides N, the ranks divide K, a resume keeps
//     the checkpoint's N), and this rank's lanes with where they start (a checkpoint's cursors,
//     gathered from every rank that wrote it: runner/data_parallel.h's checkpoint_cursor).
// Every refusal is a sentence naming the numbers and what to change. Torch-free: `pipeline check`
// settles the order the same way for its dry run (one process, or a resume's checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runner/run_resolve.h"
#include "stages/lane_session.h"

namespace pipeline::stages {

/// K for [data] lanes = "auto": N, the rows of one step. Every number of ranks that divides the
/// step's rows then trains the same rows (the widest invariance the rows allow), and a rank
/// serves N/W = batch_size x grad_accum lanes, each holding one unit open
/// (docs/data_order.md: memory).
uint32_t auto_lanes(uint64_t step_rows);

/// The data order a checkpoint's metadata says it was written in.
struct CheckpointOrder {
  std::string order = "documents";  // a checkpoint without "order": before lanes
  uint32_t lanes = 0;               // K (the lanes order)
  uint64_t rows = 0;                // N, the rows of its steps (the lanes order)
  int64_t data_step = 0;            // the data step it goes on with ("data_step"; before it, its step)
};
/// Throws std::runtime_error naming the checkpoint and key for values that are not one.
CheckpointOrder checkpoint_order(const std::string& metadata, const std::string& checkpoint);

/// A resumed run takes its checkpoint's order (and K): cfg.data.order and lanes, shown as coming
/// from the checkpoint. A --set of either that disagrees, or in the lanes order a step of other
/// rows than the checkpoint's on `world` ranks, is refused with what to change. Without `world`
/// (`pipeline check`, which does not know the ranks a run will have) the rows are not checked.
void apply_checkpoint_order(const CheckpointOrder& held, const RunRequest& req, RunConfig& cfg,
                            std::optional<int> world, const std::string& checkpoint);

/// The lanes order's session of this rank (cfg.data.order = "lanes"): K resolved and checked
/// against the step's rows and the ranks, this rank's lanes, where they start (`start`: this
/// rank's lanes' cursors from a checkpoint, in lanes_of order; empty for a fresh run) and the
/// demand board. Throws std::invalid_argument with the numbers when K, N and the ranks do not fit.
std::shared_ptr<LaneSession> lane_session(const RunConfig& cfg, uint32_t rank, uint32_t world,
                                          std::vector<datasets::LaneCursor> start);

}  // namespace pipeline::stages
