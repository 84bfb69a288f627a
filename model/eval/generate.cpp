// Autoregressive sampling (see generate.h).
#include "model/eval/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <stdexcept>

#include "model/device/device_event.h"

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace pipeline::model {

namespace {

at::Generator make_generator(torch::Device device, uint64_t seed) {
#ifdef PIPELINE_HAVE_CUDA
  if (device.is_cuda()) {
    auto gen = at::cuda::detail::createCUDAGenerator(device.index());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  if (!device.is_cpu()) throw std::invalid_argument("sample: unsupported device " + device.str());
  return at::detail::createCPUGenerator(seed);
}

// One token from the logits of the last position, (V) fp32, as a 0-dim int64 on their device.
torch::Tensor draw(torch::Tensor logits, const SampleOptions& o, at::Generator& gen) {
  if (o.temperature <= 0.0) return logits.argmax();
  logits = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < logits.size(0)) {
    auto kth = std::get<0>(logits.topk(o.top_k)).select(0, o.top_k - 1);  // 0-dim
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(logits, 0);  // (V)
  // argmax p_i / E_i with E_i ~ Exp(1) picks i with probability p_i (the smallest of the
  // exponential clocks E_i / p_i wins), without the host round trip of multinomial's checks.
  auto clocks = torch::empty_like(probs).exponential_(1.0, gen);
  return (probs / clocks).argmax();
}

}  // namespace

torch::Tensor sample_on_device(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& options) {
  const GPTConfig& cfg = model->config();
  if (prompt.empty()) throw std::invalid_argument("sample: the prompt is empty (give at least one token)");
  for (int64_t id : prompt) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw std::invalid_argument("sample: prompt token " + std::to_string(id) + " is outside [0, " +
                                  std::to_string(cfg.vocab_size) + ")");
    }
  }
  if (options.n_tokens < 0) throw std::invalid_argument("sample: n_tokens must be >= 0, got " + std::to_string(options.n_tokens));
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const torch::Device device = model->wte->weight.device();
  auto gen = make_generator(device, options.seed);
  const auto P = static_cast<int64_t>(prompt.size()), N = options.n_tokens;
  // Prompt and generated ids, on the device: (P + N).
  auto host = torch::empty({P + N}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(device.is_cuda()));
  std::copy(prompt.begin(), prompt.end(), host.data_ptr<int64_t>());
  auto ids = host.to(device, /*non_blocking=*/true);

  // The logits of the last position given ids[0, n): (V) fp32.
  KVCache cache;
  cache.capacity = std::min(cfg.block_size, P + N);
  const bool cached = options.kv_cache && P <= cfg.block_size;
  auto next_logits = [&](int64_t n) {
    torch::Tensor last;  // (1, Vp)
    if (cached && n <= cache.capacity) {
      last = model->forward_cached(ids.narrow(0, cache.pos, n - cache.pos).unsqueeze(0), cache);
    } else {
      const int64_t T = std::min(n, cfg.block_size);
      last = model->forward(ids.narrow(0, n - T, T).unsqueeze(0)).select(1, T - 1);
    }
    return last.squeeze(0).narrow(0, 0, cfg.vocab_size).to(torch::kFloat);
  };
  for (int64_t i = 0; i < N; ++i) ids.narrow(0, P + i, 1).copy_(draw(next_logits(P + i), options, gen).view({1}));
  model->train(was_training);
  return ids.narrow(0, P, N);
}

std::vector<int64_t> sample(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& options) {
  auto ids = sample_on_device(model, prompt, options);  // (N)
  torch::Tensor host = ids;
  if (ids.is_cuda()) {
    host = torch::empty(ids.sizes(), ids.options().device(torch::kCPU).pinned_memory(true));
    host.copy_(ids, /*non_blocking=*/true);
    DeviceEvent copied;
    copied.record_current(ids.device());
    copied.wait();
  }
  std::vector<int64_t> out = prompt;
  out.insert(out.end(), host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  return out;
}

}  // namespace pipeline::model
