// What `pipeline run` does around the engine when it is one rank of several (torchrun):
//   - a stop request (runner/signals.h: SIGINT, SIGTERM, SIGHUP, ...; torchrun passes Ctrl-C on to
//     every rank as SIGINT, and sends SIGTERM when another rank failed) becomes a stop that the
//     ranks agree on at the next step; an abort (a second signal) ends this rank, and the process
//     exits within a bounded time even if a collective hangs;
//   - a peer that fails or goes silent (dist::Group::watch) aborts this rank the same way, with
//     a message naming that peer;
//   - ranks other than 0 publish their stage statistics for rank 0 (RankStats);
//   - at the end every rank records how it ended, so the others can name a rank that failed.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "graph/engine.h"
#include "runner/data_parallel.h"
#include "runner/rank_store.h"
#include "stages/types.h"

namespace pipeline::stages {

class RankSession {
 public:
  /// Starts the failure watch; call before engine.run().
  RankSession(RunContext& ctx, DataParallel& dp, graph::Engine& engine);
  /// Detaches the failure watch.
  ~RankSession();
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  /// The message for an error that ended this rank's run: when a peer is to blame, which one and
  /// what happened to it, then the error seen here; else the error (waits a few seconds for the
  /// evidence).
  std::string explain(const std::string& error);
  /// Records this rank's outcome for the others ("" = cleanly) and, on ranks other than 0,
  /// publishes the final statistics. Call once, after engine.run().
  void finished(const std::string& error, const graph::Snapshot& own);
  /// Rank 0: every rank's final statistics merged with `own` (waits briefly for them).
  graph::Snapshot merged(const graph::Snapshot& own);
  /// Rank 0: `own` merged with what the others have published so far (never waits).
  graph::Snapshot merged_now(const graph::Snapshot& own) { return stats_.merged_latest(own); }
  /// A peer's failure reported by the watch, if any.
  std::string peer_failure() const;
  /// Every rank, last: the rank that hosts the store (rank 0, or under srun the first node's
  /// first task) waits until every rank has recorded its exit and rank 0 has read their final
  /// statistics, so the store outlives the others' last reads; rank 0 says when it has read them.
  void wait_for_others();
  /// "rank 1 of 2: " for messages.
  std::string prefix() const;

  /// The ranks stop together after the step they agree on, with a checkpoint.
  void request_stop();
  /// This rank stops now; it exits with `code` if it has not unwound within a few seconds.
  void abort(int code);

 private:
  struct WatchTarget;
  void abort_soon(const std::string& why);
  void arm_abort(int code);

  RunContext& ctx_;
  DataParallel& dp_;
  graph::Engine& engine_;
  RankStats stats_;
  mutable std::mutex mu_;
  std::string peer_failure_;
  std::shared_ptr<WatchTarget> target_;
  std::atomic<int64_t> abort_since_{0};  // steady-clock ns when an abort was asked for (0: none)
  std::atomic<int> abort_code_{0};
  std::thread reaper_;
  std::atomic<bool> done_{false};
};

}  // namespace pipeline::stages
