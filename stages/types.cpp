// Shared pieces of the training stages: cursor serialization, event waits, the run log and
// the run context (see types.h).
#include "stages/types.h"

#include <cstdio>
#include <iostream>
#include <stdexcept>

#include "graph/json.h"

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace pipeline::stages {

std::string DataCursor::to_json() const {
  return "{\"shard\":" + std::to_string(pos.shard) + ",\"item\":" + std::to_string(pos.item) +
         ",\"epoch\":" + std::to_string(pos.epoch) + ",\"skip\":" + std::to_string(skip) + "}";
}

DataCursor DataCursor::from_json(const std::string& text) {
  auto v = json_parse(text);
  auto num = [&](const char* key) -> uint64_t {
    auto m = v.find(key);
    if (!m || m->type != JsonValue::Type::number)
      throw std::runtime_error("data cursor " + text + ": expected a number for \"" + key + "\"");
    return std::stoull(m->text);
  };
  DataCursor c;
  c.pos.shard = static_cast<uint32_t>(num("shard"));
  c.pos.item = num("item");
  c.pos.epoch = num("epoch");
  c.skip = num("skip");
  return c;
}

void wait_ready(const StepResult& r) {
#ifdef PIPELINE_HAVE_CUDA
  if (r.done) static_cast<at::cuda::CUDAEvent*>(r.done.get())->synchronize();
#else
  (void)r;
#endif
}

void wait_copy(const Batch& b) {
#ifdef PIPELINE_HAVE_CUDA
  if (b.ready) static_cast<at::cuda::CUDAEvent*>(b.ready.get())->synchronize();
#else
  (void)b;
#endif
}

RunLog::RunLog(std::filesystem::path run_dir) : dir_(std::move(run_dir)) {
  if (!dir_.empty()) {
    auto path = dir_ / "metrics.jsonl";
    metrics_ = std::fopen(path.c_str(), "a");
    if (!metrics_) throw std::runtime_error(path.string() + ": cannot open for appending");
  }
}

RunLog::~RunLog() {
  if (metrics_) std::fclose(metrics_);
}

void RunLog::print(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (printer_) {
    printer_(line);
  } else {
    std::cout << line << "\n" << std::flush;
  }
}

void RunLog::metric(const std::string& json) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!metrics_) return;
  std::fputs(json.c_str(), metrics_);
  std::fputc('\n', metrics_);
  std::fflush(metrics_);
}

void RunLog::set_printer(std::function<void(const std::string&)> p) {
  std::lock_guard<std::mutex> lock(mu_);
  printer_ = std::move(p);
}

std::pair<std::filesystem::path, std::string> source_dataset(const RunContext& rc, const config::Section& options) {
  const auto& dir = options.get_string("dataset");
  const auto& split = options.get_string("split");
  return {dir.empty() ? rc.cfg.data.dataset : std::filesystem::path(dir), split.empty() ? rc.cfg.data.train_split : split};
}

namespace {
std::mutex g_ctx_mu;
std::shared_ptr<RunContext> g_ctx;
}  // namespace

void set_run_context(std::shared_ptr<RunContext> ctx) {
  std::lock_guard<std::mutex> lock(g_ctx_mu);
  g_ctx = std::move(ctx);
}

std::shared_ptr<RunContext> run_context() {
  std::lock_guard<std::mutex> lock(g_ctx_mu);
  return g_ctx;
}

RunContext& require_run_context(const std::string& stage_name) {
  auto ctx = run_context();
  if (!ctx)
    throw std::runtime_error("stage '" + stage_name +
                             "' is a training stage: it runs inside `pipeline run`, which provides the model, "
                             "data and run directory");
  return *ctx;  // the context outlives the graph: `pipeline run` clears it after the engine is gone
}

}  // namespace pipeline::stages
