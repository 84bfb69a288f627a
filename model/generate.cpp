// Autoregressive sampling (see generate.h).
#include "model/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

namespace pipeline::model {

std::vector<int64_t> sample(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& options) {
  const GPTConfig& cfg = model->config();
  if (prompt.empty()) throw std::invalid_argument("sample: the prompt is empty (give at least one token)");
  for (int64_t id : prompt) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw std::invalid_argument("sample: prompt token " + std::to_string(id) + " is outside [0, " +
                                  std::to_string(cfg.vocab_size) + ")");
    }
  }
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const torch::Device device = model->wte->weight.device();
  auto gen = at::detail::createCPUGenerator(options.seed);
  std::vector<int64_t> ids = prompt;
  ids.reserve(prompt.size() + static_cast<size_t>(std::max<int64_t>(options.n_tokens, 0)));
  for (int64_t n = 0; n < options.n_tokens; ++n) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ids.size()), cfg.block_size);
    auto ctx = torch::from_blob(ids.data() + ids.size() - T, {1, T}, torch::kLong).to(device);  // (1, T)
    auto logits = model->forward(ctx).select(1, T - 1).narrow(1, 0, cfg.vocab_size);  // (1, V)
    logits = logits.to(torch::kCPU, torch::kFloat).squeeze(0);  // (V)
    int64_t next;
    if (options.temperature <= 0.0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < cfg.vocab_size) {
        auto kth = std::get<0>(logits.topk(options.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      auto probs = torch::softmax(logits, 0);
      next = torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
    }
    ids.push_back(next);
  }
  model->train(was_training);
  return ids;
}

}  // namespace pipeline::model
