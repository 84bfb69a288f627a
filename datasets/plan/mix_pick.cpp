// A weighted mix's draws (mix_pick.h).
#include "datasets/plan/mix_pick.h"

#include <algorithm>
#include <cmath>

#include "datasets/dataset_error.h"
#include "datasets/plan/splitmix.h"

namespace pipeline::datasets {

size_t mix_pick(const std::vector<double>& cumulative, uint64_t seed, uint64_t draw) {
  const double u = static_cast<double>(splitmix64(seed ^ splitmix64(draw)) >> 11) * 0x1.0p-53;  // [0, 1)
  const size_t i = static_cast<size_t>(std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin());
  return std::min(i, cumulative.size() - 1);
}

std::vector<double> mix_cumulative(const std::vector<double>& weights, const std::vector<std::string>& names) {
  if (weights.empty()) throw DatasetError("dataset mix: no sources given");
  double total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0) || !std::isfinite(weights[i]))
      throw DatasetError("dataset mix: " + (i < names.size() ? names[i] : "source " + std::to_string(i)) + ": weight " +
                         std::to_string(weights[i]) + " must be a positive number");
    total += weights[i];
  }
  std::vector<double> cumulative;
  double acc = 0;
  for (double w : weights) cumulative.push_back(acc += w / total);
  cumulative.back() = 1.0;  // rounding must not leave a gap at the top
  return cumulative;
}

}  // namespace pipeline::datasets
