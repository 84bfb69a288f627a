// A share of time (0 to 1) as the reports print it: a whole percentage, "42%".
#pragma once

#include <cstdio>
#include <string>

namespace pipeline::graph {

inline std::string pct(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * share);
  return buf;
}

}  // namespace pipeline::graph
