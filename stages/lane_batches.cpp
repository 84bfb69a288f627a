// The lanes order's micro-batches (batch_rows.h, docs/data_order.md). Each of this rank's lanes is
// cut into rows of T+1 tokens by datasets::LaneRows (row j: the lane's tokens [jT, jT+T]); rank
// row q of a step is the next row of the lane datasets::RowLayout names (lane r + W*(q mod K/W)),
// and micro-batch m of the step holds rank rows [m*B, (m+1)*B). So the rows of a step are the same
// for every number of ranks that divides K, whatever B and grad_accum make up the step's rows.
//
// Chunks come one lane at a time, as the read stage chose the neediest lane; after every change
// pack publishes what each lane holds on the demand board that choice is made by
// (datasets/lanes/lane_demand.h), so what pack holds per lane stays within about a chunk.
#include <algorithm>
#include <optional>
#include <span>
#include <stdexcept>

#include "datasets/lanes/lane_rows.h"
#include "datasets/plan/data_plan.h"
#include "stages/batch_rows.h"

namespace pipeline::stages {
namespace {

class LaneBatches : public BatchRows {
 public:
  explicit LaneBatches(const RunContext& rc)
      : s_(*rc.lanes),
        layout_(s_.lanes, s_.world, s_.step_rows),
        B_(static_cast<uint64_t>(rc.cfg.training.batch_size)),
        T_(static_cast<uint64_t>(rc.cfg.training.seq_len)),
        accum_(static_cast<uint64_t>(rc.cfg.training.grad_accum)) {
    if (layout_.rows_per_rank() != B_ * accum_)
      throw std::logic_error("pack: a step of " + std::to_string(s_.step_rows) + " rows over " + std::to_string(s_.world) +
                             " ranks is not batch_size x grad_accum = " + std::to_string(B_ * accum_) + " rows a rank");
    // The lane (its index among this rank's) of every rank row of a step, the same every step,
    // and what each micro-batch takes of each lane.
    std::vector<size_t> index_of(s_.lanes, SIZE_MAX);
    for (size_t i = 0; i < s_.mine.size(); ++i) index_of[s_.mine[i]] = i;
    need_.resize(accum_);
    for (uint64_t q = 0; q < B_ * accum_; ++q) {
      const size_t i = index_of.at(layout_.rank_row(s_.rank, 0, q).first);
      lane_of_row_.push_back(i);
      auto& need = need_[q / B_];
      auto it = std::find_if(need.begin(), need.end(), [&](const auto& n) { return n.first == i; });
      if (it == need.end())
        need.emplace_back(i, 1);
      else
        ++it->second;
    }
  }

  void push(TokenChunk& chunk) override {
    if (chunk.lane < 0)
      throw std::invalid_argument(
          "pack: [data] order = \"lanes\" needs chunks that carry their lane, from read_shards (and tokenize) or "
          "read_tokens; this one has none (a source of another kind: set [data] order = \"documents\")");
    if (!rows_) {
      rows_.emplace(static_cast<uint32_t>(T_), s_.content, s_.start);
      received_.assign(rows_->size(), 0);
    }
    const size_t i = rows_->index_of(static_cast<uint32_t>(chunk.lane));
    const std::span<const uint16_t> tokens(chunk.tokens);
    uint32_t begin = 0;
    for (size_t p = 0; p < chunk.places.size(); ++p) {
      rows_->push(i, tokens.subspan(begin, chunk.ends[p] - begin), chunk.places[p]);
      begin = chunk.ends[p];
    }
    received_[i] += chunk.estimate;
    s_.demand->publish(i, rows_->buffered(i), received_[i]);
  }

  bool ready() const override {
    if (!rows_) return false;
    for (const auto& [i, rows] : need_[micro_])
      if (rows_->rows_ready(i) < rows) return false;
    return true;
  }

  DataCursor take(uint16_t* rows) override {
    const size_t row = T_ + 1;
    for (uint64_t k = 0; k < B_; ++k) {
      const uint64_t q = micro_ * B_ + k;
      const size_t i = lane_of_row_[q];
      const uint64_t want = layout_.rank_row(s_.rank, step_, q).second;  // counted from where the lane started
      if (rows_->rows_taken(i) != want)
        throw std::logic_error("pack: lane " + std::to_string(rows_->lane(i)) + " is at its row " +
                               std::to_string(rows_->rows_taken(i)) + ", and row " + std::to_string(q) + " of step " +
                               std::to_string(step_) + " is its row " + std::to_string(want));
      rows_->take_row(i, std::span<uint16_t>(rows + k * row, row));
    }
    for (const auto& [i, n] : need_[micro_]) s_.demand->publish(i, rows_->buffered(i), received_[i]);
    if (++micro_ == accum_) {
      micro_ = 0;
      ++step_;
    }
    DataCursor c;
    c.lane_order = true;
    for (size_t i = 0; i < rows_->size(); ++i) c.lanes.push_back(rows_->cursor(i));
    return c;
  }

  std::string summary() const override {
    if (!rows_) return "";
    return "lanes: " + std::to_string(rows_->size()) + " of " + std::to_string(s_.lanes) + " on this rank; the most " +
           "tokens one lane held at once " + std::to_string(rows_->buffered_high_water()) + "; " +
           std::to_string(rows_->memory() / 1024) + " KiB held at the end";
  }

 private:
  LaneSession& s_;
  datasets::RowLayout layout_;
  uint64_t B_, T_, accum_;
  std::optional<datasets::LaneRows> rows_;  // made at the first chunk (a fresh run's start cursors come with the read stage)
  std::vector<uint64_t> received_;          // per lane: the reader's estimates of the chunks received
  std::vector<size_t> lane_of_row_;         // per rank row of a step: its lane's index
  std::vector<std::vector<std::pair<size_t, uint64_t>>> need_;  // per micro-batch: (lane index, rows)
  uint64_t micro_ = 0, step_ = 0;           // the next micro-batch, and its step since this run started
};

}  // namespace

std::unique_ptr<BatchRows> lane_batches(const RunContext& rc) { return std::make_unique<LaneBatches>(rc); }

}  // namespace pipeline::stages
