// The one owner of the signals a training run handles, for a single process and for each rank
// under torchrun alike (`pipeline run` makes one, first thing, and keeps it to the last line):
//
//   SIGINT, SIGTERM, SIGHUP,  the first asks for a stop: the current step finishes, a checkpoint is
//   SIGQUIT, SIGUSR2,         written, and the run exits with 128 + the signal's number. Another
//   SIGXCPU                   one (any of them) 2 s or more after the first aborts; those sooner
//                             are the same request come twice (a scheduler that signals every
//                             process of a job, and torchrun passing it on: each rank gets two).
//                             Schedulers send these before a kill: Slurm, Kubernetes and PBS
//                             SIGTERM, LSF and Grid Engine SIGUSR2 (Grid Engine's -notify), a soft
//                             CPU-time limit SIGXCPU (repeated each second: only the first
//                             counts); torchrun passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on to
//                             every rank. SIGHUP is left alone when the process started with it
//                             ignored (nohup).
//   SIGUSR1                   a checkpoint at the next step; training goes on (Slurm's
//                             `--signal=USR1@90` saves before the time limit this way).
//   SIGPIPE                   ignored: a write to a pipe whose reader exited (`| tee` after Ctrl-C)
//                             fails with EPIPE, which the run log notes once, instead of killing
//                             the process in the middle of a checkpoint.
//
// The POSIX handler only increments lock-free atomics (async-signal-safe). A watcher thread turns
// them into the calls the run bound (stop, abort, checkpoint), made in ordinary thread context,
// where they may lock, allocate and print.
#pragma once

#include <atomic>
#include <cstdint>
#include <csignal>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace pipeline::stages {

class RunSignals {
 public:
  /// What the run does on each request. Called on the watcher thread, never concurrently.
  struct Actions {
    std::function<void(int signal)> stop;   // the first stop signal (SIGINT, SIGTERM, ...)
    std::function<void(int signal)> abort;  // a second one
    std::function<void()> checkpoint;       // each SIGUSR1
  };

  /// Installs the handlers (and ignores SIGPIPE). Only one RunSignals may live at a time: a
  /// second throws std::logic_error. Until the first bind() nothing is at stake: a stop signal
  /// ends the process as its default action would. SIGUSR1s are kept for bind().
  RunSignals();
  /// Restores every disposition it changed.
  ~RunSignals();
  RunSignals(const RunSignals&) = delete;
  RunSignals& operator=(const RunSignals&) = delete;

  /// Sets the actions (replacing earlier ones); requests already received are acted on within
  /// the watcher's period.
  void bind(Actions actions);
  /// Drops the actions: later requests are only counted (the run they would act on is over).
  void unbind() { bind({}); }

  /// The signal that asked for the stop (SIGINT, SIGTERM, ...), or 0 when none did.
  int stop_signal() const;
  /// "SIGTERM"
  static std::string name(int signal);

  /// Stop signals this soon after the first are the same request (signals.cpp), not an abort.
  static constexpr int64_t kSameRequestNs = 2'000'000'000;
  /// How many signals it handles (signals.cpp: the stop signals, SIGUSR1 and SIGPIPE).
  static constexpr size_t kHandled = 8;

  /// The counters the handler increments: lock-free, one cache line of their own.
  struct alignas(64) Counters {
    std::atomic<int> stops{0};  // the first stop signal, and each later one that asks to abort
    std::atomic<int> first_stop_signal{0};
    std::atomic<int64_t> first_stop_ns{0};  // when it came (CLOCK_MONOTONIC)
    std::atomic<int> checkpoints{0};
  };
  static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
                "a signal handler may only touch lock-free atomics");

 private:
  void watch();
  void act();

  Counters counters_;
  struct sigaction previous_[kHandled] = {};
  bool installed_[kHandled] = {};
  std::mutex mu_;  // guards actions_ and the handled counts; the watcher acts under it
  Actions actions_;
  bool bound_ = false;  // a run was bound: stop signals are requests from now on
  int stops_handled_ = 0, checkpoints_handled_ = 0;
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

}  // namespace pipeline::stages
