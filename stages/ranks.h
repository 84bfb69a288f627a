// What the stages of a training graph see of data-parallel training: which rank this is, the
// ranks' agreement at each step (gradients, stopping together, checkpoints), and every rank's
// data position in a checkpoint. The run layer implements it over c10d (runner/data_parallel.h);
// one process has none (RunContext::ranks is null).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stages/settings.h"

namespace pipeline::stages {

struct DataCursor;
struct StepResult;

/// The train stage's side of one run's ranks, called at fixed points of each step.
class StepSync {
 public:
  virtual ~StepSync() = default;
  /// "gradients: 7 buckets all-reduced during backward, 3.2 MB in all (largest 1.0 MB)"
  virtual std::string describe_buckets() const = 0;
  /// Before a micro-batch's forward. On a step's last micro-batch: agrees with the other ranks
  /// whether to go on; false means every rank stops now, before this step. `checkpoint_requests`
  /// counts the checkpoints asked for on this rank so far (SIGUSR1); the ranks agree on those too.
  virtual bool before_forward(bool last_micro_batch, int64_t checkpoint_requests) = 0;
  /// Whether the ranks agreed (in before_forward) to checkpoint this step; true once per agreement.
  virtual bool take_checkpoint_request() = 0;
  /// Before backward: the last micro-batch's backward averages the gradients over the ranks.
  virtual void before_backward(const torch::Tensor& loss, bool last_micro_batch) = 0;
  /// After clipping: replaces loss and norm with their averages over the ranks (asynchronous; the
  /// wait is left to whoever reads r.loss, through wait_ready).
  virtual void average(torch::Tensor& loss, torch::Tensor& norm, StepResult& r) = 0;
  /// Sums the step's row-set hash (r.windows) over the ranks into r.windows_parts, asynchronously
  /// (r.windows_reduced; read through step_windows after wait_ready).
  virtual void sum_windows(StepResult& r) = 0;
  /// At a checkpointed step: true on the writing rank (take the snapshot); the others hand it
  /// their cursor.
  virtual bool checkpoint_here(int64_t step, const DataCursor& cursor) = 0;
  /// Train's input ended before its last step without an agreed stop: this rank ran out of data.
  /// Tells the others, so that everyone stops after the same step.
  virtual void end_of_input() = 0;
  /// The run is over (last step, or an agreed stop): completes the collectives still in flight.
  virtual void finish() = 0;
  /// The spike guard's rollback, which every rank makes at the same step: the writing rank's
  /// `value` (what it read of the checkpoint it goes back to), returned on every rank; `key` is
  /// new for each rollback of the run.
  virtual std::string share(const std::string& key, const std::string& value) = 0;
  /// Copies the writing rank's `tensors` into every rank's, in place.
  virtual void broadcast(std::vector<torch::Tensor>& tensors) = 0;
};

/// This process's place among the ranks of a run.
class Ranks {
 public:
  virtual ~Ranks() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Rank 0 writes the run directory's files; the others only train.
  bool writer() const { return rank() == 0; }
  /// The writing rank: a checkpoint's metadata (written by train, with this rank's "cursor")
  /// completed with every rank's cursor, waiting for the others'.
  virtual std::string complete_checkpoint_metadata(int64_t step, const std::string& metadata) = 0;
  /// The train stage's step synchronisation: broadcasts the writing rank's weights, so that every
  /// rank starts from the same ones, and hooks the gradient averaging on `params`. Call on the
  /// training thread, after the model and optimizer are built.
  virtual std::unique_ptr<StepSync> join_steps(const RunConfig& cfg, const std::vector<torch::Tensor>& params) = 0;
};

}  // namespace pipeline::stages
