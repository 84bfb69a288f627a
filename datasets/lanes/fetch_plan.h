// What a rank's lanes will read next, handed to the remote stores that fetch it (issue 37,
// docs/remote.md): each remote source's store gets, for every lane this rank serves, the units
// the plan deals that lane from its cursor on, in order; and a unit its lane is done with is let
// go from the cache. Only this rank's lanes are planned, so a rank fetches only its own units, and
// a resumed lane starts at the unit its cursor is in: at most that unit is fetched again.
//
// Example:
//   DataOrder order = open_data_order(specs, {.lanes = 8, .store = store_options});
//   auto cursors = start_cursors(order, lanes_of(rank, world, order.lanes));
//   fetch_ahead(order, cursors);           // before the lanes start reading
//   DocumentLanes lanes(order, cursors);
#pragma once

#include <vector>

#include "datasets/lanes/data_order.h"
#include "datasets/plan/lane_cursor.h"

namespace pipeline::datasets {

/// Sets every remote source of `order` fetching ahead of the lanes of `cursors`, and chains a
/// release of each unit to `order.unit_done` (keeping whatever it did before). Local sources
/// are left alone. Call it before the lanes read; the order must outlive its stores' fetching
/// (the stores are the order's).
void fetch_ahead(DataOrder& order, const std::vector<LaneCursor>& cursors);

}  // namespace pipeline::datasets
