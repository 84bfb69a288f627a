// GPT-2 in LibTorch: the decoder-only model (its configuration: model/net/gpt_config.h).
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

#include "model/net/gpt_config.h"
#include "model/net/loss_path.h"
#include "model/net/recompute.h"

namespace pipeline::model {

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
  /// The rest of forward once c_attn has run: qkv (B, T, 3C) -> (B, T, C).
  torch::Tensor attend(const torch::Tensor& qkv);
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
  /// The rest of forward once c_fc has run, its GELU recomputed in backward (recompute.h):
  /// u (B, T, 4C) -> (B, T, C).
  torch::Tensor project_recomputed(const torch::Tensor& u);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
 private:
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

/// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). While training
/// with grad mode on, `recompute` says what its backward computes again (recompute.h).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor forward_cached(const torch::Tensor& x, KVCache::Layer& cache, int64_t pos, int64_t capacity);
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
  Recompute recompute = Recompute::none;

 private:
  torch::Tensor forward_layers(const torch::Tensor& x, bool recompute_mlp);
  bool dropout_ = false;
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

  /// What the head multiplies: the final LayerNorm's output (B, T, C) for idx (B, T), so that a
  /// caller that needs a few positions' logits (HellaSwag) projects only those.
  torch::Tensor features(const torch::Tensor& idx);

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
  /// 0-dim fp32 tensor on the logits' device; never syncs the host. Targets outside
  /// [0, vocab_size) are ignored (no loss, no gradient, not counted), as PyTorch's ignore_index.
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const;

  /// Which cross-entropy loss() runs for logits of `dtype` on `device`, and why (the fused CUDA
  /// kernels, or the chunked ATen path: on the CPU, without nvcc, or on a GPU the kernels have
  /// no image for, such as a T4 under a build for sm_80 and up).
  LossPath loss_path(torch::Device device, torch::ScalarType dtype) const;

  /// GPT-2 initialisation, reproducible for a seed whatever the device: normal(0, 0.02) for
  /// embeddings and Linear weights, c_proj weights scaled by 1/sqrt(2*n_layer), zero biases,
  /// LayerNorm weights 1. Numbers are drawn on the CPU from a private generator.
  void init_weights(uint64_t seed);

  /// Parameters counted once each (the head shares wte's tensor).
  int64_t num_parameters() const;

  /// The weight the output head multiplies by: the very tensor wte.weight (same storage).
  torch::Tensor lm_head_weight() const { return wte->weight; }

  const GPTConfig& config() const { return cfg_; }

  /// What backward computes again instead of keeping (recompute.h); none by default. The losses
  /// and gradients are the same whatever it is.
  void set_recompute(Recompute r);

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  LayerNorm ln_f{nullptr};

 private:
  GPTConfig cfg_;
  torch::nn::Dropout drop{nullptr};
  // loss_path's answer for the last CUDA device asked (-1: none yet).
  mutable c10::DeviceIndex image_device_ = -1;
  mutable bool image_ = false;
};
TORCH_MODULE(GPT);

/// Mean cross-entropy over the first `vocab` columns of `logits` (N, Vp), any float dtype,
/// against `targets` (N) ids; 0-dim fp32. A target outside [0, vocab) is ignored, as PyTorch's
/// ignore_index (-100) is: no loss, no gradient, not counted in the mean (all ignored: NaN, as
/// PyTorch gives). A NaN logit makes the loss and its row's gradients NaN, on every path. Works
/// through the rows `chunk_rows` at a time
/// in fp32 (<= 0: about 4 MB of fp32 per chunk on the CPU, 256 MB on a GPU), and when the
/// logits need a gradient computes it in the same pass into one (N, Vp) buffer of their dtype,
/// which backward scales in place: no copy of the logits, sliced or widened, is ever whole.
/// A backward through the result may run once (no retain_graph). On CUDA (fp32 or bf16 logits,
/// a build with PIPELINE_HAVE_CUDA_LOSS, a device the kernels have an image for) and
/// chunk_rows <= 0 it runs as two fused kernels instead (cross_entropy_cuda.h); a positive
/// chunk_rows keeps the chunked path there too. cross_entropy_path says which.
torch::Tensor cross_entropy_real_vocab(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                                       int64_t chunk_rows = 0);

/// The path cross_entropy_real_vocab takes for logits of `dtype` on `device` (loss_path.h).
LossPath cross_entropy_path(torch::Device device, torch::ScalarType dtype, int64_t chunk_rows = 0);

/// Whether this build has the fused CUDA kernels that cross_entropy_real_vocab uses on CUDA.
bool fused_cross_entropy_built();

/// Copies named tensors (CPU or not, any matching dtype) into the model's parameters.
/// Every parameter must be present with the same shape; throws naming what is missing or
/// mismatched. Extra names are an error too (they mean a different architecture).
void load_parameters(GPT& model, const std::vector<std::pair<std::string, torch::Tensor>>& named);

}  // namespace pipeline::model
