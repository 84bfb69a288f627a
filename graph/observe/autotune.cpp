// See autotune.h.
#include "graph/observe/autotune.h"

#include "graph/observe/percent.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace pipeline::graph {

namespace {

constexpr int kWarmupReports = 3;  // before the first decision
constexpr int kSettleReports = 2;  // after a change, before its effect is measured
constexpr int kMeasureReports = 3; // reports averaged to measure it
constexpr double kGain = 1.03;     // a change is kept when the throughput rose at least this much

std::string per_s(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 100 ? "%.0f/s" : "%.3g/s", r);
  return buf;
}

std::string cores(double x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

}  // namespace

int Autotuner::Knob::get() const {
  if (!side_knob.empty()) {
    for (const auto& [name, value] : stage->side_knobs)
      if (name == side_knob) return value;
    return 0;
  }
  return static_cast<int>(stage ? stage->worker_slots.bound() : edge->credits.bound());
}

void Autotuner::Knob::set(int value) const {
  if (!side_knob.empty()) {
    if (stage->stage) stage->stage->side_tune(side_knob, value);
    for (auto& [name, v] : stage->side_knobs)
      if (name == side_knob) v = value;  // until its next report says so
  } else if (stage)
    stage->worker_slots.set_bound(value);
  else
    edge->credits.set_bound(value);
}

Autotuner::Autotuner(Runtime& rt) : rt_(rt) {
  for (const auto& st : rt.stages) active_ |= st->tune_workers && st->max_workers > st->start_workers;
  for (const auto& e : rt.edges) active_ |= e->tune_capacity;
  // A side stage is tuned with [run] autotune, or with its workers set to "auto".
  for (const auto& st : rt.stages) active_ |= st->is_side() && (rt.opts.autotune || st->spec.workers == 0);
  // The throughput: the last stage in graph order that takes every item of its input.
  for (size_t k = 0; k < rt.stages.size(); ++k) {
    const StageRt& st = *rt.stages[k];
    if (!st.is_source() && !st.inputs.empty() && !st.inputs.front()->accepts) measured_ = k;
  }
}

double Autotuner::throughput(const Snapshot& s) const {
  return measured_ < s.stages.size() ? s.stages[measured_].window_items_per_s : 0;
}

std::vector<Event> Autotuner::step(const Snapshot& s) {
  moved_ = false;
  if (!active_ || s.finished || rt_.stopping() || rt_.failing()) return {};
  ++reports_;
  rates_.push_back(throughput(s));
  if (rates_.size() > static_cast<size_t>(kMeasureReports)) rates_.pop_front();
  if (trial_on_) return judge(s);
  if (reports_ < std::max(kWarmupReports, quiet_until_)) return {};
  return propose(s);
}

std::vector<Event> Autotuner::judge(const Snapshot& s) {
  if (++trial_.reports < kSettleReports + kMeasureReports) return {};
  const double after = std::accumulate(rates_.begin(), rates_.end(), 0.0) / static_cast<double>(rates_.size());
  trial_on_ = false;
  quiet_until_ = reports_ + 1;
  char buf[256];
  if (after >= trial_.rate_before * kGain) {
    std::snprintf(buf, sizeof buf, "kept %s = %d: throughput %s -> %s (%+.0f%%)", trial_.knob.name.c_str(),
                  trial_.after, per_s(trial_.rate_before).c_str(), per_s(after).c_str(),
                  100 * (after / std::max(trial_.rate_before, 1e-9) - 1));
    return {{s.t_s, "autotune", buf}};
  }
  trial_.knob.set(trial_.before);
  moved_ = true;
  exhausted_.insert(trial_.knob.name);
  std::snprintf(buf, sizeof buf, "undid %s %d -> %d: throughput %s -> %s, under +%.0f%%; back to %d",
                trial_.knob.name.c_str(), trial_.before, trial_.after, per_s(trial_.rate_before).c_str(),
                per_s(after).c_str(), 100 * (kGain - 1), trial_.before);
  return {{s.t_s, "autotune", buf}};
}

std::vector<Event> Autotuner::start(const Snapshot& s, Knob knob, int value, std::string reason) {
  trial_ = Trial{knob, knob.get(), value, 0, 0, std::move(reason)};
  trial_.rate_before = std::accumulate(rates_.begin(), rates_.end(), 0.0) / static_cast<double>(rates_.size());
  knob.set(value);
  moved_ = true;
  trial_on_ = true;
  rates_.clear();
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s %d -> %d (%s); throughput %s before", knob.name.c_str(), trial_.before, value,
                trial_.reason.c_str(), per_s(trial_.rate_before).c_str());
  return {{s.t_s, "autotune", buf}};
}

std::vector<Event> Autotuner::propose(const Snapshot& s) {
  auto note = [&](const std::string& text) -> std::vector<Event> {
    if (text == last_note_) return {};
    last_note_ = text;
    return {{s.t_s, "autotune", text}};
  };
  const Verdict& v = s.verdict.kind.empty() ? Verdict{} : s.verdict;
  StageRt* bottleneck = rt_.find(v.stage);
  const bool cores_used = v.kind == "cpu";

  // 1. The bottleneck is a CPU stage with room to grow, and there are cores to grow into.
  if (bottleneck && (v.kind == "stage" || v.kind == "cpu") && bottleneck->tune_workers) {
    Knob k{bottleneck, nullptr, bottleneck->spec.name + " workers"};
    const int w = k.get();
    if (cores_used)
      return note("CPU-bound: the CPU stages keep " + cores(s.cpu_cores) + " of " + std::to_string(s.cores) +
                  " cores busy; more " + bottleneck->spec.name + " workers cannot help");
    if (w < bottleneck->max_workers && !exhausted_.count(k.name)) {
      const StageStats* x = s.stage(bottleneck->spec.name);
      std::string why = bottleneck->spec.name + " is the bottleneck, busy " +
                        pct(x && x->steady.seconds > 0 ? x->steady.busy : x ? x->busy() : 0) + "; the CPU stages use " +
                        cores(s.cpu_cores) + " of " + std::to_string(s.cores) + " cores";
      return start(s, k, std::min(bottleneck->max_workers, w + std::max(1, w / 2)), why);
    }
  }
  // 2. A side stage (the fetch stage) is the limit: its knobs, in the order it gives them.
  if (bottleneck && v.kind == "side" && bottleneck->is_side() && (rt_.opts.autotune || bottleneck->spec.workers == 0))
    for (const auto& [knob, value] : bottleneck->side_knobs) {
      Knob k{bottleneck, nullptr, bottleneck->spec.name + " " + knob, knob};
      if (exhausted_.count(k.name) || value <= 0 || value >= (1 << 20)) continue;
      const StageStats* x = s.stage(bottleneck->spec.name);
      return start(s, k, value * 2,
                   bottleneck->spec.name + " is the bottleneck, " +
                       pct(x && x->steady.seconds > 0 ? x->steady.busy : x ? x->busy() : 0) + " of its time at work");
    }
  // 3. A bursty edge, or the bottleneck's input running dry while its producer is blocked.
  for (auto& e : rt_.edges) {
    if (!e->tune_capacity) continue;
    const std::string producer = rt_.stages[e->producer]->spec.name, consumer = rt_.stages[e->consumer]->spec.name;
    Knob k{nullptr, e.get(), "capacity " + consumer + " <- " + producer};
    const int cap = k.get();
    if (cap >= e->max_capacity || exhausted_.count(k.name)) continue;
    const StageStats* p = s.stage(rt_.stages[e->producer]->spec.name);
    const StageStats* c = s.stage(rt_.stages[e->consumer]->spec.name);
    if (!p || !c || p->steady.seconds <= 0 || c->steady.seconds <= 0) continue;
    // With no stage saturated, the idle time itself is the loss: a smaller imbalance counts.
    const double margin = v.kind == "none" ? 0.1 : 0.2;
    const bool bursty = p->steady.blocked > margin && c->steady.starved > margin;
    const bool starving_bottleneck = bottleneck && rt_.stages[e->consumer].get() == bottleneck &&
                                     c->steady.starved > 0.05 && p->steady.blocked > 0.05;
    const bool order_bound = v.kind == "order" && producer == v.stage;
    if (bursty || starving_bottleneck || order_bound) {
      std::string why = order_bound ? producer + " waits for its turn in order " + pct(p->steady.order_wait) +
                                          " of the time: a larger queue lets items overtake a slow one"
                                    : producer + " blocked " + pct(p->steady.blocked) + " while " + consumer +
                                          " waited for input " + pct(c->steady.starved);
      return start(s, k, std::min(e->max_capacity, cap * 2), why);
    }
  }
  if (bottleneck && bottleneck->kind == StageKind::own_thread)
    return note(bottleneck->spec.name + " (a stage with a thread of its own) is the bottleneck: nothing on the CPU "
                                        "side to tune");
  if (v.kind == "cpu") return note("CPU-bound: the cores are used up");
  return {};
}

}  // namespace pipeline::graph
