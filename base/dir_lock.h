// One process at a time in a directory: an exclusive flock(2) on DIR/.lock, held while the
// DirLock lives. The kernel releases it when the process ends, however it ends (a SIGKILL leaves
// no stale lock), and locks taken by two programs on one machine, or through NFS, exclude each
// other. The file holds the holder's pid and host, for the error the next one gets.
//
// Example:
//   DirLock lock(run_dir, "run directory");  // throws when another process holds run_dir
#pragma once

#include <filesystem>
#include <string>

namespace pipeline {

class DirLock {
 public:
  /// Locks `dir` (which exists) for this process. Throws std::runtime_error naming `dir`, as
  /// `what` ("run directory"), and the holder when another process holds it. Where no lock can
  /// be taken at all (a read-only directory, a filesystem without locks) it holds none: the
  /// writes that follow report their own errors.
  DirLock(const std::filesystem::path& dir, const std::string& what);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace pipeline
