// See timer.h.
#include "graph/timer.h"

namespace pipeline::graph {

Timer::~Timer() { stop(); }

void Timer::start() { thread_ = std::thread([this] { main(); }); }

void Timer::hold(std::unique_ptr<Invocation> inv) {
  inv->gateway()->reserve_wait();
  {
    std::lock_guard lock(mu_);
    int64_t until = inv->hold_until();
    held_.emplace(until, std::move(inv));
  }
  cv_.notify_one();
}

void Timer::expire_all() {
  {
    std::lock_guard lock(mu_);
    expire_ = true;
  }
  cv_.notify_one();
}

void Timer::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Timer::main() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (held_.empty()) {
      if (stopping_) return;
      cv_.wait(lock);
      continue;
    }
    auto first = held_.begin();
    int64_t now = now_ns();
    if (!expire_ && !stopping_ && first->first > now) {
      cv_.wait_for(lock, std::chrono::nanoseconds(first->first - now));
      continue;
    }
    std::unique_ptr<Invocation> inv = std::move(first->second);
    held_.erase(first);
    lock.unlock();
    Gateway* gateway = inv->gateway();
    Runtime& rt = inv->runtime();
    const StageRt& st = inv->stage();
    try {
      rt.fault_point(EngineSite::timer, st);
      inv->complete();
    } catch (...) {
      rt.fault(EngineSite::timer, st, std::current_exception());  // takes mu_ (expire_all): not held here
    }
    inv.reset();
    gateway->release_wait();
    lock.lock();
  }
}

}  // namespace pipeline::graph
