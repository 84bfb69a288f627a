// The data plan (data_plan.h): epoch orders as keyed permutations, lanes, rows of a step.
#include "datasets/plan/data_plan.h"

#include "datasets/dataset_error.h"
#include "datasets/plan/splitmix.h"

namespace pipeline::datasets {
namespace {

constexpr int kFeistelRounds = 6;

// A balanced Feistel network on 2 * half_bits bits: a bijection for any round function, so
// walking it from x < M until it lands below M again is a bijection on [0, M).
uint64_t feistel(uint64_t x, uint32_t half_bits, uint64_t key) {
  const uint64_t mask = half_bits == 0 ? 0 : (uint64_t(1) << half_bits) - 1;
  uint64_t left = (x >> half_bits) & mask, right = x & mask;
  for (int r = 0; r < kFeistelRounds; ++r) {
    const uint64_t f = splitmix64((key + static_cast<uint64_t>(r) * 0x9e3779b97f4a7c15ull) ^ right) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits) | right;
}

}  // namespace

DataPlan::DataPlan(uint64_t units, DataPlanOptions options, const std::string& source)
    : units_(units), options_(options) {
  if (options.lanes == 0) throw DatasetError(source + ": a data plan needs at least one lane, found [data] lanes = 0");
  if (units < options.lanes)
    throw DatasetError(source + ": " + std::to_string(units) + " units for " + std::to_string(options.lanes) +
                       " lanes: every lane needs at least one unit. Set [data] lanes to at most " +
                       std::to_string(units) +
                       ", or cut the data finer: `pipeline prepare` block shards with smaller --block-bytes, "
                       "Parquet files written with smaller row groups, or more data");
  while (half_bits_ < 32 && (uint64_t(1) << (2 * half_bits_)) < units) ++half_bits_;
}

uint64_t DataPlan::unit_at(uint64_t epoch, uint64_t position) const {
  if (position >= units_)
    throw DatasetError("data plan: position " + std::to_string(position) + " of an epoch of " +
                       std::to_string(units_) + " units");
  if (!options_.shuffle) return position;
  const uint64_t key = splitmix64(options_.seed ^ splitmix64(epoch ^ 0x4c414e45504c414eull));  // "LANEPLAN"
  uint64_t x = position;
  do x = feistel(x, half_bits_, key);
  while (x >= units_);
  return x;
}

uint64_t DataPlan::lane_units_per_epoch(uint32_t lane) const {
  if (lane >= options_.lanes)
    throw DatasetError("data plan: lane " + std::to_string(lane) + " of " + std::to_string(options_.lanes) + " lanes");
  return (units_ - lane + options_.lanes - 1) / options_.lanes;
}

std::optional<PlannedUnit> DataPlan::lane_unit(uint32_t lane, uint64_t n) const {
  const uint64_t per_epoch = lane_units_per_epoch(lane);
  const uint64_t epoch = n / per_epoch, i = n % per_epoch;
  if (epoch > 0 && !options_.loop) return std::nullopt;
  return PlannedUnit{epoch, unit_at(epoch, lane + i * options_.lanes)};
}

std::vector<uint32_t> lanes_of(uint32_t rank, uint32_t world, uint32_t lanes) {
  if (world == 0 || rank >= world)
    throw DatasetError("lanes: rank " + std::to_string(rank) + " of a world of " + std::to_string(world));
  if (lanes % world != 0)
    throw DatasetError("lanes: a world of " + std::to_string(world) + " ranks does not divide the run's " +
                       std::to_string(lanes) + " lanes ([data] lanes): every rank serves the same number of "
                       "lanes, so the world size must divide it");
  std::vector<uint32_t> out;
  for (uint32_t l = rank; l < lanes; l += world) out.push_back(l);
  return out;
}

RowLayout::RowLayout(uint32_t lanes, uint32_t world, uint64_t rows) : lanes_(lanes), world_(world), rows_(rows) {
  if (lanes == 0 || world == 0 || rows == 0 || rows % lanes != 0 || lanes % world != 0)
    throw DatasetError("row layout: " + std::to_string(rows) + " rows a step (B x grad_accum x world) over " +
                       std::to_string(lanes) + " lanes and " + std::to_string(world) +
                       " ranks: the lanes must divide the step's rows, and the ranks the lanes");
}

std::pair<uint32_t, uint64_t> RowLayout::rank_row(uint32_t rank, uint64_t step, uint64_t q) const {
  const uint64_t per_rank_lanes = lanes_ / world_;
  return {static_cast<uint32_t>(rank + world_ * (q % per_rank_lanes)), step * (rows_ / lanes_) + q / per_rank_lanes};
}

}  // namespace pipeline::datasets
