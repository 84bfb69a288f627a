// Writing a file so that readers only ever see the old complete file or the new complete one:
// the bytes go to PATH.tmp, which is flushed, fsynced and renamed over PATH, and the directory is
// fsynced so the rename survives a crash. Every step is checked; a failure removes PATH.tmp,
// leaves PATH as it was, and throws FileWriteError naming the file, the step and the OS error.
// No torch here: datasets/, model/, stages/ and tools/ all write through it.
//
// Example:
//   write_file_atomic(run_dir / "config.toml", text);
//   AtomicFile f(path);  f.write(header, 64);  ...;  f.write_at(0, header, 64);  f.commit();
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline {

/// A failed write. `what()` reads "PATH: STEP PATH.tmp failed: OS ERROR (nothing was replaced...)".
struct FileWriteError : std::runtime_error {
  /// `replaced`: the rename had already happened (only the directory fsync failed).
  FileWriteError(const std::filesystem::path& path, const std::string& step, int error, bool replaced = false);
  std::filesystem::path path;  // the file that was being written (its final name)
  int error;                   // errno
};

/// A file being written to PATH.tmp until commit() renames it to PATH. Destroyed without a
/// successful commit(), it removes PATH.tmp. Writes are buffered; not thread-safe.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);
  void write(std::string_view s) { write(s.data(), s.size()); }
  /// Overwrites bytes already written (a header patched once the sizes are known).
  void write_at(uint64_t offset, const void* data, size_t size);
  /// Bytes written so far.
  uint64_t size() const { return size_; }
  /// Flush, fsync, close, rename over the final path, fsync the directory.
  void commit();

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return tmp_; }

 private:
  void flush();
  [[noreturn]] void fail(const char* step, int error);

  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<char> buf_;
  uint64_t size_ = 0;
};

/// Writes `contents` to `path` atomically (see AtomicFile).
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

/// The temporary name AtomicFile uses for `path` (PATH.tmp).
std::filesystem::path atomic_temp_path(const std::filesystem::path& path);

}  // namespace pipeline
