// Small helpers shared by the test executables (no doctest, no torch here).
#pragma once

#include <exception>
#include <functional>
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

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace test_util
