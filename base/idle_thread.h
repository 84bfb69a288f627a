// A thread of its own whose work runs at idle priority: under Linux's SCHED_IDLE (nice +19 where
// that is refused), it takes only the cycles other threads leave (evaluation during a CPU run,
// which must not slow the training it shares the cores with).
//
// Only the work is lowered, never the caller: run() hands the work over and sleeps until it is
// done. The caller keeps its priority for its other duties, which a thread at idle priority must
// not have: locks that other threads take (a spin lock held by a thread that hardly runs stalls
// them), and waking a thread pool, which may create its threads from the waker, and threads
// inherit the policy of the thread that creates them. The threads the work itself creates
// (OpenMP's team for a torch op) inherit the idle policy, as they should; no other thread does.
//
// Example:
//   IdleThread idle("eval compute");    // created from a thread at normal priority
//   idle.run([&] { loss = evaluate(); });  // runs there, at idle priority; exceptions come back
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace pipeline {

class IdleThread {
 public:
  /// Starts the thread, named `name` (15 characters kept: base/thread_name.h), and lowers it.
  explicit IdleThread(std::string name);
  /// Joins the thread (after the work in hand, if any).
  ~IdleThread();
  IdleThread(const IdleThread&) = delete;
  IdleThread& operator=(const IdleThread&) = delete;

  /// Runs `work` on the thread and waits for it, sleeping; rethrows what it threw. One caller at a
  /// time.
  void run(const std::function<void()>& work);

  /// How the thread was lowered: "SCHED_IDLE", "nice 19", or "" when the system refused both
  /// (it then runs at the priority it was created with).
  const std::string& lowered() const { return lowered_; }

 private:
  void main();

  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* work_ = nullptr;  // under mu_: the work handed over, until it is done
  std::exception_ptr error_;                     // under mu_: what the last work threw
  bool stop_ = false;                            // under mu_
  std::string lowered_;                          // set before the constructor returns
  std::thread thread_;
};

}  // namespace pipeline
