// How pack (stages/pack.cpp) cuts what it receives into micro-batches of B rows of T+1 tokens,
// one way per data order ([data] order, docs/data_order.md):
//   - window_rows: the documents order. This rank's token stream, one window of B*T+1
//     consecutive tokens a micro-batch, written as B overlapping rows (row b: the window's tokens
//     [b*T, b*T+T]), the next window B*T tokens later: x and y are those of the window.
//   - lane_batches: the lanes order. Each of this rank's lanes cut into rows of its own
//     (datasets/lanes/lane_rows.h); rank row q of a step is the next row of the lane
//     datasets::RowLayout names, so the step's rows are the same on any number of ranks.
// Pack owns the buffers the rows are written into and what goes around them (the batch's number,
// its data step, its hash); these say which tokens, and where the data goes on after them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "stages/types.h"

namespace pipeline::stages {

class BatchRows {
 public:
  virtual ~BatchRows() = default;
  /// Takes a chunk in (its tokens may be moved out of it).
  virtual void push(TokenChunk& chunk) = 0;
  /// Whether the next micro-batch's rows are all at hand.
  virtual bool ready() const = 0;
  /// Writes the next micro-batch's B rows of T+1 tokens into `rows` (B*(T+1) tokens, row after
  /// row) and returns where the data goes on after them. Only when ready().
  virtual DataCursor take(uint16_t* rows) = 0;
  /// Called once the micro-batches that the last chunk completed have been taken.
  virtual void settle() {}
  /// A line for the run log at the end (what it held), or "".
  virtual std::string summary() const { return ""; }
};

/// The documents order, from the run's resume position (RunContext::start).
std::unique_ptr<BatchRows> window_rows(const RunContext& rc);
/// The lanes order, for this rank's lanes (RunContext::lanes), publishing what each lane holds
/// on the demand board its read stage chooses lanes by.
std::unique_ptr<BatchRows> lane_batches(const RunContext& rc);

}  // namespace pipeline::stages
