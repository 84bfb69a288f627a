// The spike guard's host side ([training.guard]): what the train stage knows of the device's
// verdicts (model/net/spike_guard.h) and decides from them, and what a checkpoint records of it.
//
// The device judges every step at once; the host reads a step's verdict only once the step is
// known to be done, without waiting: on CUDA at the start of each step, every verdict but the
// newest one (train's run-ahead has waited for those), on the CPU at once. It waits for them only
// where it must know everything: before a checkpoint's snapshot, and near the run's end (to
// know which step takes the last update). Where it reads is a function of the steps alone, so a
// run decides the same whether or not it was stopped and resumed, and every rank of a
// data-parallel run decides the same.
//
// From the verdicts it keeps a copy of the detector's state (the window, the counts), exact
// whenever nothing is left unread, which a checkpoint's metadata holds ("guard"), and it sees a
// streak: max_skips skipped steps in a row. The train stage then rolls back to the newest
// checkpoint from before the streak, or stops; the data of the steps since that checkpoint, and
// up to rollback_skip steps from it, is never trained on (data steps are read once, in order,
// and counted on whatever happens to the weights: a rollback does not re-read them).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "model/device/device_event.h"
#include "model/net/spike_guard.h"
#include "stages/settings.h"

namespace pipeline::stages {

/// What a checkpoint records of the guard (its metadata's "guard" object). Also without the
/// guard: `detector.updates` is the schedule's count whenever skip_steps or an earlier guard made
/// it differ from the step.
struct GuardRecord {
  model::SpikeGuardState detector;
  int64_t streak_first = 0;  // data step of the current streak's first skip (detector.streak > 0)
  int64_t rollbacks = 0;
  std::vector<StepRange> rolled_back;  // data steps skipped by rollbacks, oldest first
  std::string to_json() const;
  /// From a checkpoint's metadata; one without "guard" (written before it, or by a run that never
  /// skipped) gives updates = `step`. Throws std::runtime_error naming `source` and the key.
  static GuardRecord from_metadata(const JsonValue& meta, int64_t step, const std::string& source);
};

/// "131-150", or "131" for one step.
std::string range_text(const StepRange& r);

class SpikeWatch {
 public:
  /// A streak of skipped steps, read and not acted upon yet.
  struct Trip {
    int64_t first = 0, last = 0;  // data steps
    model::SpikeVerdict verdict;  // the last one's
  };

  SpikeWatch(GuardSection options, GuardRecord start);

  /// Step `step` (a data step) was issued with the guard on: its verdict lands in `host` once
  /// `done` completes (null: it is there already).
  void issued(int64_t step, torch::Tensor host, std::shared_ptr<model::DeviceEvent> done);
  /// Reads the verdicts of issued steps, oldest first, all but the newest `leave`, waiting for
  /// each step to be done (no wait for one the caller knows is). Returns the time waited. The
  /// first streak read is kept as the trip until rolled_back() clears it.
  std::chrono::nanoseconds read(size_t leave);
  /// A step without the guard took its update (the host knows at once).
  void updated() { ++record_.detector.updates; }

  size_t unread() const { return pending_.size(); }
  int64_t updates_known() const { return record_.detector.updates; }
  /// The detector's state and the rollbacks: exact when unread() == 0.
  const GuardRecord& record() const { return record_; }
  const std::optional<Trip>& trip() const { return trip_; }
  bool can_roll_back() const { return record_.rollbacks < options_.max_rollbacks; }

  /// Whether data step `step` is read but not trained on: skip_steps, or a rollback's range.
  bool skips_data(int64_t step) const;
  /// The range of skipped data steps that holds `step` (skips_data is true).
  StepRange skipped_range(int64_t step) const;
  /// Whether a checkpoint of step `step` may be rolled back to: not one a rollback abandoned.
  bool abandoned(int64_t step) const;

  /// The train stage rolled back to the checkpoint of data step `target`, holding `restored`,
  /// after `consumed` data steps: the steps since `target` and up to rollback_skip from it are
  /// skipped (returned), the trip is cleared and the count of rollbacks goes on.
  StepRange rolled_back(int64_t target, GuardRecord restored, int64_t consumed);

 private:
  struct Pending {
    int64_t step;
    torch::Tensor host;
    std::shared_ptr<model::DeviceEvent> done;
  };
  GuardSection options_;
  GuardRecord record_;
  std::deque<Pending> pending_;
  std::optional<Trip> trip_;
};

}  // namespace pipeline::stages
