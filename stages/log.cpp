// log: turns step results into a progress line (step/total, loss, learning rate, tokens/s,
// MFU on CUDA, ETA) and one metrics.jsonl line per step. It waits for each step's event here,
// off the training thread, so training never stalls on reading its loss.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "graph/stage.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  auto t = static_cast<long>(s + 0.5);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

class Log : public graph::Stage {
 public:
  explicit Log(const graph::StageContext& ctx) : rc_(require_run_context(ctx.name)) {
    flops_per_token_ = rc_.model.flops_per_token(rc_.cfg.training.seq_len);
  }

  void process(graph::Item in, graph::Emitter&) override {
    const auto& r = in.get<StepResult>();
    if (!r.loss.defined()) return;  // a checkpoint-only result (interrupted run)
    wait_ready(r);                  // the step's values are on the host after this
    auto now = std::chrono::steady_clock::now();
    const float loss = r.loss.item<float>();
    const float norm = r.grad_norm.item<float>();
    if (!started_) {
      // The first step includes start-up (allocations, kernel selection): rates count from it.
      started_ = true;
      t0_ = now;
      first_step_ = r.step;
      last_ = now;
    }
    double dt = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    double elapsed = std::chrono::duration<double>(now - t0_).count();
    int64_t steps_timed = r.step - first_step_;
    double tok_s = steps_timed > 0 && elapsed > 0 ? static_cast<double>(steps_timed * r.tokens) / elapsed : 0;
    double ms_step = steps_timed > 0 ? 1000.0 * elapsed / static_cast<double>(steps_timed) : dt * 1000;
    // Per device: tokens/s counts every data-parallel rank's tokens, each rank has one device.
    double mfu = rc_.device.is_cuda()
                     ? tok_s * flops_per_token_ / (rc_.cfg.logging.peak_tflops * 1e12 * rc_.partition.world)
                     : 0;
    const int64_t total = rc_.cfg.training.steps;
    double eta = tok_s > 0 ? static_cast<double>((total - r.step) * r.tokens) / tok_s : NAN;

    char json[512];
    std::snprintf(json, sizeof json,
                  "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.6e,\"grad_norm\":%.5f,\"tokens\":%lld,\"tokens_per_s\":%.1f,"
                  "\"ms_per_step\":%.3f,\"mfu\":%.5f,\"elapsed_s\":%.3f}",
                  static_cast<long long>(r.step), loss, r.lr, norm, static_cast<long long>(r.tokens), tok_s, ms_step,
                  mfu, elapsed);
    rc_.log->metric(json);
    if (!std::isfinite(loss)) rc_.log->print("warning: step " + std::to_string(r.step) + ": loss is not finite");

    if (r.step % rc_.cfg.logging.every == 0 || r.last || r.step == first_step_) {
      char line[512];
      int n = std::snprintf(line, sizeof line, "step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %9.0f tok/s | %7.1f ms/step",
                            static_cast<long long>(r.step), static_cast<long long>(total), loss, r.lr, norm, tok_s,
                            ms_step);
      std::string s(line, static_cast<size_t>(n));
      if (rc_.device.is_cuda()) {
        std::snprintf(line, sizeof line, " | MFU %4.1f%%", 100 * mfu);
        s += line;
      }
      s += " | ETA " + format_duration(eta);
      rc_.log->print(s);
    }
  }

 private:
  RunContext& rc_;
  double flops_per_token_ = 0;
  bool started_ = false;
  int64_t first_step_ = 0;
  std::chrono::steady_clock::time_point t0_, last_;
};

PIPELINE_STAGE(log, {.name = "log",
                     .doc = "progress line and metrics.jsonl from step results; waits on their events off the train thread",
                     .input = graph::port<StepResult>("step"),
                     .output = graph::no_port(),
                     .own_thread = true,
                     .ordered = true,
                     .max_workers = 1,
                     .factory = graph::make_factory<Log>()});

}  // namespace
}  // namespace pipeline::stages
