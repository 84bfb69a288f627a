// A share of time (0 to 1) as the reports print it: a whole percentage, "42%"; and a stage's busy
// share with its device wait beside it, "busy 12% + device wait 85%".
#pragma once

#include <cstdio>
#include <string>

namespace pipeline::graph {

inline std::string pct(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * share);
  return buf;
}

/// A device wait this small prints as nothing: it rounds to 0%, and a CPU run has none.
inline bool shows_device_wait(double device_wait) { return device_wait >= 0.005; }

/// "busy 12%", or "busy 12% + device wait 85%" for a stage that sleeps on the device.
inline std::string busy_text(double busy, double device_wait) {
  std::string out = "busy " + pct(busy);
  if (shows_device_wait(device_wait)) out += " + device wait " + pct(device_wait);
  return out;
}

}  // namespace pipeline::graph
