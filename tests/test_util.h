// Small helpers shared by the test executables (no doctest, no torch here).
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>

namespace test_util {

/// The message of the exception `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

struct ShellResult {
  int code = -1;    // exit status; -1 when killed by a signal
  std::string out;  // stdout and stderr together
};

/// Runs `command` with /bin/sh, stderr merged into stdout.
inline ShellResult shell(const std::string& command) {
  ShellResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + command);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

/// While alive, every file this process writes is limited to `bytes` (RLIMIT_FSIZE), and SIGXFSZ
/// is ignored so that write() fails with EFBIG ("File too large") instead of killing the process:
/// a disk that fills up, for one process and without privileges.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit r = old_;
    r.rlim_cur = bytes;
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) throw std::runtime_error("setrlimit(RLIMIT_FSIZE) failed");
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
};

}  // namespace test_util
