// How far train's thread may issue work ahead of the GPU. Kernel launches are asynchronous: with
// nothing to stop it, the host runs ahead until CUDA's launch queue is full and then spins inside
// the next launch (a whole core under CUDA graphs), and after Ctrl-C seconds of queued steps still
// run. Before issuing step N, train waits for step N - depth (default 2: N - 2) to complete, on
// that step's blocking-sync event: the thread sleeps, the GPU still has step N - 1 queued, and the
// stats count the wait as device wait. Torch-free (the event type is a parameter), so the
// bookkeeping is tested on the CPU (tests/test_device_logic.cpp) and the sleeping on a GPU
// (tests/test_train_gpu.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <utility>

namespace pipeline::model {

/// Event: anything with `std::chrono::nanoseconds wait() const` (model::DeviceEvent).
///
/// Example (train's loop):
///   RunAhead<DeviceEvent> ahead;                  // depth 2
///   out.add_device_wait(ahead.before_step());    // before the step's first launch
///   ... launch the step, record `done` after it ...
///   ahead.issued(done);
template <class Event>
class RunAhead {
 public:
  explicit RunAhead(size_t depth = 2) : depth_(depth < 1 ? 1 : depth) {}

  /// Waits until at most depth - 1 issued steps are incomplete; returns the time waited.
  std::chrono::nanoseconds before_step() {
    std::chrono::nanoseconds waited{0};
    while (pending_.size() >= depth_) {
      waited += pending_.front()->wait();
      pending_.pop_front();
    }
    return waited;
  }

  /// The step just issued completes when `done` does. Null (a CPU step: nothing asynchronous)
  /// is not kept.
  void issued(std::shared_ptr<const Event> done) {
    if (done) pending_.push_back(std::move(done));
  }

  /// Steps issued and not yet waited for.
  size_t pending() const { return pending_.size(); }

 private:
  size_t depth_;
  std::deque<std::shared_ptr<const Event>> pending_;
};

}  // namespace pipeline::model
