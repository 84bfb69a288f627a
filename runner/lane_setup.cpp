// See lane_setup.h.
#include "runner/lane_setup.h"

#include <algorithm>
#include <stdexcept>

#include "base/json.h"
#include "datasets/plan/data_plan.h"

namespace pipeline::stages {

namespace {

// "1, 2, 3 or 6": the divisors of n.
std::string divisors(uint64_t n) {
  std::vector<uint64_t> d;
  for (uint64_t k = 1; k <= n && d.size() < 64; ++k)
    if (n % k == 0) d.push_back(k);
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i == 0 ? "" : i + 1 == d.size() ? " or " : ", ") + std::to_string(d[i]);
  return s;
}

std::string ranks_text(uint32_t n) { return n == 1 ? "1 process" : std::to_string(n) + " ranks"; }

uint64_t whole_number(const JsonValue& meta, const char* key, const std::string& checkpoint) {
  const JsonValue* v = meta.find(key);
  if (!v || v->type != JsonValue::Type::number || v->text.empty() ||
      v->text.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error(checkpoint + ": checkpoint metadata: \"" + key + "\" " +
                             (v ? "is " + v->text + ", not a whole number" : std::string("is missing")));
  return std::stoull(v->text);
}

bool set_here(const RunRequest& req, const std::string& key) {
  return std::any_of(req.overrides.begin(), req.overrides.end(),
                     [&](const std::string& o) { return o.rfind(key + "=", 0) == 0; });
}

}  // namespace

uint32_t auto_lanes(uint64_t step_rows) { return static_cast<uint32_t>(std::min<uint64_t>(step_rows, 1u << 20)); }

CheckpointOrder checkpoint_order(const std::string& metadata, const std::string& checkpoint) {
  const JsonValue meta = json_parse(metadata);
  CheckpointOrder out;
  out.data_step = static_cast<int64_t>(whole_number(meta, meta.find("data_step") ? "data_step" : "step", checkpoint));
  const JsonValue* order = meta.find("order");
  if (!order) return out;  // written before lanes: the documents order
  if (order->type != JsonValue::Type::string || (order->text != "lanes" && order->text != "documents"))
    throw std::runtime_error(checkpoint + ": checkpoint metadata: \"order\" is " + order->text +
                             ", expected \"lanes\" or \"documents\"");
  out.order = order->text;
  if (out.order == "lanes") {
    const uint64_t k = whole_number(meta, "lanes", checkpoint);
    if (k < 1 || k > UINT32_MAX)
      throw std::runtime_error(checkpoint + ": checkpoint metadata: \"lanes\" is " + std::to_string(k));
    out.lanes = static_cast<uint32_t>(k);
    out.rows = whole_number(meta, "rows", checkpoint);
  }
  return out;
}

void apply_checkpoint_order(const CheckpointOrder& held, const RunRequest& req, RunConfig& cfg,
                            std::optional<int> world, const std::string& checkpoint) {
  const std::string was = held.order == "lanes" ? "the lanes order with " + std::to_string(held.lanes) + " lanes"
                                                : std::string("the documents order");
  if (set_here(req, "data.order") && cfg.data.order != held.order)
    throw std::invalid_argument(checkpoint + " was written in " + was + ", and --set data.order asks for \"" +
                                cfg.data.order + "\": a run goes on in the order it began (drop the --set, or start "
                                "a new run)");
  if (set_here(req, "data.lanes") && held.order == "lanes" && cfg.data.lanes != 0 &&
      cfg.data.lanes != static_cast<int64_t>(held.lanes))
    throw std::invalid_argument(checkpoint + " was written in " + was + ", and --set data.lanes asks for " +
                                std::to_string(cfg.data.lanes) + ": K is fixed when a run starts (drop the --set)");
  cfg.data.order = held.order;
  cfg.data.lanes = held.lanes;
  for (auto& sec : cfg.sections)  // the settings table shows what the run reads, and why
    if (sec.name() == "data") {
      sec.set("order", held.order, config::Location{"checkpoint", 0});
      if (held.order == "lanes") sec.set("lanes", static_cast<int64_t>(held.lanes), config::Location{"checkpoint", 0});
    }
  if (held.order != "lanes" || !world) return;
  const auto& t = cfg.training;
  const uint64_t rows = static_cast<uint64_t>(t.batch_size * t.grad_accum) * static_cast<uint64_t>(*world);
  if (rows != held.rows)
    throw std::invalid_argument(
        checkpoint + " trains " + std::to_string(held.rows) + " rows a step over its " + std::to_string(held.lanes) +
        " lanes, and this run's step would be " + std::to_string(rows) + " (batch_size " + std::to_string(t.batch_size) +
        " x grad_accum " + std::to_string(t.grad_accum) + " x " + ranks_text(static_cast<uint32_t>(*world)) +
        "): the order goes on only with the same rows a step; keep batch_size and let grad_accum adapt to the ranks");
}

std::shared_ptr<LaneSession> lane_session(const RunConfig& cfg, uint32_t rank, uint32_t world,
                                          std::vector<datasets::LaneCursor> start) {
  const auto& t = cfg.training;
  auto s = std::make_shared<LaneSession>();
  s->rank = rank;
  s->world = world;
  s->step_rows = static_cast<uint64_t>(t.batch_size * t.grad_accum) * world;
  s->lanes = cfg.data.lanes > 0 ? static_cast<uint32_t>(cfg.data.lanes) : auto_lanes(s->step_rows);
  const std::string step = std::to_string(s->step_rows) + " rows of a step (batch_size " + std::to_string(t.batch_size) +
                           " x grad_accum " + std::to_string(t.grad_accum) + " x " + ranks_text(world) + ")";
  if (s->step_rows % s->lanes != 0)
    throw std::invalid_argument("[data] lanes = " + std::to_string(s->lanes) + " does not divide the " + step +
                                ": a step takes the same number of rows from every lane; set lanes to " +
                                divisors(s->step_rows) + " (auto: " + std::to_string(auto_lanes(s->step_rows)) + ")");
  if (s->lanes % world != 0)
    throw std::invalid_argument(std::to_string(s->lanes) + " lanes cannot be shared by " + ranks_text(world) +
                                " (rank r serves lanes r, r + W, ...): run on " + divisors(s->lanes) +
                                " ranks, or set [data] lanes to a multiple of " + std::to_string(world));
  s->mine = datasets::lanes_of(rank, world, s->lanes);
  if (!start.empty() && start.size() != s->mine.size())
    throw std::logic_error("lane_session: " + std::to_string(start.size()) + " start cursors for " +
                           std::to_string(s->mine.size()) + " lanes");
  s->start = std::move(start);
  s->demand = std::make_shared<datasets::LaneDemand>(s->mine.size());
  return s;
}

}  // namespace pipeline::stages
