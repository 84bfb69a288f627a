// A thread whose work runs at idle priority (base/idle_thread.h), label unit: the work runs there
// under SCHED_IDLE (or nice +19) and so do the threads it creates, while the caller, and every
// thread the caller creates, keeps its own policy; the work's exceptions come back to the caller.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include <doctest/doctest.h>

#include "base/idle_thread.h"
#include "test_util.h"

using pipeline::IdleThread;

namespace {

pid_t this_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Whether the calling thread runs lowered, as IdleThread lowers: SCHED_IDLE, or nice +19.
bool lowered_here() {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(this_tid()));
  return sched_getscheduler(0) == SCHED_IDLE || (errno == 0 && nice == 19);
}

// Whether a thread started from the calling thread runs lowered.
bool lowered_in_new_thread() {
  bool lowered = false;
  std::thread([&] { lowered = lowered_here(); }).join();
  return lowered;
}

}  // namespace

TEST_CASE("the work runs on a thread of its own at idle priority; the caller and its new threads keep theirs") {
  REQUIRE(!lowered_here());
  IdleThread idle("test idle");
  CHECK(idle.lowered() == "SCHED_IDLE");  // allowed to any user on Linux
  pid_t worker = 0;
  bool lowered = false, child_lowered = false;
  std::string name;
  idle.run([&] {
    worker = this_tid();
    lowered = lowered_here();
    child_lowered = lowered_in_new_thread();  // OpenMP's team, say: inherits the policy, as it should
    name = test_util::read_file("/proc/self/task/" + std::to_string(worker) + "/comm");
  });
  CHECK(worker != this_tid());
  CHECK(lowered);
  CHECK(child_lowered);
  CHECK(name == "test idle\n");
  // The caller is untouched, and so is whatever it creates from now on (a pool's workers).
  CHECK(!lowered_here());
  CHECK(!lowered_in_new_thread());
  CHECK(sched_getscheduler(worker) == SCHED_IDLE);  // the thread stays lowered between works
}

TEST_CASE("works run one at a time, each finished when run returns; an exception comes back, and the thread goes on") {
  IdleThread idle("test idle");
  std::atomic<int> done{0};
  for (int i = 0; i < 50; ++i) {
    idle.run([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      done.fetch_add(1);
    });
    CHECK(done.load() == i + 1);
  }
  CHECK(test_util::error_of([&] { idle.run([] { throw std::runtime_error("validation split gone"); }); }) ==
        "validation split gone");
  int after = 0;
  idle.run([&] { after = 1; });
  CHECK(after == 1);
}

TEST_CASE("an idle thread that never worked stops at once") {
  for (int i = 0; i < 20; ++i) IdleThread idle("test idle");
}
