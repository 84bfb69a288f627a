// A run's data order: its sources (one, or a weighted mix), each with its store, catalogue and
// plan, and the number of lanes K that every plan shares (docs/data_order.md).
//
// A weighted mix: every source has its own catalogue and plan (same K, a seed of its own); lane l
// of the mix draws its j-th document from source i with probability weight_i / sum of weights (a
// hash of the seed, l and j), and takes the next document of source i's lane l. Mixes are of
// document sources (prepared text, Parquet); token sources are read alone.
//
// Example:
//   DataOrder order = open_data_order({{"datasets/data/tinyshakespeare/text"}},
//                                     {.lanes = 8, .seed = 1337});
//   DocumentLanes lanes(order, starts_of(order, lanes_of(rank, world, order.lanes)));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "datasets/io/store.h"
#include "datasets/plan/data_plan.h"
#include "datasets/plan/lane_cursor.h"
#include "datasets/units/catalog.h"

namespace pipeline::datasets {

/// One source of a data order.
struct OrderSource {
  std::shared_ptr<io::Store> store;
  std::shared_ptr<const Catalog> catalog;
  DataPlan plan;
  double weight = 1.0;
};

struct DataOrder {
  std::vector<OrderSource> sources;
  uint32_t lanes = 1;
  uint64_t seed = 0;                // the mix's draws
  UnitContent content = UnitContent::documents;
  std::vector<double> cumulative;   // normalised cumulative weights (the last is 1)
  /// Called by a lane when it is done with a unit (its source, the catalogue's unit index): a
  /// cache may evict what it fetched for it. Called on the reading thread.
  std::function<void(size_t source, uint64_t unit)> unit_done;

  /// The source lane `lane`'s draw `draw` takes its document from (0 for one source).
  size_t pick(uint32_t lane, uint64_t draw) const;
};

/// A source as a config names it.
struct SourceSpec {
  std::string source;  // a path (or, with issue 37's stores, a URL)
  double weight = 1.0;
};

struct DataOrderOptions {
  uint32_t lanes = 1;       // K
  uint64_t seed = 0;        // the run's seed: source i's plan is seeded from it and i
  bool shuffle = true;
  bool loop = true;
  std::string split = "train";
  std::string column = "text";
  VerifyMode verify = VerifyMode::off;
  uint64_t llmc_unit_tokens = 32768;
};

/// Opens every source's store, builds its catalogue (with `lanes` for format-1 shards) and its
/// plan. Throws DatasetError naming the source: no sources, a weight that is not positive, a mix
/// that holds a token source or sources of both kinds, a source with fewer units than lanes.
DataOrder open_data_order(const std::vector<SourceSpec>& sources, const DataOrderOptions& options);
/// The same with every source read through `store` (one the caller made: with its options, or
/// one that counts what it reads).
DataOrder open_data_order(const std::vector<SourceSpec>& sources, const DataOrderOptions& options,
                          std::shared_ptr<io::Store> store);

/// The same from catalogues already built (tests, and a caller that builds them itself): each
/// source's store, catalogue and weight are taken as given, its plan is made here.
DataOrder make_data_order(std::vector<OrderSource> sources, const DataOrderOptions& options);

/// Throws DatasetError naming the cursor unless its lane is one of the order's K, given once, with
/// a place in each source (a resumed run's cursors, before its lanes open).
void check_cursors(const DataOrder& order, const std::vector<LaneCursor>& cursors);

/// Fresh cursors of `lanes` (every source at its lane's first unit).
std::vector<LaneCursor> start_cursors(const DataOrder& order, const std::vector<uint32_t>& lanes);

}  // namespace pipeline::datasets
