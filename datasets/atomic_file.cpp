// Atomic file replacement (see atomic_file.h).
#include "datasets/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "datasets/shard.h"

namespace pipeline::datasets {

namespace {

[[noreturn]] void fail(const std::filesystem::path& tmp, const std::filesystem::path& path, const char* what, int err) {
  ::unlink(tmp.c_str());
  throw DatasetError(path.string() + ": " + what + " " + tmp.string() + ": " + std::strerror(err) +
                     " (the previous file, if any, is unchanged)");
}

}  // namespace

void commit_atomic(int fd, const std::filesystem::path& tmp, const std::filesystem::path& path) {
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail(tmp, path, "fsync failed on", err);
  }
  if (::close(fd) != 0) fail(tmp, path, "close failed on", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(tmp, path, "cannot rename", errno);
  const auto dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  if (int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    (void)::fsync(d);  // the rename survives a crash
    ::close(d);
  }
}

void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw DatasetError(path.string() + ": cannot create " + tmp.string() + ": " + std::strerror(errno));
  for (size_t done = 0; done < text.size();) {
    const ssize_t k = ::write(fd, text.data() + done, text.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const int err = k < 0 ? errno : EIO;
      ::close(fd);
      fail(tmp, path, "cannot write", err);
    }
    done += static_cast<size_t>(k);
  }
  commit_atomic(fd, tmp, path);
}

}  // namespace pipeline::datasets
