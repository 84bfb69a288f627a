// Honesty about the device: a model this large trains on a CPU at many seconds a step (GPT-2
// 124M: about 16 s on 2 cores), so a run that resolves to the CPU with one says so at start-up,
// and after its first steps says how long the whole run will take. It still runs: a CPU run of a
// large model is legitimate (a smoke test, a machine without a GPU), only rarely intended.
#pragma once

#include <cstdint>
#include <string>

#include "model/net/gpt_config.h"

namespace pipeline::model {

/// Models above this many parameters get the warning and the estimate on a CPU.
inline constexpr int64_t kCpuParameterWarning = 50'000'000;

/// True for a model above kCpuParameterWarning.
bool large_for_cpu(const GPTConfig& m);

/// The start-up warning for a large model on the CPU (one line).
std::string cpu_warning(const GPTConfig& m);

/// Timed steps after which the estimate is printed.
inline constexpr int64_t kEstimateAfterSteps = 2;

/// The estimate, from the pace of the steps so far: `seconds_per_step` measured after the first
/// step (which includes start-up), `step` steps done of `total`.
std::string cpu_estimate(double seconds_per_step, int64_t step, int64_t total);

}  // namespace pipeline::model
