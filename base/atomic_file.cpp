// See atomic_file.h. POSIX calls rather than std::filesystem for the writing itself: every step
// must report its own errno, and the torch wheel's libtorch.so exports older std::filesystem
// symbols that can shadow libstdc++'s at run time.
#include "base/atomic_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace pipeline {
namespace {

constexpr size_t kBufferBytes = size_t(1) << 20;

// write() until done: it may write less than asked (signals, pipes, near-full disks).
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

int pwrite_all(int fd, const char* p, size_t n, off_t offset) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return 0;
}

}  // namespace

FileWriteError::FileWriteError(const std::filesystem::path& path_, const std::string& step, int error_, bool replaced)
    : std::runtime_error(path_.string() + ": " + step + " failed: " + std::strerror(error_) +
                         (replaced ? std::string(" (the new file is in place but may not survive a crash)")
                                   : " (nothing was replaced: the previous " + path_.filename().string() +
                                         ", if any, is unchanged)")),
      path(path_),
      error(error_) {}

std::filesystem::path atomic_temp_path(const std::filesystem::path& path) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  return tmp;
}

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)), tmp_(atomic_temp_path(path_)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw FileWriteError(path_, "creating " + tmp_.string(), errno);
  buf_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* step, int error) {
  // Leave nothing half-written behind: the destructor may not run soon (or at all, if the
  // caller keeps the object), so remove the temporary now.
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw FileWriteError(path_, step + (" " + tmp_.string()), error);
}

void AtomicFile::flush() {
  if (buf_.empty()) return;
  if (fd_ < 0) fail("writing", EBADF);
  if (int e = write_all(fd_, buf_.data(), buf_.size())) fail("writing", e);
  buf_.clear();
}

void AtomicFile::write(const void* data, size_t size) {
  auto p = static_cast<const char*>(data);
  if (buf_.size() + size > kBufferBytes) {
    flush();
    if (size >= kBufferBytes) {  // large blocks go straight to the file
      if (fd_ < 0) fail("writing", EBADF);
      if (int e = write_all(fd_, p, size)) fail("writing", e);
      size_ += size;
      return;
    }
  }
  buf_.insert(buf_.end(), p, p + size);
  size_ += size;
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t size) {
  if (offset + size > size_) fail("patching (past the end of what was written)", EINVAL);
  flush();
  if (int e = pwrite_all(fd_, static_cast<const char*>(data), size, static_cast<off_t>(offset))) fail("writing", e);
}

void AtomicFile::commit() {
  if (committed_) return;
  flush();
  if (fd_ < 0) fail("writing", EBADF);
  if (::fsync(fd_) != 0) fail("fsync of", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("closing", errno);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming", errno);
  committed_ = true;
  // Make the rename durable. Some filesystems cannot sync a directory (EINVAL): nothing to do there.
  std::filesystem::path dir = path_.parent_path();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw FileWriteError(path_, "opening its directory to fsync the rename", errno, true);
  int rc = ::fsync(dfd);
  int e = errno;
  ::close(dfd);
  if (rc != 0 && e != EINVAL && e != ENOTSUP)
    throw FileWriteError(path_, "fsync of directory " + dir.string() + " after the rename", e, true);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

}  // namespace pipeline
