// Helpers shared by the libFuzzer targets: the input as a file (the readers under test take
// paths), and a hard failure for a broken invariant (libFuzzer records the input that caused it).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace fuzz_util {

/// One in-memory file (memfd) per process, rewritten for each input; path() opens it afresh.
class InputFile {
 public:
  InputFile() : fd_(::memfd_create("fuzz_input", 0)) {
    if (fd_ < 0) std::abort();
  }
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

inline std::string_view as_text(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

/// A broken invariant: print why and abort, so libFuzzer keeps the input as a crash.
[[noreturn]] inline void broken(const std::string& why) {
  std::fprintf(stderr, "invariant broken: %s\n", why.c_str());
  std::abort();
}

}  // namespace fuzz_util
