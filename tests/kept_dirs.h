// The scratch directories a test executable made (test_util::fresh_dir, train_harness::temp_dir):
// removed when every test of the executable passed, kept and listed when one failed, so that its
// run directories can be looked at. The e2e tests' directories hold checkpoints and run logs,
// over 1.5 GB per run of the suite; kept every time, they filled /tmp.
#pragma once

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <vector>

namespace kept_dirs {

struct Registry {
  std::mutex mu;
  std::vector<std::filesystem::path> dirs;
};

// One per test executable: the function is inline, so every unit shares its static.
inline Registry& registry() {
  static Registry r;
  return r;
}

/// Notes a directory the executable made (called by the helpers that make them).
inline void note(const std::filesystem::path& dir) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.dirs.push_back(dir);
}

/// At the end of the run (doctest_main.cpp): removes them all when `passed`, else names them.
inline void settle(bool passed) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (const auto& d : r.dirs) {
    std::error_code ec;
    if (!std::filesystem::exists(d, ec)) continue;
    if (passed)
      std::filesystem::remove_all(d, ec);
    else
      std::fprintf(stderr, "kept for a look: %s\n", d.c_str());
  }
  r.dirs.clear();
}

}  // namespace kept_dirs
