// The spike guard's detector, on the device: a running mean and deviation of the loss and the
// gradient norm over the last `window` steps it let through, and for each step a verdict: skip it
// (its loss or norm is not finite, or lies more than `z` deviations above the mean) or update.
// A skipped step changes nothing: the fused AdamW gets the verdict as its found_inf (the same
// flag AMP's gradient scaler uses), so weights, moments and step counts stay as they were, and
// the window and the updates count do not move. The learning rate is looked up on the device
// from a table of the schedule, indexed by the updates taken, so the schedule counts updates
// and not steps.
//
// Everything here is tensor work on the training stream: no host sync, and the same calls can
// be captured into a CUDA graph (model/device/captured_step.h). The verdict leaves the device the
// way the loss does, by a non-blocking copy into pinned memory; the train stage reads it a step
// or two later (stages/spike_watch.h), and the host's copy of the state goes into checkpoints.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "model/net/optim.h"
#include "model/net/schedule.h"

namespace pipeline::model {

/// Example:
///   SpikeGuard guard({.window = 100, .z = 6}, schedule, total_steps, device);
///   auto norm = clip_grad_norm(params, 1.0);
///   auto found_inf = guard.judge(loss, norm, opt);  // also sets opt's learning rate
///   opt.step(found_inf);
struct SpikeGuardOptions {
  int64_t window = 100;      // steps let through whose values make the mean and deviation
  double z = 10.0;           // deviations above the mean that skip a step
  int64_t min_steps = 50;    // z-scores count once the window holds this many steps
  /// The deviation is at least this share of the mean: a window of equal values does not turn
  /// the smallest rise into an infinite z-score.
  double min_rel_std = 1e-3;
};

/// The detector's state as the host keeps it (and a checkpoint holds it).
struct SpikeGuardState {
  std::vector<float> loss, norm;  // the window's values, oldest first (at most `window`)
  int64_t count = 0;    // values let into the window since the run began (places them in the ring)
  int64_t updates = 0;  // optimizer updates taken: the schedule's index
  int64_t streak = 0;   // skipped steps in a row
  int64_t skips = 0;    // skipped steps in all
  /// Adds a step that was let through (what the device did), keeping the newest `window`.
  void accept(float loss_value, float norm_value, int64_t window);
};

/// What judge() decided for one step, as read back on the host.
struct SpikeVerdict {
  static constexpr int64_t kFields = 9;
  bool skipped = false;
  float loss = 0, norm = 0;     // the values judged (all-reduced over the ranks)
  double loss_z = 0, norm_z = 0;  // their z-scores (0 until the window has min_steps)
  int64_t updates = 0;          // updates taken after this step
  int64_t streak = 0, skips = 0;  // after this step
  double lr = 0;                // the learning rate this step's update used (or would have)
  /// From the (kFields) float64 host tensor judge() filled.
  static SpikeVerdict from(const torch::Tensor& host);
};

class SpikeGuard {
 public:
  /// `total_steps` is [training] steps: the table holds the schedule's rate for 0..total_steps
  /// updates (float32, as the optimizer's own rate tensor). Throws std::invalid_argument for a
  /// bad option or more than 2^24 steps (the optimizer's float32 step counts stop being exact).
  SpikeGuard(SpikeGuardOptions options, const LrSchedule& schedule, int64_t total_steps, torch::Device device);

  /// Judges a step from its loss and gradient norm (0-dim, on the device; with several ranks,
  /// their averages), on the calling thread's current stream: sets `opt`'s learning rate to the
  /// schedule's at the updates taken, moves the state, and returns found_inf for
  /// AdamW::step (0-dim float32: 1 to skip). No host sync.
  torch::Tensor judge(const torch::Tensor& loss, const torch::Tensor& norm, AdamW& opt);

  /// The last verdict, (SpikeVerdict::kFields) float64 on the device, rewritten in place by each
  /// judge(): copy it out before the next.
  const torch::Tensor& verdict() const { return verdict_; }

  /// Puts a host state on the device (a copy, outside the hot loop). A window of another size
  /// keeps the newest values that fit.
  void load(const SpikeGuardState& state);
  const SpikeGuardOptions& options() const { return o_; }

 private:
  SpikeGuardOptions o_;
  torch::Tensor lr_table_;  // (total_steps + 1) float32
  torch::Tensor hist_;      // (2, window) float32: loss and norm, ring by count % window
  torch::Tensor ring_;      // (window) int64: 0..window-1
  torch::Tensor count_, updates_, streak_, skips_;  // () int64
  torch::Tensor verdict_;   // (kFields) float64
  int64_t last_index_ = 0;  // total_steps
};

}  // namespace pipeline::model
