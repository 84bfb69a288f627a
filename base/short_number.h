// A number as a person reads it in a message: printf's %g (six significant digits, no trailing
// zeros, an exponent only where it is shorter), as "0.001", "2.5" or "1e+30".
#pragma once

#include <cstdio>
#include <string>

namespace pipeline {

inline std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

}  // namespace pipeline
