// Autoregressive sampling from a GPT: temperature, top-k, a seed; the context is cropped to
// the model's block_size.
#pragma once

#include "model/gpt2.h"

#include <cstdint>
#include <vector>

namespace pipeline::model {

/// Example:
///   auto ids = sample(model, tokenizer.encode("ROMEO:"), SampleOptions{.n_tokens = 200, .top_k = 40});
struct SampleOptions {
  int64_t n_tokens = 100;  // tokens to append to the prompt
  double temperature = 1.0;  // <= 0: greedy (argmax)
  int64_t top_k = 0;  // 0: the whole (real) vocabulary
  uint64_t seed = 1337;
};

/// Returns prompt followed by n_tokens sampled ids (all < vocab_size: padded logits are never
/// sampled). Runs under no_grad in eval mode (the model's mode is restored afterwards) on the
/// model's device; the draws come from a private CPU generator, so a seed gives the same ids on
/// any device up to floating-point differences in the logits. One host sync per token.
std::vector<int64_t> sample(GPT& model, const std::vector<int64_t>& prompt, const SampleOptions& options = {});

}  // namespace pipeline::model
