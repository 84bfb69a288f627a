// The shape of a GPT-2 model, with named presets: what a config's [model] section resolves to.
// Torch-free, so that `pipeline check` resolves and prints a model without loading LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline::model {

/// Shape of a GPT-2 model. Defaults are GPT-2 small (124M).
///
/// Example:
///   auto cfg = GPTConfig::preset("tiny").with_vocab(256);
///   cfg.validate();
struct GPTConfig {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t block_size = 1024;  // longest context the position embedding covers
  int64_t vocab_size = 50257;  // real tokens: only these are ever predicted
  int64_t padded_vocab_size = 50304;  // rows of wte / columns of the logits (multiple of 64)
  double dropout = 0.0;
  bool bias = true;  // biases in Linear and LayerNorm (GPT-2 has them)

  /// Presets: "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1558M),
  /// "tiny" (2 layers, 2 heads, 64 wide, context 64: unit tests, seconds on a CPU) and
  /// "small-cpu" (4 layers, 4 heads, 128 wide, context 128: trains visibly on tiny-shakespeare
  /// on 2 CPU cores in a few minutes; used by the quick start). All use the GPT-2 vocabulary.
  /// Throws std::invalid_argument naming the unknown preset and listing the known ones.
  static GPTConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();

  /// Rounds up to a multiple of `multiple` (50257 -> 50304): tensor-core friendly matmuls.
  static int64_t pad_vocab(int64_t vocab_size, int64_t multiple = 64);

  /// Sets vocab_size and the matching padded_vocab_size.
  GPTConfig& with_vocab(int64_t vocab);

  /// Throws std::invalid_argument with the offending values (n_embd % n_head, sizes > 0, ...).
  void validate() const;

  int64_t head_dim() const { return n_embd / n_head; }

  /// Exact number of parameters, counting the tied wte/lm_head tensor once; equals
  /// GPT(cfg)->num_parameters() without allocating anything.
  int64_t num_parameters() const;

  /// Training FLOPs per token at context T by the PaLM formula (nanoGPT's MFU, the one the GPT-2
  /// reproductions quote): 6*N + 12*L*C*T, N every parameter (the tied embedding once). 860.1
  /// MFLOP for GPT-2 124M at T = 1024 (llm.c's Kaplan formula, 6*N + 6*L*C*T, gives 803.5).
  double flops_per_token(int64_t T) const;

  /// One-line JSON object with every field (for checkpoint metadata and logs).
  std::string to_json() const;
};

}  // namespace pipeline::model
