// A length of time as a person reads it in a progress line: "42s", "7m05s", "3h20m", "2d 04h".
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace pipeline {

/// Seconds rounded to the nearest second, in the two largest units; "?" when not finite or negative.
inline std::string duration_text(double s) {
  char buf[48];
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  if (t >= 86400)
    std::snprintf(buf, sizeof buf, "%lldd %02lldh", t / 86400, (t / 3600) % 24);
  else if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

}  // namespace pipeline
