// Small helpers shared by the test executables (no doctest, no torch here).
#pragma once

#include <sys/wait.h>

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

/// A shell command's exit status (-1: it did not exit normally) and its stdout and stderr together.
struct ShellResult {
  int code = -1;
  std::string out;
};

inline ShellResult shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("popen failed for: " + cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace test_util
