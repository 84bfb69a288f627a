// Learning-rate schedule: linear warmup to lr_max, then cosine decay to lr_min (GPT-2 / nanoGPT).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace pipeline::model {

/// The most updates a table of the schedule on the device covers (the spike guard's,
/// model/net/spike_guard.h): AdamW's float32 step counts are exact that far.
inline constexpr int64_t kLrTableMaxSteps = int64_t{1} << 24;

/// Example:
///   LrSchedule sched{.lr_max = 6e-4, .lr_min = 6e-5, .warmup_steps = 700, .total_steps = 19073};
///   optimizer.set_lr(sched.at(step));
struct LrSchedule {
  double lr_max = 6e-4;
  double lr_min = 6e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  /// Learning rate for 0-based `step`: lr_max * (step+1) / warmup_steps during warmup (so step 0
  /// is not wasted at lr 0 and step warmup_steps-1 reaches lr_max), then
  /// lr_min + (lr_max - lr_min) * (1 + cos(pi * progress)) / 2 with progress going from 0 at
  /// step == warmup_steps to 1 at step == total_steps, and lr_min from there on.
  double at(int64_t step) const {
    if (step < warmup_steps) {
      return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    }
    if (step >= total_steps) return lr_min;
    const double span = static_cast<double>(std::max<int64_t>(total_steps - warmup_steps, 1));
    const double progress = static_cast<double>(step - warmup_steps) / span;  // [0, 1)
    return lr_min + (lr_max - lr_min) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
};

}  // namespace pipeline::model
