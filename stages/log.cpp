// log: turns step results into a progress line (step/total, loss, learning rate, tokens/s,
// MFU, ETA) and one metrics.jsonl line per step. MFU (PaLM's FLOPs a token, GPTConfig::
// flops_per_token) divides by [logging] peak_tflops, or the peak the table has for the GPU
// (model/device/device_peak.h); where there is none (the CPU, a GPU the table lacks) it is "—" in the
// progress line and absent from metrics.jsonl (so from TensorBoard, /metrics and the live page),
// and one line at start-up says how to set it: never a number divided by another GPU's peak. It waits for each step's event here,
// off the training thread and without spinning, so training never stalls on reading its loss;
// the wait counts as device wait in the stats, not as busy. With [training.guard] each line
// carries the step's verdict (z-scores, skips, rollbacks, the updates taken) and a skipped step
// gets a line of its own (stages/spike_watch.h). Once the event completed it reads
// the step's device timing events (no further sync) and reports train's GPU-busy time to the
// engine (host time on the CPU), which the stats and the verdict turn into train's GPU-busy share.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include "base/duration.h"
#include "base/json.h"
#include "graph/stage.h"
#include "model/device/cpu_advice.h"
#include "model/device/device_event.h"
#include "model/device/device_peak.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class Log : public graph::Stage {
 public:
  explicit Log(const graph::StageContext& ctx) : rc_(run_context(ctx)) {
    flops_per_token_ = rc_.model.flops_per_token(rc_.cfg.training.seq_len);
  }

  // Waiting on CUDA events is a CUDA call: on the run's device, or it makes a context on GPU 0.
  void initialize() override {
    model::use_device(rc_.device);
    peak_ = model::resolve_peak_flops(rc_.cfg.logging.peak_tflops, rc_.device.is_cuda(), model::device_name(rc_.device));
    rc_.log->print("log: " + model::describe_peak(peak_));
  }

  void process(graph::Item in, graph::Emitter& out) override {
    const auto& r = in.get<StepResult>();
    if (!r.loss.defined()) return;  // a checkpoint-only result (interrupted run)
    out.add_device_wait(wait_ready(r));  // the step's values (and timing events) are complete after this
    std::vector<std::pair<std::string, double>> phases;
    double busy_ms = 0;
    if (r.timing) {
      phases = r.timing->phase_ms();
      busy_ms = r.timing->total_ms();
      out.add_device_busy(r.timing->stage, std::chrono::nanoseconds(static_cast<int64_t>(busy_ms * 1e6)),
                          /*gpu=*/rc_.device.is_cuda());
    }
    auto now = std::chrono::steady_clock::now();
    const float loss = r.loss.item<float>();
    const float norm = r.grad_norm.item<float>();
    std::optional<model::SpikeVerdict> v;
    if (r.verdict.defined()) v = model::SpikeVerdict::from(r.verdict);
    const double lr = v ? v->lr : r.lr;
    const int64_t updates = v ? v->updates : r.updates >= 0 ? r.updates : r.step;
    if (!started_) {
      // The first step includes start-up (allocations, kernel selection): rates count from it.
      started_ = true;
      t0_ = now;
      first_step_ = r.step;
      last_ = now;
    } else if (r.timing) {
      busy_after_first_ms_ += busy_ms;
      train_name_ = r.timing->stage;
    }
    double dt = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    double elapsed = std::chrono::duration<double>(now - t0_).count();
    int64_t steps_timed = r.step - first_step_;
    timed_s_ = elapsed;
    double tok_s = steps_timed > 0 && elapsed > 0 ? static_cast<double>(steps_timed * r.tokens) / elapsed : 0;
    double ms_step = steps_timed > 0 ? 1000.0 * elapsed / static_cast<double>(steps_timed) : dt * 1000;
    // Per device: tokens/s counts every data-parallel rank's tokens, each rank has one device.
    // No peak, no MFU (NaN here, absent from the metrics line).
    const double mfu = peak_.tflops > 0 ? tok_s * flops_per_token_ / (peak_.tflops * 1e12 * rc_.partition.world) : NAN;
    // [training] steps counts updates: the data steps the run takes grow with the steps not trained.
    const int64_t total = rc_.cfg.training.steps + (r.step - updates);
    double eta = tok_s > 0 ? static_cast<double>((total - r.step) * r.tokens) / tok_s : NAN;

    char json[512];
    std::snprintf(json, sizeof json,
                  "{\"step\":%lld,\"loss\":%s,\"lr\":%.6e,\"grad_norm\":%s,\"tokens\":%lld,\"tokens_per_s\":%.1f,"
                  "\"ms_per_step\":%.3f,\"elapsed_s\":%.3f",
                  static_cast<long long>(r.step), json_number(loss, "%.9g").c_str(), lr, json_number(norm, "%.5f").c_str(),
                  static_cast<long long>(r.tokens), tok_s, ms_step, elapsed);
    std::string metric = json;
    // The hash of the step's set of rows (docs/data_order.md): two runs of one data order print the same.
    metric += ",\"windows\":\"" + windows_hex(step_windows(r)) + "\"";
    if (v || updates != r.step) metric += ",\"updates\":" + std::to_string(updates);
    if (v) {
      std::snprintf(json, sizeof json, ",\"loss_z\":%.4f,\"norm_z\":%.4f,\"guard_skips\":%lld,\"guard_rollbacks\":%lld%s",
                    finite_or_zero(v->loss_z), finite_or_zero(v->norm_z), static_cast<long long>(v->skips),
                    static_cast<long long>(r.rollbacks), v->skipped ? ",\"skipped\":1" : "");
      metric += json;
    }
    if (std::isfinite(mfu)) {
      std::snprintf(json, sizeof json, ",\"mfu\":%.5f", mfu);
      metric += json;
    }
    // Per phase: device milliseconds on CUDA ("gpu_ms"), host milliseconds on the CPU ("host_ms").
    if (!phases.empty()) {
      metric += rc_.device.is_cuda() ? ",\"gpu_ms\":{" : ",\"host_ms\":{";
      for (size_t i = 0; i < phases.size(); ++i) {
        std::snprintf(json, sizeof json, "%s\"%s\":%.3f", i ? "," : "", phases[i].first.c_str(), phases[i].second);
        metric += json;
      }
      metric += "}";
    }
    rc_.log->metric(metric + "}");
    if (v && v->skipped)
      rc_.log->print(skip_line(r.step, *v));
    else if (!std::isfinite(loss))
      rc_.log->print("warning: step " + std::to_string(r.step) + ": loss is not finite");

    if (r.step % rc_.cfg.logging.every == 0 || r.last || r.step == first_step_) {
      char line[512];
      int n = std::snprintf(line, sizeof line, "step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %9.0f tok/s | %7.1f ms/step",
                            static_cast<long long>(r.step), static_cast<long long>(total), loss, lr, norm, tok_s,
                            ms_step);
      std::string s(line, static_cast<size_t>(n));
      if (v && (v->skips > 0 || r.rollbacks > 0))
        s += " | guard: " + std::to_string(v->skips) + " skipped, " + std::to_string(r.rollbacks) + " rolled back";
      if (std::isfinite(mfu)) {
        std::snprintf(line, sizeof line, " | MFU %4.1f%%", 100 * mfu);
        s += line;
      } else {
        s += " | MFU \xE2\x80\x94";  // "—": no peak for this device (the start-up line says how to set one)
      }
      s += " | ETA " + duration_text(eta);
      rc_.log->print(s);
    }
    // A large model on the CPU: once the pace is known, how long the whole run takes.
    if (steps_timed == model::kEstimateAfterSteps && r.step < total && !rc_.device.is_cuda() &&
        model::large_for_cpu(rc_.model))
      rc_.log->print(model::cpu_estimate(elapsed / static_cast<double>(steps_timed), r.step, total));
  }

  static double finite_or_zero(double x) { return std::isfinite(x) ? x : 0.0; }

  // "guard: step 812 skipped: loss 10.93 at z 14.2, grad norm 2.31 at z 1.1; 2 in a row (5 roll back)"
  std::string skip_line(int64_t step, const model::SpikeVerdict& v) const {
    char buf[256];
    const bool finite = std::isfinite(v.loss) && std::isfinite(v.norm);
    std::snprintf(buf, sizeof buf, "guard: step %lld skipped: loss %.4g at z %.1f, grad norm %.4g at z %.1f%s; %lld in a row (%lld roll back)",
                  static_cast<long long>(step), static_cast<double>(v.loss), v.loss_z, static_cast<double>(v.norm), v.norm_z,
                  finite ? "" : " (not finite)", static_cast<long long>(v.streak),
                  static_cast<long long>(rc_.cfg.training.guard.max_skips));
    return buf;
  }

  // train's busy share between the first step and the last: on CUDA the GPU's (device events),
  // which tells a GPU-bound run from one whose GPU waits for launches or for input.
  void finalize(graph::Emitter&) override {
    if (train_name_.empty() || !(timed_s_ > 0)) return;
    // Capped: log sees a step a little after train finished it, so the span can come out short.
    const double share = std::min(1.0, busy_after_first_ms_ / 1000.0 / timed_s_);
    char line[256];
    if (rc_.device.is_cuda())
      std::snprintf(line, sizeof line, "%s: GPU busy %.0f%% in forward, backward and step (device events)%s", train_name_.c_str(),
                    100 * share, share < 0.9 ? "; the GPU idles the rest: launch-bound or waiting for input" : "");
    else
      std::snprintf(line, sizeof line, "%s: busy %.0f%% in forward, backward and step (host clock)", train_name_.c_str(),
                    100 * share);
    rc_.log->print(line);
  }

 private:
  RunContext& rc_;
  double flops_per_token_ = 0;
  model::PeakFlops peak_;  // what MFU divides by (tflops 0: none)
  double busy_after_first_ms_ = 0, timed_s_ = 0;  // since the first step completed
  std::string train_name_;
  bool started_ = false;
  int64_t first_step_ = 0;
  std::chrono::steady_clock::time_point t0_, last_;
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(log, {.name = "log",
                          .input = typeid(StepResult),
                          .factory = graph::make_factory<Log>()});

}  // namespace
}  // namespace pipeline::stages
