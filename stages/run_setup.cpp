// See run_setup.h.
#include "stages/run_setup.h"

#include <chrono>
#include <ctime>

#include "graph/atomic_file.h"
#include "graph/json.h"
#include "model/checkpoint.h"

namespace pipeline::stages {

namespace fs = std::filesystem;

std::vector<config::Section> RunPlan::sections() const {
  auto out = ctx->cfg.sections;
  for (const auto& s : spec.stages)
    if (s.resolved) out.push_back(*s.resolved);
  return out;
}

fs::path latest_checkpoint(const fs::path& run_dir) {
  fs::path best;
  auto dir = run_dir / "checkpoints";
  if (!fs::is_directory(dir)) return best;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".ckpt" && (best.empty() || e.path().filename() > best.filename())) best = e.path();
  return best;
}

namespace {

model::GPTConfig model_config(const RunConfig& rc) {
  model::GPTConfig m;
  try {
    m = model::GPTConfig::preset(rc.model.preset);
  } catch (const std::exception& e) {
    throw config::ConfigError(rc.file.string() + ": [model] preset: " + e.what());
  }
  if (rc.model.n_layer) m.n_layer = rc.model.n_layer;
  if (rc.model.n_head) m.n_head = rc.model.n_head;
  if (rc.model.n_embd) m.n_embd = rc.model.n_embd;
  if (rc.model.block_size) m.block_size = rc.model.block_size;
  m.with_vocab(rc.model.vocab_size);
  m.dropout = rc.model.dropout;
  m.bias = rc.model.bias;
  try {
    m.validate();
  } catch (const std::exception& e) {
    throw config::ConfigError(rc.file.string() + ": [model] " + e.what());
  }
  if (rc.training.seq_len > m.block_size)
    throw config::ConfigError(rc.file.string() + ": [training] seq_len: " + std::to_string(rc.training.seq_len) +
                              " exceeds the model's block_size " + std::to_string(m.block_size));
  return m;
}

torch::Device pick_device(const RunConfig& rc) {
  const auto& d = rc.run.device;
  bool cuda = torch::cuda::is_available();
  if (d == "cuda" && !cuda)
    throw config::ConfigError(rc.file.string() + ": [run] device: \"cuda\" was asked for but no CUDA device is available");
  if (d == "cuda" || (d == "auto" && cuda)) return torch::Device(torch::kCUDA, 0);
  return torch::kCPU;
}

std::string timestamp() {
  auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace

graph::EngineOptions engine_options(const RunContext& ctx) {
  graph::EngineOptions opts;
  opts.run_dir = ctx.run_dir;
  opts.sample_interval = std::chrono::milliseconds(ctx.cfg.logging.stats_interval_ms);
  opts.trace = ctx.cfg.logging.trace;
  opts.autotune = ctx.cfg.run.autotune;
  return opts;
}

RunPlan plan_run(const RunRequest& req) {
  RunPlan plan;
  std::string cfg = req.config;
  if (cfg.empty()) {
    if (req.resume.empty()) throw std::invalid_argument("no config given");
    cfg = (req.resume / "config.toml").string();  // the resolved config the run started with
  }
  plan.config_path = config::find_config(cfg, req.source_dir);
  plan.doc = config::Document::load(plan.config_path, req.overrides);
  auto ctx = std::make_shared<RunContext>();
  plan.ctx = ctx;
  ctx->cfg = resolve_run_config(plan.doc, req.source_dir);
  plan.spec = graph::GraphSpec::from_config(plan.doc);
  plan.doc.check_all_used();
  graph::validate(plan.spec);  // the graph's structure, before anything touches the disk
  ctx->model = model_config(ctx->cfg);
  ctx->device = pick_device(ctx->cfg);

  if (!req.resume.empty()) {
    if (!fs::is_directory(req.resume)) throw std::runtime_error(req.resume.string() + ": no such run directory");
    auto ckpt = latest_checkpoint(req.resume);
    if (ckpt.empty())
      throw std::runtime_error(req.resume.string() + ": no checkpoint in " + (req.resume / "checkpoints").string() +
                               " to resume from");
    auto state = model::read_checkpoint(ckpt.string());
    auto meta = json_parse(state.metadata);
    auto cursor = meta.find("cursor");
    if (!cursor) throw std::runtime_error(ckpt.string() + ": checkpoint metadata has no data cursor");
    try {
      ctx->start = DataCursor::from_json(*cursor);
    } catch (const std::exception& e) {
      throw std::runtime_error(ckpt.string() + ": " + e.what());
    }
    ctx->start_step = state.step;
    ctx->resume_from = ckpt;
    ctx->checkpoint_written = ckpt.string();  // the newest good checkpoint until this run writes one
    ctx->run_dir = req.resume;
  } else if (req.create_run_dir) {
    ctx->run_dir = ctx->cfg.run.dir.empty() ? fs::path("runs") / (ctx->cfg.run.name + "-" + timestamp())
                                            : fs::path(ctx->cfg.run.dir);
    if (fs::exists(ctx->run_dir / "checkpoints") && !fs::is_empty(ctx->run_dir / "checkpoints"))
      throw std::runtime_error(ctx->run_dir.string() +
                               " already holds a run with checkpoints; continue it with --resume " +
                               ctx->run_dir.string() + ", or choose another [run] dir");
  }
  if (!ctx->run_dir.empty()) {
    fs::create_directories(ctx->run_dir);
    if (req.resume.empty()) {
      // --resume reads this file back: a run whose config.toml could not be written must not start.
      write_file_atomic(ctx->run_dir / "config.toml", "# Resolved configuration of this run (from " +
                                                          plan.config_path.string() + ").\n\n" +
                                                          config::to_toml(plan.sections()));
    }
  }
  ctx->log = std::make_shared<RunLog>(ctx->run_dir);
  return plan;
}

}  // namespace pipeline::stages
