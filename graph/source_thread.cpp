// See source_thread.h.
#include "graph/source_thread.h"

#include <optional>
#include <utility>

#include "graph/invocation.h"

namespace pipeline::graph {

SourceThread::~SourceThread() { join(true); }

void SourceThread::start(Gateway& gateway) {
  gateway_ = &gateway;
  gateway_->reserve_wait();
  thread_ = std::thread([this] { main(); });
}

void SourceThread::request() {
  {
    std::lock_guard lock(mu_);
    if (!sent_end_) {
      ++requests_;
      cv_.notify_one();
      return;
    }
  }
  give_back_admission();
}

void SourceThread::give_back_admission() {
  // A source's admission takes only its worker slot (edge.cpp): the input_node is asked again,
  // and stops.
  st_.worker_slots.release();
}

void SourceThread::cancel() {
  {
    std::lock_guard lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_one();
}

void SourceThread::join(bool cancel_first) {
  if (!thread_.joinable()) return;
  if (cancel_first) cancel();
  thread_.join();
}

void SourceThread::main() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return cancelled_ || (requests_ > 0 && !ready_.empty()) || (ready_.size() < depth_ && !read_end_); });
    if (cancelled_) break;
    if (requests_ > 0 && !ready_.empty()) {
      Packet p = std::move(ready_.front());
      ready_.pop_front();
      --requests_;
      const bool last = p.kind == Packet::Kind::eos;
      int64_t stale = 0;
      if (last) {
        sent_end_ = true;
        ended_.store(true, std::memory_order_release);
        stale = std::exchange(requests_, 0);
      }
      lock.unlock();
      gateway_->try_put(p);
      for (; stale > 0; --stale) give_back_admission();
      lock.lock();
      if (last) break;
      continue;
    }
    // Read ahead: the blocking work, without the lock.
    lock.unlock();
    std::optional<Packet> p;
    try {
      rt_.fault_point(EngineSite::source, st_);
      p = next_source_packet(rt_, st_);
    } catch (...) {
      rt_.fault(EngineSite::source, st_, std::current_exception());  // cancels: we leave below
    }
    lock.lock();
    if (!p) {  // a fault: cancelled_ is set (or on its way)
      read_end_ = true;
      continue;
    }
    if (p->kind == Packet::Kind::eos) read_end_ = true;
    ready_.push_back(std::move(*p));
  }
  lock.unlock();
  gateway_->release_wait();
}

}  // namespace pipeline::graph
