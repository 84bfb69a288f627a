// Names the calling thread as `top -H`, `ps -L`, perf, gdb and /proc/PID/task/TID/comm show it,
// so that a thread's CPU time can be told apart from the rest of the process
// (tools/bench_live.sh reads the live server's that way).
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace pipeline {

/// Linux keeps 15 characters of a thread's name; a longer one is cut there.
inline void name_this_thread(std::string_view name) {
  const std::string kept(name.substr(0, 15));
  pthread_setname_np(pthread_self(), kept.c_str());
}

}  // namespace pipeline
