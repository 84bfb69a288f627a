// The data plan: which units a lane reads, in which order, whatever the world size.
//
// A source is cut into M units (datasets/units/catalog.h: shard blocks, llm.c token ranges,
// Parquet row groups). A run reads them through a fixed number K of lanes. Each epoch has an
// order of the M units: a permutation drawn from (seed, epoch) (shuffle, the default) or the
// catalogue's own order; lane l takes the units at positions l, l+K, l+2K, ... of it. What a
// lane reads depends on the seed, the data and K alone, never on the number of ranks: rank r of
// W serves lanes r, r+W, r+2W, ... (lanes_of), and the rows of a step are the same whatever W
// (RowLayout says which row of which lane a rank's q-th row of a step is).
//
// The permutation is computed unit by unit, not stored: a keyed Feistel network over the
// smallest power of four at least M, walked until it lands below M (at most a few steps on
// average), so a lane in epoch 3 and another still in epoch 2 cost nothing extra, and a plan of
// millions of units holds no table.
//
// Example:
//   DataPlan plan(catalog.units.size(), {.lanes = 8, .seed = 1337}, "data/fineweb");
//   PlannedUnit u = *plan.lane_unit(/*lane=*/3, /*n=*/0);  // lane 3's first unit
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pipeline::datasets {

struct DataPlanOptions {
  uint32_t lanes = 1;    // K, fixed for a run and kept by its checkpoints
  uint64_t seed = 0;     // the epochs' orders (a mix gives each source a seed of its own)
  bool shuffle = true;   // false: every epoch in the catalogue's order
  bool loop = true;      // false: every lane ends after epoch 0
};

/// A lane's n-th unit: the epoch it belongs to and the unit's index in the catalogue.
struct PlannedUnit {
  uint64_t epoch = 0;
  uint64_t unit = 0;
  bool operator==(const PlannedUnit&) const = default;
};

class DataPlan {
 public:
  DataPlan() = default;
  /// `source` names the source in errors. Throws DatasetError when there are fewer units than
  /// lanes (naming the source, M and K, and what to change), or no lanes.
  DataPlan(uint64_t units, DataPlanOptions options, const std::string& source);

  uint64_t units() const { return units_; }
  uint32_t lanes() const { return options_.lanes; }
  const DataPlanOptions& options() const { return options_; }

  /// The unit at `position` (< units()) of epoch `epoch`'s order.
  uint64_t unit_at(uint64_t epoch, uint64_t position) const;
  /// Units lane `lane` reads in one epoch: ceil((M - lane) / K).
  uint64_t lane_units_per_epoch(uint32_t lane) const;
  /// Lane `lane`'s n-th unit (counting from 0 across epochs); nullopt past the end of epoch 0
  /// without `loop`. Throws DatasetError for a lane >= K.
  std::optional<PlannedUnit> lane_unit(uint32_t lane, uint64_t n) const;

 private:
  uint64_t units_ = 0;
  DataPlanOptions options_;
  uint32_t half_bits_ = 0;  // the Feistel network's halves
};

/// The lanes rank `rank` of `world` serves: rank, rank + world, ... below `lanes`. Throws
/// DatasetError naming both numbers when world does not divide lanes, or rank >= world.
std::vector<uint32_t> lanes_of(uint32_t rank, uint32_t world, uint32_t lanes);

/// Which lane rows make a step. A step takes `rows` rows (N = B x grad_accum x world), N/K from
/// every lane; rank r's q-th row of step s is lane r + W*(q mod (K/W)), that lane's row
/// s*(N/K) + q div (K/W). So a rank takes its lanes' rows round-robin, and the step's set of
/// rows is the same for every W that divides K.
class RowLayout {
 public:
  /// Throws DatasetError unless K divides rows and world divides K.
  RowLayout(uint32_t lanes, uint32_t world, uint64_t rows);
  uint64_t rows_per_rank() const { return rows_ / world_; }
  uint64_t rows_per_lane() const { return rows_ / lanes_; }
  /// (lane, the lane's row number) of rank `rank`'s row `q` (< rows_per_rank()) of step `step`.
  std::pair<uint32_t, uint64_t> rank_row(uint32_t rank, uint64_t step, uint64_t q) const;

 private:
  uint32_t lanes_, world_;
  uint64_t rows_;
};

}  // namespace pipeline::datasets
