// GPT-2 in LibTorch: the configuration (with named presets) and the decoder-only model.
//
// Parameter names follow nanoGPT without the `transformer.` prefix (wte.weight,
// h.0.attn.c_attn.weight, ln_f.weight, ...) so that tools/gpt2_reference.py and checkpoints
// can address tensors by name. The output head is tied to wte: it is not a parameter of its own.
#pragma once

#include <torch/torch.h>

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

  /// Training FLOPs per token at context T: 6*N + 6*L*C*T (DESIGN.md's MFU formula).
  double flops_per_token(int64_t T) const;

  /// One-line JSON object with every field (for checkpoint metadata and logs).
  std::string to_json() const;
};

/// LayerNorm with an optional bias (torch::nn::LayerNorm always has one), eps 1e-5.
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t n_embd, bool bias);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // bias undefined when built without
 private:
  int64_t n_embd_;
};
TORCH_MODULE(LayerNorm);

/// Keys and values of the positions decoded so far, per layer, for incremental decoding
/// (GPTImpl::forward_cached). Buffers are allocated on first use, in the dtype the attention
/// produces (bf16 under autocast).
struct KVCache {
  struct Layer {
    torch::Tensor k, v;  // (B, H, capacity, hd)
  };
  std::vector<Layer> layers;
  int64_t capacity = 0;  // positions the buffers hold (<= block_size)
  int64_t pos = 0;       // positions filled
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)
  /// x (B, t, C) holds positions [pos, pos + t); their keys and values go into `cache` and the
  /// queries attend to [0, pos + t). t > 1 only at pos == 0 (the prompt).
  torch::Tensor forward_cached(const torch::Tensor& x, KVCache::Layer& cache, int64_t pos, int64_t capacity);
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
 private:
  int64_t n_head_, n_embd_;
  double dropout_;
  torch::nn::Dropout resid_dropout{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
 private:
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

/// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor forward_cached(const torch::Tensor& x, KVCache::Layer& cache, int64_t pos, int64_t capacity);
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

/// The GPT-2 decoder. Built on the CPU and initialised from `seed` (GPT-2 scheme); move it
/// with ->to(device) afterwards.
class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(GPTConfig cfg, uint64_t seed = 1337);

  /// idx (B, T) int64 token ids, T <= block_size -> logits (B, T, padded_vocab_size).
  /// Columns >= vocab_size are padding; loss() and sample() never look at them.
  torch::Tensor forward(const torch::Tensor& idx);

  /// Incremental decoding: idx (B, t) int64 are positions [cache.pos, cache.pos + t), which must
  /// stay within cache.capacity (<= block_size); t > 1 only for the first call (the prompt).
  /// Returns the logits of the last position, (B, padded_vocab_size), and advances cache.pos.
  /// Equal to forward(all ids so far)[:, -1] up to rounding (tested).
  torch::Tensor forward_cached(const torch::Tensor& idx, KVCache& cache);

  /// The kernel scaled_dot_product_attention picks for this model's attention at context T in
  /// `dtype` on `device` ("flash_attention", "cudnn_attention", "efficient_attention", "math"),
  /// asked of ATen's own selection with tensors laid out as forward() lays them out.
  std::string attention_backend(int64_t T, torch::ScalarType dtype, torch::Device device) const;

  /// Mean cross-entropy of logits (B, T, padded_vocab) against targets (B, T) int64, over the
  /// real vocabulary only (softmax never sees the padded columns; their gradient is zero).
  /// Makes no (B*T, V) copy of the logits nor an fp32 one (cross_entropy_real_vocab). Returns a
  /// 0-dim fp32 tensor on the logits' device; never syncs the host.
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const;

  /// GPT-2 initialisation, reproducible for a seed whatever the device: normal(0, 0.02) for
  /// embeddings and Linear weights, c_proj weights scaled by 1/sqrt(2*n_layer), zero biases,
  /// LayerNorm weights 1. Numbers are drawn on the CPU from a private generator.
  void init_weights(uint64_t seed);

  /// Parameters counted once each (the head shares wte's tensor).
  int64_t num_parameters() const;

  /// The weight the output head multiplies by: the very tensor wte.weight (same storage).
  torch::Tensor lm_head_weight() const { return wte->weight; }

  const GPTConfig& config() const { return cfg_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  LayerNorm ln_f{nullptr};

 private:
  GPTConfig cfg_;
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(GPT);

/// Mean cross-entropy over the first `vocab` columns of `logits` (N, Vp), any float dtype,
/// against `targets` (N) ids < vocab; 0-dim fp32. Works through the rows `chunk_rows` at a time
/// in fp32 (<= 0: about 4 MB of fp32 per chunk on the CPU, 256 MB on a GPU), and when the
/// logits need a gradient computes it in the same pass into one (N, Vp) buffer of their dtype,
/// which backward scales in place: no copy of the logits, sliced or widened, is ever whole.
/// A backward through the result may run once (no retain_graph).
torch::Tensor cross_entropy_real_vocab(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                                       int64_t chunk_rows = 0);

/// Copies named tensors (CPU or not, any matching dtype) into the model's parameters.
/// Every parameter must be present with the same shape; throws naming what is missing or
/// mismatched. Extra names are an error too (they mean a different architecture).
void load_parameters(GPT& model, const std::vector<std::pair<std::string, torch::Tensor>>& named);

}  // namespace pipeline::model
