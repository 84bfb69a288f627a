// Shared by the training-graph tests (test_stages, test_train_gpu, test_interop): a tiny GPT-2
// config on the bundled data, an in-process run of it as `pipeline run` does it, returning the
// logged losses (and each step's row hash), and the exact-resume check.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "base/json.h"
#include "graph/engine.h"
#include "kept_dirs.h"
#include "model/net/gpt2.h"
#include "model/net/optim.h"
#include "model/net/schedule.h"
#include "runner/run_setup.h"
#include "runner/tensorboard_log.h"

namespace train_harness {

namespace fs = std::filesystem;
using namespace pipeline;

inline fs::path temp_dir(const std::string& tag) {
  static int counter = 0;
  auto d = fs::temp_directory_path() / ("pipeline_train_" + std::to_string(::getpid()) + "_" + tag + "_" +
                                        std::to_string(counter++));
  fs::remove_all(d);
  fs::create_directories(d);
  kept_dirs::note(d);  // removed at the end if every test passed
  return d;
}

inline const std::string kData = std::string(PIPELINE_SOURCE_DIR) + "/datasets/data/tinyshakespeare/";

// A tiny model on the bundled data; `input` is the TOML of the input side.
inline std::string tiny_config(const fs::path& run_dir, const std::string& input, const std::string& dataset = kData + "text") {
  std::ostringstream os;
  os << "[run]\ndir = \"" << run_dir.string() << "\"\nseed = 7\ndevice = \"cpu\"\n"
     << "[model]\npreset = \"tiny\"\n"
     << "[data]\ndataset = \"" << dataset << "\"\n"
     << "[training]\nsteps = 8\nbatch_size = 2\nseq_len = 32\ndtype = \"fp32\"\n"
     << "[optimizer]\nlr = 1e-3\nmin_lr = 1e-4\nwarmup_steps = 2\n"
     << "[eval]\nevery = 0\n"
     << "[checkpoint]\nevery = 4\nkeep = 10\n"
     << "[logging]\nlive = \"off\"\ntrace = false\nstats_interval_ms = 5\n"
     << input
     << "[stages.train]\ntype = \"train\"\ninput = \"h2d\"\ncapacity = 2\n"
     << "[stages.log]\ntype = \"log\"\ninput = \"train\"\ncapacity = 64\n"
     << "[stages.checkpoint]\ntype = \"checkpoint\"\ninput = \"train\"\ncapacity = 4\n";
  return os.str();
}

inline const std::string kTextInput =
    "[stages.read]\ntype = \"read_shards\"\n"
    "[stages.tokenize]\ntype = \"tokenize\"\ninput = \"read\"\nworkers = 2\ncapacity = 8\n"
    "[stages.pack]\ntype = \"pack\"\ninput = \"tokenize\"\ncapacity = 8\n"
    "[stages.h2d]\ntype = \"h2d\"\ninput = \"pack\"\ncapacity = 2\n";

inline const std::string kTokenInput =
    "[stages.read]\ntype = \"read_tokens\"\nchunk_tokens = 100\n"
    "[stages.pack]\ntype = \"pack\"\ninput = \"read\"\ncapacity = 8\n"
    "[stages.h2d]\ntype = \"h2d\"\ninput = \"pack\"\ncapacity = 2\n";

struct RunResult {
  std::map<int64_t, std::string> losses;  // step -> loss as logged (%.9g: exact for fp32)
  fs::path dir;
  int64_t last_step = 0;
  std::string checkpoint;
};

inline std::map<int64_t, std::string> read_losses(const fs::path& dir) {
  std::map<int64_t, std::string> out;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto l = line.find("\"loss\":");
    if (l == std::string::npos) continue;
    int64_t step = std::stoll(line.substr(line.find("\"step\":") + 7));
    auto start = l + 7;
    out[step] = line.substr(start, line.find(',', start) - start);
  }
  return out;
}

// Each step's "windows" in a run's metrics.jsonl: the hash of the step's rows (docs/data_order.md).
inline std::map<int64_t, std::string> read_windows(const fs::path& dir) {
  std::map<int64_t, std::string> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto v = json_parse(line);
    if (const JsonValue* w = v.find("windows")) out[static_cast<int64_t>(v.number("step"))] = w->text;
  }
  return out;
}

// Plans a config in-process as `pipeline run` does (the run layer's work before the engine).
inline stages::RunPlan plan(const std::string& toml, const fs::path& run_dir, std::vector<std::string> overrides = {},
                            fs::path resume = {}) {
  auto cfg = run_dir.parent_path() / (run_dir.filename().string() + ".toml");
  std::ofstream(cfg) << toml;
  stages::RunRequest req;
  req.config = resume.empty() ? cfg.string() : "";
  req.overrides = std::move(overrides);
  req.resume = resume;
  req.source_dir = PIPELINE_SOURCE_DIR;
  return stages::plan_run(req);
}

// Runs a planned run's engine; `during` runs on a side thread while the graph runs (e.g. to
// request a stop).
inline RunResult execute(stages::RunPlan& plan, std::function<void(graph::Engine&, stages::RunContext&)> during = {}) {
  graph::EngineOptions opts = stages::engine_options(*plan.ctx);
  opts.host = plan.ctx;
  {
    graph::Engine engine(plan.spec, opts);
    auto tensorboard = stages::TensorBoardLog::attach(engine, *plan.ctx);
    std::thread side;
    if (during) side = std::thread([&] { during(engine, *plan.ctx); });
    try {
      engine.run();
    } catch (...) {
      if (side.joinable()) side.join();
      throw;
    }
    if (side.joinable()) side.join();
  }
  RunResult r;
  r.dir = plan.ctx->run_dir;
  r.losses = read_losses(r.dir);
  r.last_step = plan.ctx->last_step.load();
  r.checkpoint = plan.ctx->checkpoint_written;
  return r;
}

// Runs a config in-process as `pipeline run` does: plan, then execute.
inline RunResult run(const std::string& toml, const fs::path& run_dir, std::vector<std::string> overrides = {},
              fs::path resume = {}, std::function<void(graph::Engine&, stages::RunContext&)> during = {}) {
  auto p = plan(toml, run_dir, std::move(overrides), std::move(resume));
  return execute(p, std::move(during));
}

// A loss as log writes it into metrics.jsonl (%.9g: exact for fp32).
inline std::string g9(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// tiny_config's training done by hand, outside the graph: the same model, AdamW, clipping and
// schedule, one micro-batch a step; `batch(step)` gives the step's x and y, (B, T) int64 each.
// Returns each step's loss as log writes it, for comparing with a graph's, bit for bit.
inline std::vector<std::string> hand_trained_losses(
    const std::function<std::pair<torch::Tensor, torch::Tensor>(int64_t step)>& batch, int64_t steps = 8) {
  model::GPT net(model::GPTConfig::preset("tiny"), 7);
  net->train();
  model::AdamW opt(net->named_parameters(), model::AdamWOptions{.lr = 1e-3});
  model::LrSchedule sched{1e-3, 1e-4, 2, steps};
  std::vector<std::string> out;
  for (int64_t s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    auto loss = net->loss(net->forward(x), y);
    loss.backward();
    model::clip_grad_norm(net->parameters(), 1.0);
    opt.set_lr(sched.at(s));
    opt.step();
    opt.zero_grad();
    out.push_back(g9(loss.item<float>()));
  }
  return out;
}

// Trains `input` for 8 steps twice; the second run is taken back to its step-4 checkpoint, as
// if it had stopped there, and resumed: steps 5..8 must give the same losses, bit for bit.
// Returns the uninterrupted run's losses; throws std::runtime_error naming the first difference.
inline std::map<int64_t, std::string> check_exact_resume(const fs::path& root, const std::string& input,
                                                         const std::string& dataset = kData + "text") {
  auto full = run(tiny_config(root / "full", input, dataset), root / "full");
  auto part = run(tiny_config(root / "part", input, dataset), root / "part");
  fs::remove(root / "part" / "checkpoints" / "step_00000008.ckpt");
  fs::remove(root / "part" / "metrics.jsonl");
  auto resumed = run("", root / "part", {}, root / "part");
  if (full.losses.size() != 8 || resumed.losses.size() != 4)
    throw std::runtime_error("exact resume: " + std::to_string(full.losses.size()) + " steps logged in full, " +
                             std::to_string(resumed.losses.size()) + " after resuming (expected 8 and 4)");
  for (int64_t s = 5; s <= 8; ++s)
    if (resumed.losses[s] != full.losses[s])
      throw std::runtime_error("exact resume: step " + std::to_string(s) + " loss " + resumed.losses[s] +
                               " after resuming, " + full.losses[s] + " uninterrupted");
  return full.losses;
}

}  // namespace train_harness
