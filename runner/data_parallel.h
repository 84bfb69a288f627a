// Data-parallel training across the ranks torchrun starts: the run-wide part (the group, this
// rank's role, stopping together, every rank's data cursor in the checkpoint) and the hooks the
// train stage calls. Without torchrun's environment none of this exists and a run is one process.
//
// What each rank does:
//   - reads its own documents (RunContext::partition, datasets/plan/partition.h);
//   - trains the same model on them; gradients are averaged by a bucketed all-reduce that overlaps
//     backward (dist::GradientReducer), on the last micro-batch of a step only;
//   - logs the loss and gradient norm averaged over the ranks;
//   - rank 0 alone evaluates and writes metrics and checkpoints; the others hand it their data
//     cursors through the store, so a checkpoint holds every rank's position.
// Stopping: a signal (Ctrl-C on torchrun reaches every rank as SIGINT; torchrun sends SIGTERM when
// a peer failed) only sets a flag. The ranks exchange their flags once per step, before any of the
// step's collectives, and all stop after the same step, with a checkpoint. With [data] loop =
// false a rank whose data runs out stops everyone the same way; that exchange then waits for its
// result every step (one small Gloo all-reduce), while with loop = true it is read one step
// later and never waits.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "model/dist/dist_group.h"
#include "model/dist/dist_reducer.h"
#include "stages/ranks.h"
#include "stages/settings.h"

namespace pipeline::stages {

struct DataCursor;
struct StepResult;

class DataParallel : public Ranks {
 public:
  DataParallel(std::shared_ptr<dist::Group> group, dist::BackendKind backend);

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  dist::BackendKind backend() const { return backend_; }
  dist::Group& group() { return *group_; }
  /// "rank 0 of 2 (gloo, cpu)"
  std::string describe(const torch::Device& device) const;

  /// A stop was asked for in this process (async-signal-safe). The ranks agree on it at the next
  /// step boundary and all stop there.
  void request_stop() { stop_requested_.store(true, std::memory_order_relaxed); }
  bool stop_requested() const { return stop_requested_.load(std::memory_order_relaxed); }
  /// The ranks agreed to stop before the last step: a stop request on some rank, or (loop =
  /// false) a rank out of data.
  enum class EarlyStop { none, requested, out_of_data };
  void set_stopped_early(EarlyStop why) { stopped_early_.store(why); }
  EarlyStop stopped_early() const { return stopped_early_.load(); }

  /// Ranks other than 0: hand the data cursor of a checkpointed step to rank 0.
  void publish_cursor(int64_t step, const DataCursor& cursor);
  /// Rank 0: a checkpoint's metadata (written by train, with rank 0's "cursor") completed with
  /// "world_size" and "cursors" (every rank's, in rank order), waiting for the others' cursors.
  std::string complete_checkpoint_metadata(int64_t step, const std::string& metadata) override;
  /// A TrainSync on this group.
  std::unique_ptr<StepSync> join_steps(const RunConfig& cfg, const std::vector<torch::Tensor>& params) override;

 private:
  std::shared_ptr<dist::Group> group_;
  dist::BackendKind backend_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<EarlyStop> stopped_early_{EarlyStop::none};
};

/// Where this run's data starts, from a checkpoint's metadata (the single "cursor" of a
/// one-process run, or "cursors" of a data-parallel one), on any number of ranks: what the ranks
/// that wrote it consumed, with what the runs before them consumed, as `done` (the readers deal
/// out the rest on this run's ranks: datasets/plan/partition.h), and the reader position a mix
/// replays from. A checkpoint whose cursors are only each rank's own (written before cursors
/// carried a place every rank shares) gives this rank's ("cursors"[rank]), and is refused with a
/// sentence on another number of ranks. Throws std::runtime_error naming the checkpoint and key.
DataCursor checkpoint_cursor(const std::string& metadata, int rank, int world_size, const std::string& checkpoint);

/// The global batch of a resumed run: the checkpoint's (its ranks x its "grad_accum"), shared by
/// this run's ranks.
struct ResumedBatch {
  int written_by = 1;               // ranks that wrote the checkpoint
  int64_t written_grad_accum = 1;   // their micro-batches per step
  int64_t micro_batches = 1;        // per step, all ranks together
  int64_t grad_accum = 1;           // per step and rank, on this run's ranks
};
/// Throws std::runtime_error, with the numbers of ranks that fit, when `world_size` does not
/// divide the checkpoint's micro-batches per step. A checkpoint without "grad_accum" (written
/// before it was recorded) counts `training.grad_accum`.
ResumedBatch resumed_batch(const std::string& metadata, int world_size, const TrainingSection& training,
                           const std::string& checkpoint);

/// The train stage's side over c10d (see StepSync in stages/ranks.h).
class TrainSync : public StepSync {
 public:
  /// Broadcasts rank 0's weights and hooks the gradient reducer on `params`.
  TrainSync(DataParallel& dp, const RunConfig& cfg, const std::vector<torch::Tensor>& params);
  std::string describe_buckets() const override;
  bool before_forward(bool last_micro_batch, int64_t checkpoint_requests) override;
  bool take_checkpoint_request() override;
  void before_backward(const torch::Tensor& loss, bool last_micro_batch) override;
  void average(torch::Tensor& loss, torch::Tensor& norm, StepResult& r) override;
  void sum_windows(StepResult& r) override;
  bool checkpoint_here(int64_t step, const DataCursor& cursor) override;
  void end_of_input() override;
  void finish() override;
  std::string share(const std::string& key, const std::string& value) override;
  void broadcast(std::vector<torch::Tensor>& tensors) override;

 private:
  /// Exchanges [stop requested, out of data, checkpoint asked] with the other ranks; the reason
  /// to stop, if any (and checkpoint_agreed_).
  DataParallel::EarlyStop exchange_flags(bool dry);

  DataParallel& dp_;
  bool lagged_;  // loop = true: read each step's flags one step later
  std::unique_ptr<dist::GradientReducer> reducer_;
  torch::Tensor flags_;                 // (3,) int64 on the host: stop requested, out of data, checkpoint asked
  std::shared_ptr<dist::Work> pending_;  // the lagged exchange in flight
  bool agreed_stop_ = false;
  // SIGUSR1: requests seen on this rank, those the exchange in flight carries, and those an
  // agreed checkpoint answered (a request is sent until a checkpoint after it was agreed).
  int64_t checkpoint_requests_ = 0, requests_in_flight_ = 0, requests_served_ = 0;
  bool checkpoint_agreed_ = false;
};

}  // namespace pipeline::stages
