// One rank's run around the engine: stopping together, peer failures, statistics, outcome (see
// rank_session.h).
#include "runner/rank_session.h"

#include <cstdio>

#include "runner/data_parallel.h"

namespace pipeline::stages {

namespace {

using Clock = std::chrono::steady_clock;

// After an abort, how long the rank may take to unwind (a collective blocked on a dead peer may
// not return) before it exits on its own.
constexpr auto kAbortGrace = std::chrono::seconds(10);

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

}  // namespace

// Peer failures arrive on the group's watch thread, which may outlive the session: the callback
// holds this, and reaches the session only while it is alive (the destructor detaches it).
struct RankSession::WatchTarget {
  std::mutex mu;
  RankSession* session = nullptr;
};

RankSession::RankSession(RunContext& ctx, DataParallel& dp, graph::Engine& engine)
    : ctx_(ctx), dp_(dp), engine_(engine), stats_(dp.group()), target_(std::make_shared<WatchTarget>()) {
  if (!dp_.writer())
    engine_.add_observer([this](const graph::Snapshot& s) {
      if (s.finished) return;  // the final one goes out in finished()
      try {
        stats_.publish(s, false);
      } catch (const std::exception&) {
        // The store is going away: the watch reports that, statistics do not matter then.
      }
    });
  {
    std::lock_guard<std::mutex> lock(target_->mu);
    target_->session = this;
  }
  dp_.group().watch([target = target_](const std::string& failure) {
    std::lock_guard<std::mutex> lock(target->mu);
    if (target->session) target->session->abort_soon(failure);
  });
  // Exits the process if an abort does not unwind in time (a collective that never returns).
  reaper_ = std::thread([this] {
    while (!done_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int64_t since = abort_since_.load();
      if (since == 0 || now_ns() - since < std::chrono::duration_cast<std::chrono::nanoseconds>(kAbortGrace).count())
        continue;
      std::string why = peer_failure();
      std::fprintf(stderr, "pipeline run (%s): exiting: still blocked %lld s after the abort%s%s\n", prefix().c_str(),
                   static_cast<long long>(kAbortGrace.count()), why.empty() ? "" : "; ", why.c_str());
      std::fflush(stderr);
      dp_.group().record_exit(why.empty() ? "aborted" : why);
      std::_Exit(abort_code_.load() ? abort_code_.load() : 1);
    }
  });
}

void RankSession::request_stop() { dp_.request_stop(); }

void RankSession::abort(int code) {
  engine_.abort();
  arm_abort(code);
}

void RankSession::arm_abort(int code) {
  int64_t zero = 0;
  if (abort_since_.compare_exchange_strong(zero, now_ns())) abort_code_.store(code);
}

RankSession::~RankSession() {
  done_.store(true);
  if (reaper_.joinable()) reaper_.join();
  std::lock_guard<std::mutex> lock(target_->mu);
  target_->session = nullptr;
}

void RankSession::abort_soon(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer_failure_ = why;
  }
  std::fprintf(stderr, "pipeline run (%s): %s; stopping\n", prefix().c_str(), why.c_str());
  std::fflush(stderr);
  engine_.abort();
  dp_.group().abort(why);
  arm_abort(1);
}

std::string RankSession::peer_failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_failure_;
}

std::string RankSession::prefix() const {
  return "rank " + std::to_string(dp_.rank()) + " of " + std::to_string(dp_.size());
}

std::string RankSession::explain(const std::string& error) {
  std::string cause = peer_failure();
  if (cause.empty()) cause = dp_.group().diagnose();
  // The peer's fate first: what failed here (a collective, in c10d's words) is its consequence.
  return cause.empty() ? error : cause + "\n  (on this rank: " + error + ")";
}

void RankSession::finished(const std::string& error, const graph::Snapshot& own) {
  dp_.group().record_exit(error);
  if (dp_.writer()) return;
  try {
    stats_.publish(own, true);
  } catch (const std::exception&) {
  }
}

graph::Snapshot RankSession::merged(const graph::Snapshot& own) {
  std::vector<int> missing;
  auto timeout = std::min(std::chrono::milliseconds(30000), dp_.group().options().timeout);
  auto m = stats_.merged_final(own, timeout, &missing);
  for (int r : missing)
    ctx_.log->print("note: rank " + std::to_string(r) + " sent no final statistics; its rows are missing");
  return m;
}

void RankSession::wait_for_others() {
  auto& group = dp_.group();
  if (group.env().agent_store) return;  // torchrun's agent holds the store
  constexpr auto kWait = std::chrono::seconds(30);
  const bool hosts = group.env().hosts_store;
  if (dp_.writer() && !hosts) group.set("final_reads_done", "1");
  if (!hosts) return;
  group.wait_for_exits(kWait);
  if (!dp_.writer()) {
    try {
      group.get("final_reads_done", kWait);
    } catch (const std::exception&) {  // rank 0 is gone: nobody reads any more
    }
  }
}

}  // namespace pipeline::stages
