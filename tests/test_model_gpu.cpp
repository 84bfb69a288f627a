// model/ on CUDA: fused AdamW against the CPU, bf16 autocast, clipping and the optimizer step
// without host syncs, a bf16 train step of tiny, a non-blocking checkpoint snapshot, the
// snapshot pool under a concurrent step, CUDA graphs against eager, the attention kernel SDPA
// takes in bf16, KV-cache sampling. Exits 77 (CTest: skipped) where CUDA is absent.
#include "model/net/autocast.h"
#include "model/device/device_event.h"
#include "model/device/captured_step.h"
#include "model/checkpoint/checkpoint.h"
#include "model/eval/generate.h"
#include "model/net/gpt2.h"
#include "model/net/optim.h"
#include "model/checkpoint/snapshot.h"
#include "model/net/spike_guard.h"

#include <ATen/core/CachingHostAllocator.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <unistd.h>

#if defined(PIPELINE_HAVE_CUDA) && __has_include(<cuda_runtime_api.h>)
#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#define PIPELINE_HAVE_SYNC_DEBUG 1
#endif

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

namespace m = pipeline::model;

namespace {

// Decided before main so that no test (whatever doctest filter is given) touches CUDA without it.
const bool kCudaPresent = [] {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "test_model_gpu: no CUDA device, skipped\n");
    std::exit(77);
  }
  return true;
}();

const torch::Device kCuda(torch::kCUDA, 0);

double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  auto af = a.to(torch::kCPU, torch::kDouble), bf = b.to(torch::kCPU, torch::kDouble);
  const double denom = bf.abs().max().item<double>();
  return (af - bf).abs().max().item<double>() / (denom > 0 ? denom : 1.0);
}

m::GPTConfig tiny(int64_t vocab = 50257) { return m::GPTConfig::preset("tiny").with_vocab(vocab); }

// Raises on any host sync inside its scope (torch.cuda.set_sync_debug_mode("error")).
struct NoSyncScope {
#ifdef PIPELINE_HAVE_SYNC_DEBUG
  NoSyncScope() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR); }
  ~NoSyncScope() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED); }
#endif
};

}  // namespace

TEST_CASE("fused AdamW on CUDA follows the CPU steps") {
  REQUIRE(kCudaPresent);
  auto cfg = tiny(128);
  m::GPT cpu(cfg, 3), gpu(cfg, 3);
  gpu->to(kCuda);
  m::AdamW cpu_opt(cpu->named_parameters(), m::AdamWOptions{.lr = 1e-3});
  m::AdamW gpu_opt(gpu->named_parameters(), m::AdamWOptions{.lr = 1e-3});
  auto x = torch::randint(cfg.vocab_size, {4, 32}, torch::kLong);
  auto y = torch::randint(cfg.vocab_size, {4, 32}, torch::kLong);
  auto xg = x.to(kCuda), yg = y.to(kCuda);
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    auto lc = cpu->loss(cpu(x), y);
    auto lg = gpu->loss(gpu(xg), yg);
    lc.backward();
    lg.backward();
    auto nc = m::clip_grad_norm(cpu->parameters(), 1.0);
    auto ng = m::clip_grad_norm(gpu->parameters(), 1.0);
    CHECK(ng.is_cuda());
    CHECK(rel_err(ng, nc) < 1e-4);
    CHECK(std::abs(lg.item<double>() - lc.item<double>()) < 1e-4);
    // The optimizers step on the same gradients, the CPU's: the two backward passes differ by
    // rounding (TF32 matmuls on the GPU), and Adam's first steps magnify that wherever a gradient
    // is near zero (|g| ~ eps, where g / (|g| + eps) is steep), which is not what is tested here.
    auto pc = cpu->named_parameters();
    {
      torch::NoGradGuard no_grad;
      for (const auto& item : gpu->named_parameters()) item.value().grad().copy_(pc[item.key()].grad());
    }
    cpu_opt.set_lr(1e-3 / (i + 1));
    gpu_opt.set_lr(1e-3 / (i + 1));
    cpu_opt.step();
    gpu_opt.step();
    for (const auto& item : gpu->named_parameters()) {
      CAPTURE(item.key());
      CHECK(rel_err(item.value(), pc[item.key()]) < 1e-5);
    }
  }
}

// The fused kernels (PIPELINE_HAVE_CUDA_LOSS) against the chunked ATen path on the same logits
// (a positive chunk_rows keeps that path on CUDA): loss, gradient, the padded columns, an
// incoming gradient other than 1, no grad mode, and no host sync. Shapes cover the 16-byte
// path with a tail (bf16, rows 16-byte aligned), the element path (fp32 rows of 130), and
// GPT-2's own vocabulary.
TEST_CASE("the cross-entropy on CUDA matches the chunked loss and its gradient") {
  if (!m::fused_cross_entropy_built()) MESSAGE("built without nvcc: both sides are the chunked ATen path");
  struct Shape {
    torch::ScalarType dtype;
    int64_t rows, vocab, padded;
  };
  for (const Shape& sh : {Shape{torch::kBFloat16, 37, 131, 136}, Shape{torch::kFloat, 29, 127, 130},
                          Shape{torch::kBFloat16, 64, 50257, 50304}, Shape{torch::kFloat, 16, 50257, 50304}}) {
    CAPTURE(sh.rows);
    CAPTURE(sh.vocab);
    CAPTURE(sh.padded);
    auto opts = torch::TensorOptions().device(kCuda);
    auto base = (torch::randn({sh.rows, sh.padded}, opts) * 3.0).to(sh.dtype);
    auto targets = torch::randint(sh.vocab, {sh.rows}, opts.dtype(torch::kLong));
    targets[0] = 0;
    targets[sh.rows - 1] = sh.vocab - 1;
    auto run = [&](int64_t chunk_rows, double scale) {
      auto logits = base.clone().requires_grad_(true);
      auto loss = m::cross_entropy_real_vocab(logits, targets, sh.vocab, chunk_rows);
      (loss * scale).backward();
      return std::make_pair(loss.detach(), logits.grad());
    };
    const double scale = 3.5;
    torch::Tensor fused_loss, fused_grad;
    {
      NoSyncScope no_sync;
      std::tie(fused_loss, fused_grad) = run(0, scale);
    }
    auto [ref_loss, ref_grad] = run(8, scale);
    CHECK((fused_loss.scalar_type() == torch::kFloat));
    CHECK(std::isfinite(fused_loss.item<double>()));
    CHECK(std::abs(fused_loss.item<double>() - ref_loss.item<double>()) < 1e-4 * std::abs(ref_loss.item<double>()));
    CHECK((fused_grad.scalar_type() == sh.dtype));
    CHECK(rel_err(fused_grad, ref_grad) < (sh.dtype == torch::kBFloat16 ? 1e-2 : 1e-5));
    CHECK(fused_grad.narrow(1, sh.vocab, sh.padded - sh.vocab).abs().max().item<double>() == 0.0);
    // Each row's gradient sums to 0 over the real vocabulary (softmax sums to 1, minus onehot).
    const double row_sum = fused_grad.to(torch::kDouble).sum(1).abs().max().item<double>();
    CHECK(row_sum < (sh.dtype == torch::kBFloat16 ? 2e-2 : 1e-6) * scale / static_cast<double>(sh.rows));
    torch::NoGradGuard no_grad;
    CHECK(std::abs(m::cross_entropy_real_vocab(base, targets, sh.vocab).item<double>() - ref_loss.item<double>()) <
          1e-4 * std::abs(ref_loss.item<double>()));
  }
}

TEST_CASE("the cross-entropy on CUDA: a strided view of the logits, and ids outside the vocabulary ignored") {
  auto opts = torch::TensorOptions().device(kCuda);
  auto wide = torch::randn({12, 100}, opts);
  auto view = wide.narrow(1, 0, 72);  // rows 100 apart, 72 columns, 70 of them real
  auto targets = torch::randint(70, {12}, opts.dtype(torch::kLong));
  CHECK(std::abs(m::cross_entropy_real_vocab(view, targets, 70).item<double>() -
                 m::cross_entropy_real_vocab(view, targets, 70, 4).item<double>()) < 1e-5);
  // Not real ids (a padded column, past the padding, -100): ignored, as PyTorch's ignore_index,
  // on both paths alike: the same loss over the other rows, no gradient in theirs.
  targets[3] = 70;
  targets[5] = 1000;
  targets[8] = -100;
  auto run = [&](int64_t chunk_rows) {
    auto logits = view.detach().clone().requires_grad_(true);
    auto loss = m::cross_entropy_real_vocab(logits, targets, 70, chunk_rows);
    (loss * 2.0).backward();
    return std::make_pair(loss.item<double>(), logits.grad());
  };
  auto [fused, fused_grad] = run(0);
  auto [chunked, chunked_grad] = run(4);
  CHECK(std::isfinite(fused));
  CHECK(std::abs(fused - chunked) < 1e-5 * std::abs(chunked));
  CHECK(rel_err(fused_grad, chunked_grad) < 1e-5);
  for (int r : {3, 5, 8}) CHECK(fused_grad[r].abs().max().item<double>() == 0.0);
}

TEST_CASE("the cross-entropy on CUDA propagates NaN forward and backward, as the chunked path does") {
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    // Rows of GPT-2's width (16-byte packs) and odd ones (the scalar tail); the NaN in the target's
    // column, in a pack whose other values are -inf (the merge that returned early), or alone.
    for (const int64_t vocab : {int64_t{50257}, int64_t{131}}) {
      CAPTURE(dtype);
      CAPTURE(vocab);
      const int64_t rows = 6, padded = (vocab + 63) / 64 * 64;
      auto opts = torch::TensorOptions().device(kCuda);
      auto base = torch::randn({rows, padded}, opts);
      auto targets = torch::randint(vocab, {rows}, opts.dtype(torch::kLong));
      base[1][targets[1].item<int64_t>()] = std::numeric_limits<float>::quiet_NaN();
      base[2].narrow(0, 0, 16).fill_(-std::numeric_limits<float>::infinity());
      base[2][3] = std::numeric_limits<float>::quiet_NaN();
      base[4][vocab - 1] = std::numeric_limits<float>::quiet_NaN();
      auto run = [&](int64_t chunk_rows) {
        auto logits = base.to(dtype).requires_grad_(true);
        auto loss = m::cross_entropy_real_vocab(logits, targets, vocab, chunk_rows);
        loss.backward();
        return std::make_pair(loss.item<double>(), logits.grad().to(torch::kFloat).narrow(1, 0, vocab));
      };
      for (const int64_t chunk_rows : {int64_t{0}, int64_t{2}}) {  // fused (where built), chunked
        CAPTURE(chunk_rows);
        auto [loss, grad] = run(chunk_rows);
        CHECK(std::isnan(loss));
        for (int r : {1, 2, 4}) CHECK(torch::isnan(grad[r]).all().item<bool>());
        for (int r : {0, 3, 5}) CHECK(torch::isfinite(grad[r]).all().item<bool>());
      }
    }
  }
}

#ifdef PIPELINE_HAVE_SYNC_DEBUG  // the CUDA runtime's headers are here
TEST_CASE("a CUDA error an earlier call left pending is neither consumed nor blamed on the loss") {
  if (!m::fused_cross_entropy_built()) return;
  auto opts = torch::TensorOptions().device(kCuda);
  auto logits = torch::randn({8, 64}, opts).requires_grad_(true);
  auto targets = torch::randint(50, {8}, opts.dtype(torch::kLong));
  m::cross_entropy_real_vocab(logits, targets, 50).item<float>();  // loaded and warm
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(cudaSetDevice(count + 7) == cudaErrorInvalidDevice);  // leaves that error pending
  REQUIRE(cudaPeekAtLastError() == cudaErrorInvalidDevice);
  auto loss = m::cross_entropy_real_vocab(logits, targets, 50);  // launches fine: no throw
  loss.backward();
  CHECK(std::isfinite(loss.item<float>()));
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);  // still there for its owner
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}
#endif

TEST_CASE("the fused loss has an image for this GPU, and the model says which loss runs") {
  m::GPT model(tiny(), 1);
  model->to(kCuda);
  const auto path = model->loss_path(kCuda, torch::kBFloat16);
  CHECK(path.fused == m::fused_cross_entropy_built());
  CHECK(m::cross_entropy_path(kCuda, torch::kBFloat16).fused == path.fused);
  CHECK_FALSE(model->loss_path(kCuda, torch::kHalf).fused);  // fp16 logits: the chunked path
  CHECK_FALSE(m::cross_entropy_path(kCuda, torch::kBFloat16, 4096).fused);
  CHECK_FALSE(model->loss_path(torch::kCPU, torch::kFloat).fused);
}

TEST_CASE("recompute mlp and block on CUDA under bf16 autocast: the losses and gradients of none") {
  auto cfg = m::GPTConfig::preset("small-cpu");
  auto x = torch::randint(cfg.vocab_size, {4, 128}, torch::TensorOptions().dtype(torch::kLong).device(kCuda));
  auto y = torch::randint(cfg.vocab_size, {4, 128}, torch::TensorOptions().dtype(torch::kLong).device(kCuda));
  std::map<std::string, torch::Tensor> reference;
  double reference_loss = 0;
  for (const auto mode : {m::Recompute::none, m::Recompute::mlp, m::Recompute::block}) {
    CAPTURE(m::recompute_name(mode));
    m::GPT model(cfg, 5);
    model->to(kCuda);
    model->set_recompute(mode);
    torch::Tensor loss;
    {
      m::AutocastGuard autocast(torch::kCUDA);
      loss = model->loss(model(x), y);
    }
    loss.backward();
    if (mode == m::Recompute::none) {
      reference_loss = loss.item<double>();
      for (const auto& p : model->named_parameters()) reference[p.key()] = p.value().grad().clone();
      continue;
    }
    // The same kernels on the same bf16 inputs: equal but for the order of a few reductions.
    CHECK(std::abs(loss.item<double>() - reference_loss) < 1e-4);
    for (const auto& p : model->named_parameters()) {
      CAPTURE(p.key());
      CHECK(rel_err(p.value().grad(), reference[p.key()]) < 2e-2);
    }
  }
}

TEST_CASE("bf16 autocast forward on CUDA") {
  auto cfg = tiny(512);
  m::GPT model(cfg, 4);
  model->to(kCuda);
  torch::NoGradGuard no_grad;
  auto x = torch::randint(cfg.vocab_size, {4, 64}, torch::TensorOptions().dtype(torch::kLong).device(kCuda));
  auto ref = model(x);
  torch::Tensor low;
  {
    m::AutocastGuard autocast(torch::kCUDA);
    CHECK((at::autocast::get_autocast_dtype(torch::kCUDA) == torch::kBFloat16));
    low = model(x);
  }
  CHECK_FALSE(at::autocast::is_autocast_enabled(torch::kCUDA));
  CHECK((low.scalar_type() == torch::kBFloat16));
  CHECK(rel_err(low, ref) < 2e-2);
}

TEST_CASE("clip, set_lr and the optimizer step make no host sync") {
  auto cfg = tiny(256);
  m::GPT model(cfg, 5);
  model->to(kCuda);
  auto x = torch::randint(cfg.vocab_size, {2, 32}, torch::TensorOptions().dtype(torch::kLong).device(kCuda));
  for (const bool fused : {true, false}) {
    CAPTURE(fused);
    m::AdamW o(model->named_parameters(), m::AdamWOptions{.fused = fused});
    o.zero_grad();
    model->loss(model(x), x).backward();
    torch::Tensor norm;
    {
      NoSyncScope no_sync;
      norm = m::clip_grad_norm(model->parameters(), 0.5);
      o.set_lr(2e-4);
      o.step();
    }
    CHECK(norm.is_cuda());
    CHECK(norm.item<double>() > 0.0);
    // After clipping the global norm is at most 0.5.
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad());
    auto after = torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads)), 2);
    CHECK(after.item<double>() <= 0.5 + 1e-4);
  }
}

TEST_CASE("a bf16 train step of tiny on CUDA learns") {
  auto cfg = tiny();
  m::GPT model(cfg, 6);
  model->to(kCuda);
  m::AdamW opt(model->named_parameters(), m::AdamWOptions{.lr = 3e-3, .weight_decay = 0.0});
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(kCuda);
  auto x = torch::randint(cfg.vocab_size, {4, 64}, opts);
  auto y = torch::randint(cfg.vocab_size, {4, 64}, opts);
  std::vector<torch::Tensor> losses;  // kept on the device: read once at the end
  for (int i = 0; i < 30; ++i) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      m::AutocastGuard autocast(torch::kCUDA);
      loss = model->loss(model(x), y);
    }
    loss.backward();  // outside autocast
    m::clip_grad_norm(model->parameters(), 1.0);
    opt.step();
    losses.push_back(loss.detach());
  }
  auto l = torch::stack(losses).to(torch::kCPU);
  MESSAGE("cuda bf16 loss " << l[0].item<float>() << " -> " << l[-1].item<float>());
  CHECK(std::abs(l[0].item<double>() - std::log(50257.0)) < 0.1);
  CHECK(l[-1].item<double>() < l[0].item<double>() - 1.0);
  CHECK((model->wte->weight.scalar_type() == torch::kFloat));  // master weights stay fp32
}

TEST_CASE("non-blocking checkpoint snapshot from CUDA") {
  auto cfg = tiny(128);
  m::GPT model(cfg, 7);
  model->to(kCuda);
  m::AdamW opt(model->named_parameters());
  auto x = torch::randint(cfg.vocab_size, {2, 16}, torch::TensorOptions().dtype(torch::kLong).device(kCuda));
  auto step = [&] {
    opt.zero_grad();
    model->loss(model(x), x).backward();
    opt.step();
  };
  step();
  std::vector<torch::Tensor> expected;
  for (const auto& p : model->parameters()) expected.push_back(p.detach().to(torch::kCPU));
  auto snap = m::snapshot(model, &opt, 1, "{}", /*non_blocking=*/true);
  CHECK(snap.ready != nullptr);
  CHECK(snap.model.front().second.is_pinned());
  step();  // enqueued after the copies: must not leak into the snapshot
  const std::string path = "/tmp/pipeline_test_model_gpu_" + std::to_string(::getpid()) + ".ckpt";
  m::write_checkpoint(path, snap);  // waits for the copies itself
  auto loaded = m::read_checkpoint(path);
  CHECK(loaded.rng_cuda.size() == static_cast<size_t>(torch::cuda::device_count()));
  m::GPT back(cfg, 0);
  back->to(kCuda);
  m::AdamW back_opt(back->named_parameters());
  m::restore(loaded, back, &back_opt);
  auto params = back->parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(torch::equal(params[i].to(torch::kCPU), expected[i]));
  ::unlink(path.c_str());
}

TEST_CASE("snapshot pool: a step issued right after take() does not leak into the snapshot") {
  // GPT-2 124M: 1.5 GB of weights and moments, so the copies are still running when the next
  // step's kernels are issued; the pool orders the next update after them on the device.
  auto cfg = m::GPTConfig::preset("gpt2");
  m::GPT model(cfg, 8);
  model->to(kCuda);
  m::AdamW opt(model->named_parameters());
  auto x = torch::randint(cfg.vocab_size, {4, 128}, torch::TensorOptions().dtype(torch::kLong).device(kCuda));
  auto step = [&](m::SnapshotPool* pool) {
    opt.zero_grad();
    {
      m::AutocastGuard autocast(torch::kCUDA);
      model->loss(model(x), x).backward();
    }
    if (pool) pool->order_before_update();
    opt.step();
  };
  m::SnapshotPool pool(model, &opt);
  auto* host = at::getHostAllocator(at::kCUDA);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    step(&pool);
    std::vector<torch::Tensor> expected;  // device clones, ordered on the same stream as the step
    for (const auto& p : model->parameters()) expected.push_back(p.detach().clone());
    const auto allocs = host->get_stats().allocations.current;
    auto snap = pool.take(round + 1, "{}");
    CHECK(snap.model.front().second.is_pinned());
    if (round > 0) CHECK(host->get_stats().allocations.current == allocs);  // the same pinned set, reused
    step(&pool);  // issued at once: its update must wait for the copies, on the device
    snap.wait();
    for (size_t i = 0; i < expected.size(); ++i) CHECK(torch::equal(snap.model[i].second, expected[i].cpu()));
  }
}

#ifdef PIPELINE_HAVE_SYNC_DEBUG  // the CUDA headers are there
TEST_CASE("CUDA graphs replay the eager step: same losses within bf16 tolerance, and the loss falls") {
  auto cfg = tiny();
  const int64_t B = 4, T = 64, steps = 16;
  const double lr = 1e-2;
  // One fixed batch, trained on again and again: its loss must fall step after step. (Fresh
  // random tokens would keep it near ln 50257 whatever the weights do, and a graph that never
  // updated them would pass.)
  auto gen = at::detail::createCPUGenerator(5);
  const auto rows = torch::randint(cfg.vocab_size, {B, T + 1}, gen, torch::kLong).to(kCuda);  // (B, T+1)
  auto run = [&](bool graphs) {
    c10::cuda::CUDAStreamGuard on(c10::cuda::getStreamFromPool(false, 0));
    m::GPT model(cfg, 21);
    model->to(kCuda);
    m::AdamW opt(model->named_parameters(), m::AdamWOptions{.lr = lr});
    std::vector<float> losses;
    std::unique_ptr<m::CapturedStep> captured;
    for (int64_t s = 0; s < steps; ++s) {
      torch::Tensor loss;
      if (captured) {
        captured->micro_batch(rows, 0);
        loss = captured->update(lr).first;
      } else {
        auto xx = rows.narrow(1, 0, T).contiguous(), yy = rows.narrow(1, 1, T).contiguous();
        {
          m::AutocastGuard autocast(torch::kCUDA);
          loss = model->loss(model(xx), yy);
        }
        loss.backward();
        m::clip_grad_norm(model->parameters(), 1.0);
        opt.set_lr(lr);
        opt.step();
        opt.zero_grad();
      }
      losses.push_back(loss.item<float>());
      if (graphs && s == 2) captured = std::make_unique<m::CapturedStep>(model, opt, m::CapturedStepOptions{B, T, 1, 1.0, true});
    }
    return losses;
  };
  auto eager = run(false), graph = run(true);
  for (size_t i = 0; i < eager.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(graph[i] - eager[i]) < 2e-2 * std::abs(eager[i]));
  }
  // Every replay (steps 3..15) updated the weights: the loss kept falling after capture.
  INFO("graph losses: step 3 " << graph[3] << ", step " << steps - 1 << " " << graph.back());
  CHECK(graph.back() < graph[3] - 0.5);
  for (int64_t s = 4; s < steps; ++s) CHECK(graph[static_cast<size_t>(s)] < graph[static_cast<size_t>(s) - 1] + 0.05);
}

// The spike guard on the device: its verdict, the learning rate it takes from its table and the
// skipped update all stay on the GPU. A batch whose every target is padding (ids >= vocab_size)
// has the loss 0/0 = NaN: skipped, eagerly and inside the captured update graph, without a host
// sync, leaving weights, moments and step counts as they were; the eager and the captured guard
// decide the same steps and count the same updates.
TEST_CASE("the spike guard on CUDA, eager and in a CUDA graph: a NaN step skipped, nothing moves, no host sync") {
  auto cfg = tiny();
  const int64_t B = 2, T = 32, steps = 12, nan_step = 8;
  auto gen = at::detail::createCPUGenerator(9);
  const auto text = torch::randint(cfg.vocab_size, {B, T + 1}, gen, torch::kLong).to(kCuda);  // (B, T+1)
  const auto padding = torch::full({B, T + 1}, 50300, torch::TensorOptions().dtype(torch::kLong).device(kCuda));
  const m::LrSchedule sched{.lr_max = 1e-3, .lr_min = 1e-4, .warmup_steps = 2, .total_steps = steps};
  auto run = [&](bool graphs) {
    c10::cuda::CUDAStreamGuard on(c10::cuda::getStreamFromPool(false, 0));
    m::GPT model(cfg, 21);
    model->to(kCuda);
    m::AdamW opt(model->named_parameters(), m::AdamWOptions{.lr = 1e-3});
    m::SpikeGuard guard({.window = 8, .z = 6, .min_steps = 3}, sched, steps, kCuda);
    std::vector<m::SpikeVerdict> verdicts;
    std::unique_ptr<m::CapturedStep> captured;
    for (int64_t s = 0; s < steps; ++s) {
      const auto& rows = s == nan_step ? padding : text;
      std::vector<torch::Tensor> before;
      for (const auto& [name, t] : opt.state()) before.push_back(t.clone());
      for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
      {
        NoSyncScope no_sync;
        if (captured) {
          captured->micro_batch(rows, 0);
          captured->update(0.0);
        } else {
          auto loss = model->loss(model(rows.narrow(1, 0, T).contiguous()), rows.narrow(1, 1, T).contiguous());
          loss.backward();
          auto norm = m::clip_grad_norm(model->parameters(), 1.0);
          opt.step(guard.judge(loss, norm, opt));
          opt.zero_grad();
        }
      }
      verdicts.push_back(m::SpikeVerdict::from(guard.verdict().cpu()));
      if (s == nan_step) {
        std::vector<torch::Tensor> after;
        for (const auto& [name, t] : opt.state()) after.push_back(t);
        for (const auto& p : model->parameters()) after.push_back(p.detach());
        bool unchanged = true;
        for (size_t i = 0; i < after.size(); ++i) unchanged = unchanged && torch::equal(before[i], after[i]);
        CHECK(unchanged);
      }
      if (graphs && s == 2)
        captured = std::make_unique<m::CapturedStep>(model, opt, m::CapturedStepOptions{B, T, 1, 1.0, false, &guard});
    }
    return verdicts;
  };
  auto eager = run(false), graph = run(true);
  for (int64_t s = 0; s < steps; ++s) {
    CAPTURE(s);
    const auto i = static_cast<size_t>(s);
    CHECK(eager[i].skipped == (s == nan_step));
    CHECK(graph[i].skipped == (s == nan_step));
    CHECK(graph[i].updates == eager[i].updates);
    CHECK(static_cast<float>(graph[i].lr) == static_cast<float>(sched.at(eager[i].updates - (eager[i].skipped ? 0 : 1))));
  }
  CHECK(graph.back().updates == steps - 1);
  CHECK(graph.back().skips == 1);
}

// Global capture mode would fail here: another thread waits on events, allocates pinned memory
// and copies while train's thread captures (h2d, log, eval and pack do all of that in a run).
TEST_CASE("CUDA graph capture survives other threads' CUDA calls (thread-local capture mode)") {
  auto cfg = tiny();
  const int64_t B = 2, T = 32;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0};
  std::thread busy([&] {
    c10::cuda::set_device(0);
    auto stream = c10::cuda::getStreamFromPool(false, 0);
    c10::cuda::CUDAStreamGuard on(stream);
    while (!stop.load()) {
      auto host = torch::empty({4096}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));  // cudaHostAlloc
      auto dev = host.to(kCuda, /*non_blocking=*/true);
      m::DeviceEvent done;
      done.record(stream);
      done.query();  // cudaEventQuery
      done.wait();   // cudaEventSynchronize
      calls.fetch_add(1);
    }
  });
  auto rows = torch::randint(cfg.vocab_size, {B, T + 1}, torch::kLong).to(kCuda);  // (B, T+1)
  {
    c10::cuda::CUDAStreamGuard on(c10::cuda::getStreamFromPool(false, 0));
    m::GPT model(cfg, 3);
    model->to(kCuda);
    m::AdamW opt(model->named_parameters(), m::AdamWOptions{.lr = 1e-3});
    for (int s = 0; s < 3; ++s) {  // the eager warm-up steps
      auto loss = model->loss(model(rows.narrow(1, 0, T).contiguous()), rows.narrow(1, 1, T).contiguous());
      loss.backward();
      opt.step();
      opt.zero_grad();
    }
    while (calls.load() < 10) std::this_thread::yield();  // the other thread is in its loop
    for (int attempt = 0; attempt < 5; ++attempt) {  // a fresh capture each time
      m::CapturedStep captured(model, opt, m::CapturedStepOptions{B, T, 1, 1.0, false});
      CHECK_NOTHROW(captured.micro_batch(rows, 0));
      CHECK_NOTHROW(captured.update(1e-3));
      CHECK(std::isfinite(captured.update(1e-3).first.item<float>()));
      for (auto& p : model->parameters()) p.mutable_grad().reset();  // the next capture starts afresh
    }
  }
  stop = true;
  busy.join();
  MESSAGE("the other thread made " << calls.load() << " rounds of CUDA calls");
}
#endif

TEST_CASE("SDPA takes flash or cuDNN attention for GPT-2 in bf16") {
  m::GPT model(m::GPTConfig::preset("gpt2"), 1);
  model->to(kCuda);
  auto name = model->attention_backend(1024, torch::kBFloat16, kCuda);
  MESSAGE("gpt2 bf16 attention on CUDA: " << name);
  CHECK((name == "flash_attention" || name == "cudnn_attention"));
}

TEST_CASE("KV-cache sampling on CUDA: the full recompute's tokens in fp32, valid ids under autocast") {
  auto cfg = tiny(512);
  m::GPT model(cfg, 9);
  model->to(kCuda);
  std::vector<int64_t> prompt{5, 17, 300};
  m::SampleOptions o{.n_tokens = 30, .temperature = 1.0, .top_k = 40, .seed = 3};
  auto cached = m::sample(model, prompt, o);
  o.kv_cache = false;
  CHECK(cached == m::sample(model, prompt, o));
  m::AutocastGuard autocast(torch::kCUDA);
  o.kv_cache = true;
  auto low = m::sample(model, prompt, o);
  REQUIRE(low.size() == 33);
  for (auto id : low) CHECK((id >= 0 && id < cfg.vocab_size));
}
