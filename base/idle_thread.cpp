// See idle_thread.h.
#include "base/idle_thread.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

#include "base/thread_name.h"

namespace pipeline {

IdleThread::IdleThread(std::string name) {
  std::unique_lock<std::mutex> lock(mu_);
  bool started = false;
  thread_ = std::thread([this, name = std::move(name), &started] {
    name_this_thread(name);
    const sched_param idle{};
    std::string lowered;
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) == 0)
      lowered = "SCHED_IDLE";
    else if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19) == 0)  // this thread only
      lowered = "nice 19";
    {
      std::lock_guard<std::mutex> guard(mu_);
      lowered_ = std::move(lowered);
      started = true;
    }
    cv_.notify_all();
    main();
  });
  cv_.wait(lock, [&] { return started; });
}

IdleThread::~IdleThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void IdleThread::run(const std::function<void()>& work) {
  std::unique_lock<std::mutex> lock(mu_);
  work_ = &work;
  error_ = nullptr;
  cv_.notify_all();
  cv_.wait(lock, [&] { return work_ == nullptr; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void IdleThread::main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || work_ != nullptr; });
    if (work_ == nullptr) return;  // stopped, nothing in hand
    const auto* work = work_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*work)();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    work_ = nullptr;
    cv_.notify_all();
  }
}

}  // namespace pipeline
