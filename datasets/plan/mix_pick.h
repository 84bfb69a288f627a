// A weighted mix's draws: which source a draw takes its document from, by a hash of (seed, draw),
// so a mix is reproducible and resumes from a count of draws without stored random state. The
// document-order mix (sources/document_mix.h) and the lanes' mix (lanes/data_order.h) draw alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipeline::datasets {

/// The source that draw `draw` picks: `cumulative` holds the normalised cumulative weights (the
/// last is 1).
size_t mix_pick(const std::vector<double>& cumulative, uint64_t seed, uint64_t draw);

/// The normalised cumulative weights of a mix. Throws DatasetError naming names[i] when weight i
/// is not a positive finite number, or when there are no weights.
std::vector<double> mix_cumulative(const std::vector<double>& weights, const std::vector<std::string>& names);

}  // namespace pipeline::datasets
