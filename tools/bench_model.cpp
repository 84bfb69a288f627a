// Benchmark of the model alone: forward + backward + clip + fused AdamW step on synthetic tokens,
// eager or replayed as CUDA graphs, timed with device events. Prints ms/step, tokens/s, MFU and
// peak memory, and a last line `result ...` of key=value pairs for scripts (tools/gpu_report.sh).
//
//   bench_model [--preset gpt2] [--batch 16] [--seq 1024] [--steps 20] [--warmup 5]
//               [--device cuda|cpu] [--dtype bf16|fp32] [--cuda-graph] [--peak-tflops F]
//               [--recompute none|mlp|block] [--fit-batch] [--sdpa auto|flash|cudnn|efficient|math]
//               [--profile TRACE.json [--profile-steps 3]] [--guard]
// Without CUDA it falls back to the CPU (use a small preset there, e.g. --preset tiny).
// MFU is PaLM's (6N + 12LCT FLOPs a token) over --peak-tflops, or the peak model/device/device_peak.h's
// table has for the GPU; with neither (the CPU, a GPU the table lacks) it is "—" (mfu=nan).
// Peak memory: the bytes tensors held at most over the timed steps: the caching allocator's peak
// on CUDA, and on the CPU the peak of a counting wrapper around the CPU allocator (tensors' bytes,
// not the process's resident set). Beside it, eager only: what the forward left held for
// backward (kept_gib: activations and logits, what --recompute changes) and the most forward
// and backward added to what the step began with (fwd_bwd_gib). On
// the CPU it also reports the process's CPU time per step, which a loaded machine moves less
// than the wall time.
// --sdpa: only that attention kernel (model/net/sdpa_choice.h), to compare them; auto: ATen's choice,
// what training takes.
// --fit-batch: --batch is the largest to try; on running out of GPU memory it halves the batch
// and tries again, and times the largest that ran (result batch=...).
// --profile records a few more steps after the timed ones with LibTorch's Kineto profiler (CPU
// ops and CUDA kernels) into a Chrome trace; tools/kernel_table.py sums it by kernel, beside the
// trace of tools/eager_step.py --profile (tools/gpu_report.sh profile).
// --guard: the spike guard judges every step (model/net/spike_guard.h), inside the update graph
// with --cuda-graph, and after the timing its own work is timed alone, as training issues it
// (device time on CUDA, host time on the CPU): `guard ... % of the step`, the figure whose goal
// is under 1% (docs/robustness.md#the-spike-guard).
#include "model/net/autocast.h"
#include "model/device/captured_step.h"
#include "model/device/cpu_block_cache.h"
#include "model/device/device_event.h"
#include "model/device/device_peak.h"
#include "model/net/gpt2.h"
#include "model/net/optim.h"
#include "model/net/sdpa_choice.h"
#include "model/net/spike_guard.h"

#include <sys/resource.h>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Event.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#ifdef PIPELINE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace m = pipeline::model;

namespace {

struct Options {
  std::string preset = "gpt2";
  int64_t batch = 16;
  int64_t seq = 1024;
  int steps = 20;
  int warmup = 5;
  std::string device;  // empty: cuda when available
  std::string dtype = "bf16";  // autocast dtype of the forward pass
  bool cuda_graph = false;     // replay the step as CUDA graphs (model/device/captured_step.h)
  std::string matmul_precision = "high";
  double peak_tflops = 0;      // 0: the peak table's figure for the GPU (model/device/device_peak.h)
  std::string recompute = "none";
  std::string sdpa = "auto";   // the attention kernel SDPA may take (auto: ATen's choice)
  bool fit_batch = false;      // halve --batch until a step fits the GPU's memory
  std::string profile;         // Chrome trace of a few steps after the timed ones
  int profile_steps = 3;
  bool guard = false;          // the spike guard judges each step, and is timed alone after
};

void usage() {
  std::printf(
      "usage: bench_model [--preset NAME] [--batch B] [--seq T] [--steps N] [--warmup N]\n"
      "                   [--device cuda|cpu] [--dtype bf16|fp32] [--cuda-graph]\n"
      "                   [--matmul-precision high|highest|medium] [--peak-tflops F]\n"
      "                   [--recompute none|mlp|block] [--fit-batch] [--sdpa auto|flash|cudnn|efficient|math]\n"
      "                   [--profile TRACE.json] [--profile-steps N] [--guard]\n"
      "Times forward+backward+clip+AdamW of a GPT-2 preset on synthetic tokens, eager or as CUDA graphs.\n"
      "--peak-tflops: what MFU divides by (default: the GPU's from the built-in table; none: MFU is \"-\").\n"
      "--fit-batch: halve --batch until a step fits in GPU memory, then time that batch.\n"
      "--guard: with the spike guard judging each step; its own work is then timed alone (share of the step).\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    }
    if (a == "--cuda-graph") {
      o.cuda_graph = true;
      continue;
    }
    if (a == "--guard") {
      o.guard = true;
      continue;
    }
    if (a == "--fit-batch") {
      o.fit_batch = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("option " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--preset") o.preset = v;
    else if (a == "--batch") o.batch = std::stoll(v);
    else if (a == "--seq") o.seq = std::stoll(v);
    else if (a == "--steps") o.steps = std::stoi(v);
    else if (a == "--warmup") o.warmup = std::stoi(v);
    else if (a == "--device") o.device = v;
    else if (a == "--peak-tflops") o.peak_tflops = std::stod(v);
    else if (a == "--dtype") o.dtype = v;
    else if (a == "--matmul-precision") o.matmul_precision = v;
    else if (a == "--recompute") o.recompute = v;
    else if (a == "--sdpa") o.sdpa = v;
    else if (a == "--profile") o.profile = v;
    else if (a == "--profile-steps") o.profile_steps = std::stoi(v);
    else throw std::invalid_argument("unknown option " + a + " (see --help)");
  }
  if (o.profile_steps <= 0) throw std::invalid_argument("--profile-steps must be > 0");
  if (o.batch <= 0 || o.seq <= 0 || o.steps <= 0 || o.warmup < 0) {
    throw std::invalid_argument("--batch, --seq and --steps must be > 0, --warmup >= 0");
  }
  if (o.dtype != "bf16" && o.dtype != "fp32") throw std::invalid_argument("--dtype: expected bf16 or fp32, got " + o.dtype);
  pipeline::model::parse_recompute(o.recompute);  // an unknown name is an error here
  if (o.cuda_graph && o.warmup < 4)
    throw std::invalid_argument("--cuda-graph needs --warmup >= 4 (3 eager steps, then the capture, before timing)");
  return o;
}

}  // namespace

namespace {

// The process's CPU time so far (user and system), in seconds.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The CPU allocator's bytes in use and their peak while it is installed: the CPU's counterpart
// of the CUDA caching allocator's peak. It hands out the base allocator's memory, with a context
// that remembers the size; the release function is static (a DataPtr's deleter takes only the
// context), hence the one instance it reports to.
class PeakCpuAllocator final : public c10::Allocator {
 public:
  PeakCpuAllocator() : base_(c10::GetCPUAllocator()) {
    instance_ = this;
    c10::SetCPUAllocator(this, /*priority=*/100);
  }
  ~PeakCpuAllocator() override {
    c10::SetCPUAllocator(base_, /*priority=*/100);
    instance_ = nullptr;
  }
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    auto* held = new Held{std::move(inner), n};
    const int64_t now = now_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    for (int64_t p = peak_.load(); now > p && !peak_.compare_exchange_weak(p, now);) {
    }
    return c10::DataPtr(data, held, &release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }  // DataPtrs only
  void copy_data(void* dest, const void* src, std::size_t n) const override { base_->copy_data(dest, src, n); }
  void reset_peak() { peak_.store(now_.load()); }
  int64_t peak() const { return peak_.load(); }
  int64_t now() const { return now_.load(); }

 private:
  struct Held {
    c10::DataPtr inner;
    size_t n;
  };
  static void release(void* p) {
    auto* held = static_cast<Held*>(p);
    if (instance_) instance_->now_.fetch_sub(static_cast<int64_t>(held->n));
    delete held;
  }
  static inline PeakCpuAllocator* instance_ = nullptr;
  c10::Allocator* base_;
  std::atomic<int64_t> now_{0}, peak_{0};
};

}  // namespace

int main(int argc, char** argv) try {
  Options o = parse(argc, argv);
  const bool cuda = o.device.empty() ? torch::cuda::is_available() : o.device == "cuda";
  if (cuda && !torch::cuda::is_available()) throw std::runtime_error("--device cuda but no CUDA device");
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  m::install_cpu_block_cache();  // as `pipeline` does (PIPELINE_CPU_ALLOC=glibc leaves it out)
  std::optional<PeakCpuAllocator> cpu_memory;  // every CPU tensor from here on is counted
  if (!cuda) cpu_memory.emplace();

  auto cfg = m::GPTConfig::preset(o.preset);
  if (o.seq > cfg.block_size) {
    throw std::invalid_argument("--seq " + std::to_string(o.seq) + " exceeds the preset's block_size " +
                                std::to_string(cfg.block_size));
  }
  if (o.cuda_graph && !cuda) throw std::invalid_argument("--cuda-graph needs CUDA");
  if (o.fit_batch && (!cuda || o.cuda_graph)) throw std::invalid_argument("--fit-batch needs CUDA and no --cuda-graph");
#ifdef PIPELINE_HAVE_CUDA
  if (cuda) {
    // Graph capture needs a stream other than the legacy default one; eager runs on it too.
    c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index()));
    at::globalContext().setFloat32MatmulPrecision(o.matmul_precision);
  }
#endif
  const m::SdpaChoice sdpa(o.sdpa);  // for the whole run (ATen's switches are process-wide)
  m::GPT model(cfg, 1337);
  model->to(device);
  model->set_recompute(m::parse_recompute(o.recompute));
  m::AdamW opt(model->named_parameters());
  auto params = model->parameters();
  // The schedule is the guard's table only: its size, not its values, is what costs.
  std::optional<m::SpikeGuard> guard;
  if (o.guard) guard.emplace(m::SpikeGuardOptions{}, m::LrSchedule{}, 100000, device);
  const bool autocast = o.dtype == "bf16";
  const auto peak = m::resolve_peak_flops(o.peak_tflops, cuda, m::device_name(device));
  const auto compute_dtype = autocast && cuda ? torch::kBFloat16 : torch::kFloat;
  const auto loss_path = model->loss_path(device, compute_dtype);
  const auto attention = model->attention_backend(o.seq, compute_dtype, device);

  // B rows of T+1 tokens, as the training graph feeds them: x = rows[:, :T], y = rows[:, 1:].
  torch::Tensor rows, x, y;
  auto make_batch = [&] {
    rows = torch::randint(cfg.vocab_size, {o.batch, o.seq + 1}, torch::TensorOptions().dtype(torch::kLong).device(device));
    x = rows.narrow(1, 0, o.seq).contiguous();  // (B, T)
    y = rows.narrow(1, 1, o.seq).contiguous();  // (B, T)
  };
  make_batch();

  const auto mode = std::string(o.cuda_graph ? "cuda_graph" : "eager");
  torch::Tensor loss;
  std::unique_ptr<m::CapturedStep> graphs;
  int steps_done = 0;
  // Bytes tensors hold now and at most since the last reset: the CUDA caching allocator's
  // counters (host-side, no sync) or the CPU allocator's wrapper.
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  auto memory = [&](bool peak) -> int64_t {
    if (!cuda) return peak ? cpu_memory->peak() : cpu_memory->now();
    const auto stats = at::accelerator::getDeviceStats(device.index());
    return peak ? stats.allocated_bytes[agg].peak : stats.allocated_bytes[agg].current;
  };
  auto reset_peak = [&] {
    if (cuda) at::accelerator::resetPeakStats(device.index());
    else cpu_memory->reset_peak();
  };
  // Per eager step: the most held at once (the step's peak), what the forward left held for
  // backward (activations and logits: what recompute changes), and the most forward and
  // backward added to what the step began with (that, and the gradients as they fill). The
  // optimizer's own peak, or the gradients of a small batch, can hide the first in the others.
  int64_t step_peak = 0, fwd_bwd_peak = 0, kept = 0;
  auto step = [&] {
    if (graphs) {
      graphs->micro_batch(rows, 0);
      loss = graphs->update(1e-4).first;
    } else {
      opt.zero_grad();
      reset_peak();
      const int64_t before = memory(false);
      {
        m::AutocastGuard guard(device.type(), autocast);
        loss = model->loss(model(x), y);
      }
      kept = std::max(kept, memory(false) - before);
      loss.backward();
      fwd_bwd_peak = std::max(fwd_bwd_peak, memory(true) - before);
      auto norm = m::clip_grad_norm(params, 1.0);
      if (guard)
        opt.step(guard->judge(loss, norm, opt));
      else
        opt.step();
      step_peak = std::max(step_peak, memory(true));
    }
    // After 3 eager steps, the graphs (captured by their first use, still in the warm-up).
    if (o.cuda_graph && !graphs && ++steps_done == 3) {
      opt.zero_grad();
      graphs = std::make_unique<m::CapturedStep>(
          model, opt, m::CapturedStepOptions{o.batch, o.seq, 1, 1.0, autocast, guard ? &*guard : nullptr});
    }
  };
  // --fit-batch: the first step at each batch size is the trial; out of memory, half the batch.
  for (;;) {
    try {
      step();
      if (cuda) torch::cuda::synchronize();
      break;
    } catch (const c10::OutOfMemoryError&) {
      if (!o.fit_batch || o.batch == 1) throw;
      std::printf("bench_model: B=%lld does not fit in GPU memory; trying B=%lld\n", static_cast<long long>(o.batch),
                  static_cast<long long>(o.batch / 2));
      o.batch /= 2;
      loss = torch::Tensor();
      rows = x = y = torch::Tensor();
      opt.zero_grad();
#ifdef PIPELINE_HAVE_CUDA
      c10::cuda::CUDACachingAllocator::emptyCache();
#endif
      make_batch();
    }
  }
  std::printf("bench_model: preset %s (%lld params), B=%lld T=%lld, %s, %s, %s, recompute %s, attention %s, loss %s\n",
              o.preset.c_str(), static_cast<long long>(cfg.num_parameters()), static_cast<long long>(o.batch),
              static_cast<long long>(o.seq), autocast ? "bf16 autocast" : "fp32", mode.c_str(), cuda ? "cuda" : "cpu",
              o.recompute.c_str(), attention.c_str(), loss_path.why.c_str());
  for (int i = 1; i < o.warmup; ++i) step();

  double ms = 0.0, cpu_ms = 0.0;
  step_peak = fwd_bwd_peak = kept = 0;  // over the timed steps
  reset_peak();
  if (cuda) {
    auto stream = at::accelerator::getCurrentStream(device.index());
    torch::cuda::synchronize();
    reset_peak();
    c10::Event start(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event stop(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    start.record(stream);
    for (int i = 0; i < o.steps; ++i) step();
    stop.record(stream);
    stop.synchronize();
    ms = start.elapsedTime(stop) / o.steps;
  } else {
    const double c0 = process_cpu_s();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.steps; ++i) step();
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / o.steps;
    cpu_ms = 1000.0 * (process_cpu_s() - c0) / o.steps;
  }
  if (graphs) step_peak = memory(true);  // replays: the graphs' pool, no per-phase figure
  // The guard alone: what judge() adds to a step, issued as training issues it (eagerly; inside a
  // graph it is the same kernels without their launches). The fused AdamW costs the same with a
  // found_inf as without.
  double guard_ms = NAN;
  if (guard) {
    const int calls = 200;
    auto l = loss.detach().clone(), n = torch::ones({}, loss.options().dtype(torch::kFloat));
    if (cuda) {
      auto stream = at::accelerator::getCurrentStream(device.index());
      c10::Event start(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      c10::Event stop(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      torch::cuda::synchronize();
      start.record(stream);
      for (int i = 0; i < calls; ++i) guard->judge(l, n, opt);
      stop.record(stream);
      stop.synchronize();
      guard_ms = start.elapsedTime(stop) / calls;
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) guard->judge(l, n, opt);
      guard_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / calls;
    }
  }
  const double peak_gib = static_cast<double>(step_peak) / (1 << 30);
  const double fwd_bwd_gib = static_cast<double>(fwd_bwd_peak) / (1 << 30);
  const double kept_gib = static_cast<double>(kept) / (1 << 30);

  const double tokens_per_step = static_cast<double>(o.batch * o.seq);
  const double tok_s = tokens_per_step / (ms / 1e3);
  const double flops = cfg.flops_per_token(o.seq) * tok_s;
  const double mfu = peak.tflops > 0 ? flops / (peak.tflops * 1e12) : NAN;
  std::printf("loss %.4f after %d steps\n", loss.item<float>(), o.warmup + o.steps);
  std::printf("%.2f ms/step  %.0f tokens/s  %.1f TFLOP/s (PaLM: 6N + 12LCT)", ms, tok_s, flops / 1e12);
  if (std::isfinite(mfu))
    std::printf("  MFU %.1f%% (of %g TFLOP/s, %s)", 100.0 * mfu, peak.tflops, peak.source.c_str());
  else
    std::printf("  MFU \xE2\x80\x94 (%s: --peak-tflops F sets it)", peak.source.c_str());
  std::printf("  peak memory %.3f GiB (forward kept %.3f GiB for backward; with backward's, %.3f GiB at most)",
              peak_gib, kept_gib, fwd_bwd_gib);
  if (!cuda) std::printf("  CPU %.1f ms/step", cpu_ms);
  std::printf("\n");
  if (guard)
    std::printf("guard %.4f ms a step (%s), %.3f%% of the step\n", guard_ms, cuda ? "device time" : "host time",
                100.0 * guard_ms / ms);
  if (!o.profile.empty()) {
    // After the timing, so the profiler's own cost never enters ms/step.
    namespace prof = torch::autograd::profiler;
    namespace impl = torch::profiler::impl;
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
    if (cuda) activities.insert(impl::ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    for (int i = 0; i < o.profile_steps; ++i) step();
    if (cuda) torch::cuda::synchronize();
    prof::disableProfiler()->save(o.profile);
    std::printf("profile of %d steps: %s\n", o.profile_steps, o.profile.c_str());
  }
  if (!cuda) {
    const auto c = m::cpu_block_cache_stats();
    if (c.requests > 0)
      std::printf("CPU block cache: %llu requests of 1 MiB or more, %llu served by a kept block, %llu mapped, %llu "
                  "unmapped past the bound; peak in use %.3f GiB, kept now %.3f GiB\n",
                  static_cast<unsigned long long>(c.requests), static_cast<unsigned long long>(c.reused),
                  static_cast<unsigned long long>(c.mapped), static_cast<unsigned long long>(c.unmapped),
                  static_cast<double>(c.peak_in_use_bytes) / double(1 << 30), static_cast<double>(c.kept_bytes) / double(1 << 30));
  }
  std::printf(
      "result mode=%s ms_per_step=%.3f tokens_per_s=%.0f mfu=%.4f peak_gib=%.3f batch=%lld recompute=%s loss=%s "
      "peak_tflops=%g cpu_ms_per_step=%.3f kept_gib=%.3f fwd_bwd_gib=%.3f attention=%s guard_ms=%.4f\n",
      mode.c_str(), ms, tok_s, mfu, peak_gib, static_cast<long long>(o.batch), o.recompute.c_str(),
      loss_path.fused ? "fused" : "chunked", peak.tflops, cpu_ms, kept_gib, fwd_bwd_gib, attention.c_str(), guard_ms);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_model: %s\n", e.what());
  return 1;
}
