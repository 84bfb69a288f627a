// See dir_lock.h.
#include "base/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace pipeline {

namespace {

// "pid 1234 on host gpu07", from the holder's file ("" when it wrote nothing yet).
std::string holder_of(int fd) {
  char buf[256] = {};
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

DirLock::DirLock(const std::filesystem::path& dir, const std::string& what) {
  const auto file = dir / ".lock";
  const int fd = open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;  // nothing can be written there: the run's own writes say so
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {  // no locks on this filesystem
      close(fd);
      return;
    }
    const std::string holder = holder_of(fd);
    close(fd);
    throw std::runtime_error(what + " " + dir.string() + " is in use by another process" +
                             (holder.empty() ? "" : " (" + holder + ")") +
                             ": wait for it to end, or stop it (Ctrl-C or SIGTERM writes a checkpoint), or choose "
                             "another " + what);
  }
  fd_ = fd;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(getpid()) + " on host " + host + "\n";
  if (ftruncate(fd_, 0) == 0) {
    const ssize_t written = pwrite(fd_, me.data(), me.size(), 0);
    (void)written;  // only the error message of a later process reads it
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the lock
}

}  // namespace pipeline
