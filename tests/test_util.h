// Small helpers shared by the test executables (no doctest, no torch here).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "kept_dirs.h"

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

/// A lookup of environment variables (dist::EnvLookup) that sees only `vars`.
inline std::function<std::optional<std::string>(const std::string&)> env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
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

/// An empty directory pipeline_<prefix>_<pid>_<tag> under the system temp dir (emptied when it
/// exists), removed at the end of the executable's run if every test passed, else kept so that a
/// failing test's files can be looked at (kept_dirs.h).
inline std::filesystem::path fresh_dir(const std::string& prefix, const std::string& tag) {
  auto d = std::filesystem::temp_directory_path() / ("pipeline_" + prefix + "_" + std::to_string(::getpid()) + "_" + tag);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  kept_dirs::note(d);
  return d;
}

/// A fresh directory under the system temp dir, removed with everything in it on destruction.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = std::filesystem::temp_directory_path() / ("pipeline_" + tag + "_" + std::to_string(::getpid()) + "_" +
                                                     std::to_string(counter++) + "_" + std::to_string(stamp));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

/// Waits for child `pid` to end: its exit code (128 + N when killed by signal N), or -1 when it is
/// still running after `limit` (it is then killed).
inline int wait_exit(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const std::filesystem::path& p, std::string_view data) {
  std::ofstream(p, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
}

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

/// A loopback TCP port that was free a moment ago (bound to port 0, then closed): for a server a
/// test starts, which may in rare cases lose it to another process first.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0)
    throw std::runtime_error("free_port: no loopback port to bind");
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace test_util
