// Autoregressive sampling from a GPT: temperature, top-k, a seed; a KV cache so each new token
// costs one position's forward pass; the context is cropped to the model's block_size.
#pragma once

#include "model/net/gpt2.h"

#include <cstdint>
#include <vector>

namespace pipeline::model {

/// Example:
///   auto ids = sample(model, tokenizer.encode("ROMEO:"), SampleOptions{.n_tokens = 200, .top_k = 40});
struct SampleOptions {
  int64_t n_tokens = 100;    // tokens to append to the prompt
  double temperature = 1.0;  // <= 0: greedy (argmax)
  int64_t top_k = 0;         // 0: the whole (real) vocabulary
  uint64_t seed = 1337;
  bool kv_cache = true;      // false: recompute the whole context for every token (the reference)
};

/// Samples n_tokens ids after `prompt` and returns them as an (n_tokens) int64 tensor on the
/// model's device, without waiting for them: the loop never reads a token back to the host (the
/// draw is an argmax over probabilities divided by exponential noise, i.e. a categorical draw
/// made on the device). Draws come from a private generator of the model's device seeded with
/// `seed`, so a seed gives the same ids on one device type whether or not the KV cache is used
/// (up to rounding in the logits), and a different sequence on CPU and CUDA. Runs under no_grad
/// in eval mode (the model's mode is restored); autocast applies if the caller enabled it.
/// With the KV cache, positions beyond block_size fall back to recomputing the cropped context.
torch::Tensor sample_on_device(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& options = {});

/// Returns prompt followed by n_tokens sampled ids (all < vocab_size: padded logits are never
/// sampled): sample_on_device() plus one transfer to the host, waited for without spinning.
std::vector<int64_t> sample(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& options = {});

}  // namespace pipeline::model
