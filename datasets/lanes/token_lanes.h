// The lanes of a token source that one rank serves (docs/data_order.md): prepared token shards
// or llm.c shards, each lane reading its own units by random access, one open at a time.
//
// Each read returns tokens of one unit, with the place of the first (lane_cursor.h: the lane's
// unit and the token's offset in it), so a consumer (LaneRows) says where the lane goes on after
// any token. Single-threaded, as DocumentLanes.
//
// Example:
//   TokenLanes lanes(order, start_cursors(order, lanes_of(rank, world, order.lanes)));
//   std::vector<uint16_t> buf(4096);
//   LanePlace place;
//   for (size_t n; (n = lanes.read(i, buf, place)) > 0;) send(lanes.lane(i), buf.data(), n, place);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "datasets/lanes/data_order.h"
#include "datasets/plan/lane_cursor.h"

namespace pipeline::datasets {

class TokenLanes {
 public:
  /// One lane per cursor. Throws DatasetError for an order of documents, a cursor with other
  /// than one source, a lane >= K, or a cursor past its unit.
  TokenLanes(const DataOrder& order, const std::vector<LaneCursor>& starts);
  ~TokenLanes();
  TokenLanes(TokenLanes&&) noexcept;
  TokenLanes& operator=(TokenLanes&&) noexcept;

  size_t size() const;
  uint32_t lane(size_t i) const;
  /// Up to out.size() of the i-th lane's next tokens, all from one unit, and the place of the
  /// first; 0 once the lane has ended (only without `loop`).
  size_t read(size_t i, std::span<uint16_t> out, LanePlace& place);
  size_t memory() const;
  size_t unit_memory_high_water() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeline::datasets
