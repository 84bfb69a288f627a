// The lanes of a document source that one rank serves (docs/data_order.md): each lane reads its
// own units by random access, one unit open at a time, so a rank's memory is bounded by its lanes
// times one unit whatever the drift between lanes. Text shards and Parquet, alone or mixed.
//
// Each document comes with its place (lane_cursor.h), from which a consumer (LaneRows) says
// where the lane goes on after any of its tokens. The first document of a lane resumed in the
// middle of a document carries, in place.token, the tokens of it delivered before, to drop.
//
// Single-threaded: a read stage calls next() for the lane it chooses (the neediest one), from one
// thread at a time.
//
// Example:
//   DocumentLanes lanes(order, start_cursors(order, lanes_of(rank, world, order.lanes)));
//   std::string_view doc;
//   LanePlace place;
//   while (lanes.next(i, doc, place)) send(lanes.lane(i), doc, place);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "datasets/lanes/data_order.h"
#include "datasets/plan/lane_cursor.h"

namespace pipeline::datasets {

class DocumentLanes {
 public:
  /// One lane per cursor (cursor.lane its lane, each lane once). Throws DatasetError for an order
  /// of tokens, a cursor of another number of sources, a lane >= K, or a cursor past its unit.
  DocumentLanes(const DataOrder& order, const std::vector<LaneCursor>& starts);
  ~DocumentLanes();
  DocumentLanes(DocumentLanes&&) noexcept;
  DocumentLanes& operator=(DocumentLanes&&) noexcept;

  size_t size() const;
  /// The lane the i-th (0 <= i < size()) of these lanes is.
  uint32_t lane(size_t i) const;
  /// The i-th lane's next document (a view valid until the next call for any lane) and its
  /// place; false once the lane has ended (only without `loop`). Throws DatasetError naming the
  /// unit's file for data that is bad.
  bool next(size_t i, std::string_view& document, LanePlace& place);
  /// Bytes held by the lanes' open units and the readers they share.
  size_t memory() const;
  /// The most any one lane's open unit held at once.
  size_t unit_memory_high_water() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeline::datasets
