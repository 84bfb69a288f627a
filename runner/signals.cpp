// See signals.h.
#include "runner/signals.h"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>

namespace pipeline::stages {

namespace {

// A POSIX handler receives only the signal's number: it reaches the owner's counters through this
// one pointer, the only process-wide state of the run's signal handling. It is set by the single
// live RunSignals (a second one is refused) and cleared by its destructor, after the handlers it
// installed are gone.
std::atomic<RunSignals::Counters*> g_owner{nullptr};
static_assert(std::atomic<RunSignals::Counters*>::is_always_lock_free);

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR2, SIGXCPU, SIGUSR1, SIGPIPE};
static_assert(std::size(kSignals) == RunSignals::kHandled);

extern "C" void pipeline_on_signal(int sig) {
  RunSignals::Counters* c = g_owner.load();
  if (!c) return;
  if (sig == SIGUSR1) {
    c->checkpoints.fetch_add(1);
    return;
  }
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  const int64_t now = static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  int none = 0;
  if (c->first_stop_signal.compare_exchange_strong(none, sig)) {
    c->first_stop_ns.store(now);
    c->stops.fetch_add(1);
    return;
  }
  // A later one aborts, unless it is the same request come again: within kSameRequestNs of the
  // first (a scheduler signals every process of a job, and torchrun passes the signal on to its
  // ranks: each rank gets two at once; a first not yet stamped is being recorded this instant),
  // or a repeat of SIGXCPU, which the kernel sends every second past the soft CPU limit.
  const int64_t first = c->first_stop_ns.load();
  if (sig == SIGXCPU || first == 0 || now - first < RunSignals::kSameRequestNs) return;
  c->stops.fetch_add(1);
}

// How often the watcher looks at the counters: a stop or a checkpoint request waits at most this
// long on top of the step it waits for anyway.
constexpr auto kWatchPeriod = std::chrono::milliseconds(20);

}  // namespace

RunSignals::RunSignals() {
  Counters* none = nullptr;
  if (!g_owner.compare_exchange_strong(none, &counters_))
    throw std::logic_error("RunSignals: another instance already owns the process's signals");
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    const int sig = kSignals[i];
    struct sigaction sa {};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = sig == SIGPIPE ? SIG_IGN : pipeline_on_signal;
    sa.sa_flags = SA_RESTART;  // a write or read interrupted by a signal resumes
    if (sig == SIGHUP) {
      // nohup: the user asked that a hang-up not end the run.
      struct sigaction current {};
      if (sigaction(SIGHUP, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    }
    installed_[i] = sigaction(sig, &sa, &previous_[i]) == 0;
  }
  watcher_ = std::thread([this] { watch(); });
}

RunSignals::~RunSignals() {
  done_.store(true);
  if (watcher_.joinable()) watcher_.join();
  for (size_t i = 0; i < std::size(kSignals); ++i)
    if (installed_[i]) sigaction(kSignals[i], &previous_[i], nullptr);
  g_owner.store(nullptr);
}

void RunSignals::bind(Actions actions) {
  std::lock_guard<std::mutex> lock(mu_);
  bound_ = bound_ || actions.stop || actions.abort;
  actions_ = std::move(actions);
}

int RunSignals::stop_signal() const { return counters_.first_stop_signal.load(); }

std::string RunSignals::name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGUSR2: return "SIGUSR2";
    case SIGXCPU: return "SIGXCPU";
    case SIGUSR1: return "SIGUSR1";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal " + std::to_string(signal);
  }
}

void RunSignals::watch() {
  while (!done_.load()) {
    std::this_thread::sleep_for(kWatchPeriod);
    act();
  }
  act();  // what arrived during the last period
}

void RunSignals::act() {
  std::lock_guard<std::mutex> lock(mu_);
  const int stops = counters_.stops.load();
  if (stops > stops_handled_ && !bound_) {
    // Nothing runs yet (the run is being planned, or waits for the other ranks): no checkpoint is
    // at stake, so the signal ends the process as it would have without us.
    const int sig = counters_.first_stop_signal.load();
    struct sigaction dfl {};
    sigemptyset(&dfl.sa_mask);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, nullptr);
    kill(getpid(), sig);
  }
  if (stops > stops_handled_ && (actions_.stop || actions_.abort)) {
    const int sig = counters_.first_stop_signal.load();
    if (stops_handled_ == 0 && actions_.stop) actions_.stop(sig);
    if (stops > 1 && actions_.abort) actions_.abort(sig);
    stops_handled_ = stops;
  }
  const int checkpoints = counters_.checkpoints.load();
  if (checkpoints > checkpoints_handled_ && actions_.checkpoint) {
    for (; checkpoints_handled_ < checkpoints; ++checkpoints_handled_) actions_.checkpoint();
  }
}

}  // namespace pipeline::stages
