// Held invocations (engine internals). A timed stage (StageType::timed, such as `delay`) asks
// for its invocation to complete later (Emitter::hold_for) instead of sleeping on a TBB worker:
// its async node's body returns at once, and this timer thread completes the invocation at its
// deadline, sending its outputs through the node's gateway. The gateway's reserve_wait /
// release_wait bracket each held invocation, so the flow graph's wait_for_all() covers them.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "graph/invocation.h"

namespace pipeline::graph {

class Timer {
 public:
  Timer() = default;
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  void start();
  /// Completes `inv` at inv->hold_until() (any thread).
  void hold(std::unique_ptr<Invocation> inv);
  /// Completes everything held now (the run is aborting).
  void expire_all();
  /// Completes what is left and ends the thread.
  void stop();

 private:
  void main();
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<int64_t, std::unique_ptr<Invocation>> held_;
  bool expire_ = false, stopping_ = false;
  std::thread thread_;
};

}  // namespace pipeline::graph
