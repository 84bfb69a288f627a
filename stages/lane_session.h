// The lanes order's session of one rank ([data] order = "lanes", docs/data_order.md), torch-free:
// what the run layer decides before the engine starts (runner/lane_setup.h) and what the read
// stage and pack share while it runs (stages/lane_reading.h, pack). `pipeline check` makes one
// too, for the K and the lanes its dry run opens the data with.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "datasets/lanes/lane_demand.h"
#include "datasets/plan/lane_cursor.h"
#include "datasets/units/catalog.h"

namespace pipeline::stages {

/// The lanes order of a run ([data] order = "lanes", docs/data_order.md): what the run layer
/// decided (K, the step's rows, this rank's lanes and where they start) and what the read stage
/// and pack share: the demand board (which lane to read next), and, on a fresh run, the start
/// cursors, which the read stage makes once it has opened the data (it knows its sources).
struct LaneSession {
  uint32_t lanes = 0;       // K
  uint64_t step_rows = 0;   // N = B x grad_accum x W, the rows of one optimizer step
  uint32_t rank = 0, world = 1;
  std::vector<uint32_t> mine;  // this rank's lanes: lanes_of(rank, world, K)
  /// Where `mine` start, in that order: a checkpoint's, or (a fresh run) empty until the read stage
  /// fills it at its construction, before the graph runs.
  std::vector<datasets::LaneCursor> start;
  datasets::UnitContent content = datasets::UnitContent::documents;  // set with `start` by the read stage
  std::shared_ptr<datasets::LaneDemand> demand;  // indexed like `mine`
};

}  // namespace pipeline::stages
