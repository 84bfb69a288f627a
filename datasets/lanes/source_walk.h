// A lane's walk through one source's units (document_lanes.cpp, token_lanes.cpp): the lane's
// n-th unit from the plan, opened when first needed, skipped to the cursor's item once, closed
// (and reported done) at its end. At most one unit open.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "datasets/dataset_error.h"
#include "datasets/lanes/data_order.h"
#include "datasets/units/unit_reader.h"

namespace pipeline::datasets {

template <class UnitT>
class SourceWalk {
 public:
  SourceWalk(const DataOrder& order, size_t source, uint32_t lane, const SourceCursor& start)
      : order_(&order), source_(source), lane_(lane), n_(start.unit), skip_(start.item) {
    const OrderSource& s = order.sources[source];
    if (const auto planned = s.plan.lane_unit(lane, n_)) {
      const Unit& u = s.catalog->units[planned->unit];
      if (u.items != kUnknownCount && skip_ > u.items)
        throw DatasetError(s.catalog->source + ": lane " + std::to_string(lane) + "'s cursor is at item " +
                           std::to_string(skip_) + " of its unit " + std::to_string(n_) + " (" +
                           s.catalog->describe(u) + "), which holds " + std::to_string(u.items) +
                           ": the cursor is not this data's");
    }
  }

  /// The lane's open unit, opening its next one when none is; nullptr once the lane has ended.
  UnitT* current(UnitOpener& opener) {
    if (unit_) return unit_.get();
    const auto planned = order_->sources[source_].plan.lane_unit(lane_, n_);
    if (!planned) return nullptr;
    unit_index_ = planned->unit;
    if constexpr (std::is_same_v<UnitT, DocumentUnit>)
      unit_ = opener.documents(unit_index_);
    else
      unit_ = opener.tokens(unit_index_);
    if (skip_ > 0) unit_->skip(skip_);
    skip_ = 0;
    return unit_.get();
  }

  /// The open unit gave the lane something.
  void delivered() { gave_ = true; }

  /// The open unit is read to its end: close it and move to the lane's next. Throws when the lane
  /// has gone through two epochs' worth of its units without delivering anything.
  void unit_done() {
    unit_.reset();
    if (order_->unit_done) order_->unit_done(source_, unit_index_);
    ++n_;
    empty_ = gave_ ? 0 : empty_ + 1;
    gave_ = false;
    const OrderSource& s = order_->sources[source_];
    if (empty_ > 2 * s.plan.lane_units_per_epoch(lane_))
      throw DatasetError(s.catalog->source + ": lane " + std::to_string(lane_) + " read " + std::to_string(empty_) +
                         " units in a row (two epochs of its units) without a document or token");
  }

  uint64_t n() const { return n_; }
  size_t memory() const { return unit_ ? unit_->memory() : 0; }

 private:
  const DataOrder* order_;
  size_t source_;
  uint32_t lane_;
  uint64_t n_;      // the lane's n-th unit: the one open, or the next to open
  uint64_t skip_;   // items to pass over when it opens (a resumed cursor's)
  uint64_t unit_index_ = 0;
  uint64_t empty_ = 0;  // units in a row that gave nothing
  bool gave_ = false;   // the open unit gave something
  std::unique_ptr<UnitT> unit_;
};

}  // namespace pipeline::datasets
