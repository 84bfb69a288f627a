// See cpu_advice.h.
#include "model/device/cpu_advice.h"

#include "base/duration.h"

#include <cmath>
#include <cstdio>

namespace pipeline::model {

namespace {

constexpr const char* kQuickStart =
    "on a CPU, pipelines/quickstart.toml trains a small model in minutes (pipeline run quickstart.toml)";

}  // namespace

bool large_for_cpu(const GPTConfig& m) { return m.num_parameters() > kCpuParameterWarning; }

std::string cpu_warning(const GPTConfig& m) {
  char params[32];
  std::snprintf(params, sizeof params, "%.1fM", static_cast<double>(m.num_parameters()) / 1e6);
  return std::string("warning: this run trains a model of ") + params +
         " parameters on the CPU, where a step takes many seconds (no CUDA device is in use); an estimate of the "
         "run's length follows its first steps. " +
         kQuickStart;
}

std::string cpu_estimate(double seconds_per_step, int64_t step, int64_t total) {
  const double whole = seconds_per_step * static_cast<double>(total);
  const double left = seconds_per_step * static_cast<double>(total - step);
  char pace[32];
  std::snprintf(pace, sizeof pace, "%.1f s", seconds_per_step);
  return "estimate: " + std::to_string(total) + " steps at " + pace + " a step on the CPU take about " +
         duration_text(whole) + " (" + duration_text(left) + " left); " + kQuickStart;
}

}  // namespace pipeline::model
