// Rows out of lanes, without torch: the logic of the pack stage (docs/data_order.md).
//
// Per lane, tokens go in (documents' tokens, or runs of a unit's tokens, each with its place) and
// rows of T+1 tokens come out: row j is the lane's tokens [jT, jT+T], so consecutive rows share
// one token, as the x/y windows of nanoGPT do. A lane's cursor after the rows taken is the place
// of token (rows taken) x T, the first token of the next row: a lane resumed from it yields that
// token first. LaneRows holds per lane only the tokens not yet passed by its rows (what a reader
// feeds the neediest lane by: buffered()), and the places of the pieces they came from.
//
// A step takes N/K rows of each lane; rank r's q-th row of step s is given by RowLayout
// (datasets/plan/data_plan.h). Single-threaded (pack's).
//
// Example:
//   LaneRows rows(T, order.content, cursors);     // this rank's lanes, fresh or resumed
//   rows.push(rows.index_of(chunk.lane), chunk.tokens, chunk.place);
//   if (rows.rows_ready(i) > 0) rows.take_row(i, row);   // row: T+1 tokens
//   LaneCursor c = rows.cursor(i);                 // for a checkpoint
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "datasets/plan/lane_cursor.h"
#include "datasets/units/catalog.h"

namespace pipeline::datasets {

class LaneRows {
 public:
  /// One lane per start cursor (each lane once), fresh or resumed; `seq_len` is T (>= 1).
  LaneRows(uint32_t seq_len, UnitContent content, const std::vector<LaneCursor>& starts);
  ~LaneRows();
  LaneRows(LaneRows&&) noexcept;
  LaneRows& operator=(LaneRows&&) noexcept;

  size_t size() const;
  uint32_t lane(size_t i) const;
  /// The index of lane `lane` among these; throws DatasetError for a lane not served here.
  size_t index_of(uint32_t lane) const;

  /// Appends to the i-th lane. Documents: one whole document's tokens, of which the first
  /// place.token (delivered before a resume) are dropped here. Tokens: a run of one unit's
  /// tokens, the first at offset place.item of the unit. Pieces arrive in the lane's order;
  /// throws DatasetError for one that does not follow the last (a bug upstream, never data).
  void push(size_t i, std::span<const uint16_t> tokens, const LanePlace& place);

  uint32_t seq_len() const;
  /// Tokens the i-th lane holds that its rows have not passed (its next row starts at the first).
  uint64_t buffered(size_t i) const;
  /// Rows the i-th lane can give now: (buffered - 1) / T.
  uint64_t rows_ready(size_t i) const;
  /// Rows taken from the i-th lane since the start (its next row's number, counted from the
  /// start cursor).
  uint64_t rows_taken(size_t i) const;
  /// Copies the i-th lane's next row (T+1 tokens) into `row`. Throws DatasetError when the lane
  /// has no row ready or `row` is not T+1 long.
  void take_row(size_t i, std::span<uint16_t> row);

  /// Where the i-th lane goes on after the rows taken.
  LaneCursor cursor(size_t i) const;
  /// The most tokens any lane held at once, and the bytes held now (buffers and places).
  uint64_t buffered_high_water() const;
  size_t memory() const;

 private:
  struct Lane;
  uint32_t T_;
  UnitContent content_;
  std::vector<Lane> lanes_;
  std::vector<int32_t> index_;  // lane -> its index here, -1 when not served
  uint64_t high_water_ = 0;
};

}  // namespace pipeline::datasets
