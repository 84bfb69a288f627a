// See train_figures.h.
#include "runner/train_figures.h"

#include <algorithm>
#include <cstdlib>

#include "base/json.h"

namespace pipeline::stages {

namespace {

bool is_figure(const std::string& key) {
  static const char* const keys[] = {"step",         "loss",        "val_loss", "hellaswag_acc_norm", "hellaswag_acc",
                                     "tokens_per_s", "ms_per_step", "mfu",      "guard_skips",        "guard_rollbacks"};
  return std::any_of(std::begin(keys), std::end(keys), [&](const char* k) { return key == k; });
}

}  // namespace

TrainFigures::TrainFigures(RunContext& ctx) : ctx_(ctx) {
  if (ctx_.log) listener_ = ctx_.log->add_metric_listener([this](const std::string& json) { take(json); });
}

TrainFigures::~TrainFigures() {
  if (ctx_.log && listener_) ctx_.log->remove_metric_listener(listener_);
}

void TrainFigures::take(const std::string& json) {
  JsonValue v;
  try {
    v = json_parse(json);
  } catch (const JsonParseError&) {
    return;  // not ours to judge: the line is in metrics.jsonl as it was written
  }
  std::lock_guard lock(mu_);
  for (const auto& [key, value] : v.members) {
    if (!is_figure(key) || value.type != JsonValue::Type::number) continue;
    // An evaluation line's step is the step it evaluated: never older than the log's.
    const double x = std::strtod(value.text.c_str(), nullptr);
    auto at = std::find_if(figures_.begin(), figures_.end(), [&](const auto& f) { return f.first == key; });
    if (at == figures_.end())
      figures_.emplace_back(key, x);
    else if (key != "step" || x > at->second)
      at->second = x;
  }
}

void TrainFigures::annotate(graph::Snapshot& s) {
  // The device's busy time is counted on the stage whose work it runs (train).
  double device_s = 0;
  for (const auto& st : s.stages)
    if (st.rank <= 0) device_s = std::max(device_s, st.device_busy_s);
  std::lock_guard lock(mu_);
  s.train = figures_;
  if (device_s > 0 && last_t_ >= 0 && s.t_s > last_t_)
    s.train.emplace_back("device_busy", std::clamp((device_s - last_device_s_) / (s.t_s - last_t_), 0.0, 1.0));
  last_t_ = s.t_s;
  last_device_s_ = device_s;
}

}  // namespace pipeline::stages
