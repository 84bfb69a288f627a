// The TensorBoard log of a training run (see tensorboard_log.h).
#include "runner/tensorboard_log.h"

#include <atomic>
#include <charconv>
#include <cstdlib>

#include "base/json.h"
#include "graph/observe/tensorboard.h"

namespace pipeline::stages {

struct TensorBoardLog::State {
  State(const std::filesystem::path& dir, int64_t purge_step) : writer(dir, purge_step) {}
  graph::TensorBoardWriter writer;
  std::atomic<int64_t> stats_step{0};  // last step a snapshot was written at
};

bool metric_scalars(const std::string& json, int64_t& step, std::vector<std::pair<std::string, double>>& scalars) {
  JsonValue v;
  try {
    v = json_parse(json);
  } catch (const JsonParseError&) {
    return false;
  }
  const JsonValue* s = v.find("step");
  if (!s || s->type != JsonValue::Type::number) return false;
  auto [p, ec] = std::from_chars(s->text.data(), s->text.data() + s->text.size(), step);
  if (ec != std::errc() || p != s->text.data() + s->text.size()) return false;
  const bool eval = v.find("val_loss") != nullptr;
  scalars.clear();
  for (const auto& [key, value] : v.members) {
    if (key == "step" || value.type != JsonValue::Type::number) continue;
    std::string tag;
    if (key.starts_with("hellaswag_"))
      tag = "hellaswag/" + key.substr(10);
    else if (eval && key.starts_with("val_"))
      tag = "val/" + key.substr(4);
    else
      tag = (eval ? "val/" : "train/") + key;
    scalars.emplace_back(tag, std::strtod(value.text.c_str(), nullptr));
  }
  return true;
}

std::unique_ptr<TensorBoardLog> TensorBoardLog::attach(graph::Engine& engine, RunContext& ctx) {
  // Rank 0 alone, as it alone writes metrics.jsonl: another rank's file would put its own stage
  // statistics under the same tags, and (resumed) its own session start after rank 0's points.
  if (!ctx.cfg.logging.tensorboard || ctx.run_dir.empty() || !ctx.log || !ctx.writer()) return nullptr;
  std::unique_ptr<TensorBoardLog> log(new TensorBoardLog(ctx));
  // A resumed run trains again the steps after its checkpoint that an earlier process may have
  // logged before it died: TensorBoard drops those (the session start's purge), as metrics.jsonl
  // had them moved out (runner/resume_records.h).
  auto state = std::make_shared<State>(ctx.run_dir, ctx.start_step > 0 ? ctx.start_step + 1 : 0);
  state->stats_step = ctx.start_step;
  log->state_ = state;
  log->listener_ = ctx.log->add_metric_listener([state](const std::string& json) {
    int64_t step = 0;
    std::vector<std::pair<std::string, double>> scalars;
    if (metric_scalars(json, step, scalars)) state->writer.add_scalars(step, scalars);
  });
  engine.add_observer([state, &ctx](const graph::Snapshot& s) {
    // One point per training step at most: TensorBoard treats a step that goes back as a restart.
    const int64_t step = ctx.last_step.load();
    if (step <= state->stats_step.load()) return;
    state->stats_step = step;
    state->writer.add_scalars(step, graph::snapshot_scalars(s));
  });
  return log;
}

TensorBoardLog::~TensorBoardLog() {
  if (ctx_.log) ctx_.log->remove_metric_listener(listener_);
}

}  // namespace pipeline::stages
