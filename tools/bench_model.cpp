// Benchmark of the model alone: forward + backward + clip + fused AdamW step in bf16 autocast on
// synthetic tokens, timed with device events. Prints ms/step, tokens/s, MFU and peak memory.
//
//   bench_model [--preset gpt2] [--batch 16] [--seq 1024] [--steps 20] [--warmup 5]
//               [--device cuda|cpu] [--peak-tflops 989]
// Without CUDA it falls back to the CPU (use a small preset there, e.g. --preset tiny).
#include "model/autocast.h"
#include "model/gpt2.h"
#include "model/optim.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace m = pipeline::model;

namespace {

struct Options {
  std::string preset = "gpt2";
  int64_t batch = 16;
  int64_t seq = 1024;
  int steps = 20;
  int warmup = 5;
  std::string device;  // empty: cuda when available
  double peak_tflops = 989.0;  // H100 SXM dense bf16
};

void usage() {
  std::printf(
      "usage: bench_model [--preset NAME] [--batch B] [--seq T] [--steps N] [--warmup N]\n"
      "                   [--device cuda|cpu] [--peak-tflops F]\n"
      "Times forward+backward+clip+AdamW of a GPT-2 preset in bf16 on synthetic tokens.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
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
    else throw std::invalid_argument("unknown option " + a + " (see --help)");
  }
  if (o.batch <= 0 || o.seq <= 0 || o.steps <= 0 || o.warmup < 0) {
    throw std::invalid_argument("--batch, --seq and --steps must be > 0, --warmup >= 0");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const bool cuda = o.device.empty() ? torch::cuda::is_available() : o.device == "cuda";
  if (cuda && !torch::cuda::is_available()) throw std::runtime_error("--device cuda but no CUDA device");
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);

  auto cfg = m::GPTConfig::preset(o.preset);
  if (o.seq > cfg.block_size) {
    throw std::invalid_argument("--seq " + std::to_string(o.seq) + " exceeds the preset's block_size " +
                                std::to_string(cfg.block_size));
  }
  m::GPT model(cfg, 1337);
  model->to(device);
  m::AdamW opt(model->named_parameters());
  auto params = model->parameters();
  auto tokens = torch::randint(cfg.vocab_size, {o.batch, o.seq + 1},
                               torch::TensorOptions().dtype(torch::kLong).device(device));
  auto x = tokens.narrow(1, 0, o.seq), y = tokens.narrow(1, 1, o.seq);  // (B, T)

  std::printf("bench_model: preset %s (%lld params), B=%lld T=%lld, bf16 autocast, %s\n", o.preset.c_str(),
              static_cast<long long>(cfg.num_parameters()), static_cast<long long>(o.batch),
              static_cast<long long>(o.seq), cuda ? "cuda" : "cpu");

  torch::Tensor loss;
  auto step = [&] {
    opt.zero_grad();
    {
      m::AutocastGuard autocast(device.type());
      loss = model->loss(model(x), y);
    }
    loss.backward();
    m::clip_grad_norm(params, 1.0);
    opt.step();
  };
  for (int i = 0; i < o.warmup; ++i) step();

  double ms = 0.0;
  if (cuda) {
    torch::cuda::synchronize();
    at::accelerator::resetPeakStats(device.index());
    c10::Event start(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event stop(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    start.record(at::accelerator::getCurrentStream(device.index()));
    for (int i = 0; i < o.steps; ++i) step();
    stop.record(at::accelerator::getCurrentStream(device.index()));
    stop.synchronize();
    ms = start.elapsedTime(stop) / o.steps;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.steps; ++i) step();
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / o.steps;
  }

  const double tokens_per_step = static_cast<double>(o.batch * o.seq);
  const double tok_s = tokens_per_step / (ms / 1e3);
  const double flops = cfg.flops_per_token(o.seq) * tok_s;
  std::printf("loss %.4f after %d steps\n", loss.item<float>(), o.warmup + o.steps);
  std::printf("%.2f ms/step  %.0f tokens/s  %.1f TFLOP/s", ms, tok_s, flops / 1e12);
  if (cuda) {
    const auto stats = at::accelerator::getDeviceStats(device.index());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    std::printf("  MFU %.1f%% (of %.0f TFLOP/s)  peak memory %.2f GiB", 100.0 * flops / (o.peak_tflops * 1e12),
                o.peak_tflops, static_cast<double>(stats.allocated_bytes[agg].peak) / (1 << 30));
  }
  std::printf("\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_model: %s\n", e.what());
  return 1;
}
