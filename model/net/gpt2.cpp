// GPT-2 in LibTorch: the modules and GPT-2 initialisation (presets: gpt_config.cpp).
#include "model/net/gpt2.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/SDPBackend.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "model/net/cross_entropy_cpu.h"

#ifdef PIPELINE_HAVE_CUDA_LOSS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "model/net/cross_entropy_cuda.h"
#endif

namespace pipeline::model {

namespace {

// y = x W^T + b through ATen's linear, not the module's forward. LibTorch's functional linear
// (torch::nn::Linear::forward) fuses the bias only for 2-D input: on (B, T, C) activations it
// runs a matmul and then `+= bias` as a kernel of its own, one more pass over every output in
// the forward. at::linear folds contiguous (B, T, C) input to one GEMM with the bias in its
// epilogue, as PyTorch's nn.Linear does.
torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

}  // namespace

LayerNormImpl::LayerNormImpl(int64_t n_embd, bool with_bias) : n_embd_(n_embd) {
  weight = register_parameter("weight", torch::ones({n_embd}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({n_embd}));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return at::layer_norm(x, {n_embd_}, weight, bias, 1e-5);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& cfg)
    : n_head_(cfg.n_head), n_embd_(cfg.n_embd), dropout_(cfg.dropout) {
  c_attn = register_module(
      "c_attn", torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, 3 * cfg.n_embd).bias(cfg.bias)));
  c_proj = register_module(
      "c_proj", torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, cfg.n_embd).bias(cfg.bias)));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(cfg.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) { return attend(linear(c_attn, x)); }

torch::Tensor CausalSelfAttentionImpl::attend(const torch::Tensor& qkv_joined) {
  const int64_t B = qkv_joined.size(0), T = qkv_joined.size(1), C = n_embd_, hd = C / n_head_;
  auto qkv = qkv_joined.split(n_embd_, /*dim=*/2);  // 3 x (B, T, C)
  auto q = qkv[0].view({B, T, n_head_, hd}).transpose(1, 2);  // (B, H, T, hd)
  auto k = qkv[1].view({B, T, n_head_, hd}).transpose(1, 2);  // (B, H, T, hd)
  auto v = qkv[2].view({B, T, n_head_, hd}).transpose(1, 2);  // (B, H, T, hd)
  auto y = at::scaled_dot_product_attention(q, k, v, {}, is_training() ? dropout_ : 0.0,
                                            /*is_causal=*/true);  // (B, H, T, hd)
  y = y.transpose(1, 2).contiguous().view({B, T, C});  // (B, T, C)
  return resid_dropout(linear(c_proj, y));
}

torch::Tensor CausalSelfAttentionImpl::forward_cached(const torch::Tensor& x, KVCache::Layer& cache, int64_t pos,
                                                     int64_t capacity) {
  const int64_t B = x.size(0), t = x.size(1), C = x.size(2), hd = C / n_head_;
  TORCH_CHECK(t == 1 || pos == 0, "forward_cached: several positions at once only for the prompt (pos 0), got ", t,
              " at pos ", pos);
  auto qkv = linear(c_attn, x).split(n_embd_, /*dim=*/2);                      // 3 x (B, t, C)
  auto q = qkv[0].view({B, t, n_head_, hd}).transpose(1, 2);          // (B, H, t, hd)
  auto k = qkv[1].view({B, t, n_head_, hd}).transpose(1, 2);          // (B, H, t, hd)
  auto v = qkv[2].view({B, t, n_head_, hd}).transpose(1, 2);          // (B, H, t, hd)
  if (!cache.k.defined()) {
    cache.k = torch::empty({B, n_head_, capacity, hd}, k.options());  // (B, H, capacity, hd)
    cache.v = torch::empty({B, n_head_, capacity, hd}, v.options());
  }
  cache.k.narrow(2, pos, t).copy_(k);
  cache.v.narrow(2, pos, t).copy_(v);
  auto keys = cache.k.narrow(2, 0, pos + t);    // (B, H, pos+t, hd)
  auto values = cache.v.narrow(2, 0, pos + t);  // (B, H, pos+t, hd)
  // The prompt attends causally among itself; one new position attends to everything before it.
  auto y = at::scaled_dot_product_attention(q, keys, values, {}, 0.0,
                                            /*is_causal=*/t > 1);  // (B, H, t, hd)
  y = y.transpose(1, 2).contiguous().view({B, t, C});                 // (B, t, C)
  return resid_dropout(linear(c_proj, y));
}

MLPImpl::MLPImpl(const GPTConfig& cfg) {
  c_fc = register_module(
      "c_fc", torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, 4 * cfg.n_embd).bias(cfg.bias)));
  c_proj = register_module(
      "c_proj", torch::nn::Linear(torch::nn::LinearOptions(4 * cfg.n_embd, cfg.n_embd).bias(cfg.bias)));
  dropout = register_module("dropout", torch::nn::Dropout(cfg.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto hidden = torch::gelu(linear(c_fc, x), "tanh");  // (B, T, 4C)
  return dropout(linear(c_proj, hidden));  // (B, T, C)
}

torch::Tensor MLPImpl::project_recomputed(const torch::Tensor& u) {
  return dropout(gelu_linear(u, c_proj->weight, c_proj->bias));  // (B, T, C)
}

BlockImpl::BlockImpl(const GPTConfig& cfg) : dropout_(cfg.dropout > 0) {
  ln_1 = register_module("ln_1", LayerNorm(cfg.n_embd, cfg.bias));
  attn = register_module("attn", CausalSelfAttention(cfg));
  ln_2 = register_module("ln_2", LayerNorm(cfg.n_embd, cfg.bias));
  mlp = register_module("mlp", MLP(cfg));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const bool recording = is_training() && torch::GradMode::is_enabled();
  if (recording && recompute == Recompute::block) {
    // Only x is kept; backward runs forward_layers again. With dropout the masks must be the
    // forward's: the generators' states are saved and put back around the recomputation.
    std::vector<torch::Tensor> params;
    for (const auto& p : parameters())
      if (p.requires_grad()) params.push_back(p);
    return checkpoint([this](const torch::Tensor& in) { return forward_layers(in, false); }, x, params, dropout_);
  }
  return forward_layers(x, recording && recompute == Recompute::mlp);
}

torch::Tensor BlockImpl::forward_layers(const torch::Tensor& x, bool recompute_mlp) {
  if (!recompute_mlp) {
    auto y = x + attn(ln_1(x));
    return y + mlp(ln_2(y));
  }
  // llm.c's recompute: the LayerNorms' outputs and the GELU's are computed again in backward.
  auto y = x + attn->attend(layer_norm_linear(x, ln_1->weight, ln_1->bias, attn->c_attn->weight, attn->c_attn->bias));
  return y + mlp->project_recomputed(layer_norm_linear(y, ln_2->weight, ln_2->bias, mlp->c_fc->weight, mlp->c_fc->bias));
}

torch::Tensor BlockImpl::forward_cached(const torch::Tensor& x, KVCache::Layer& cache, int64_t pos, int64_t capacity) {
  auto y = x + attn->forward_cached(ln_1(x), cache, pos, capacity);
  return y + mlp(ln_2(y));
}

// ---------------------------------------------------------------------------------------------

namespace {

// LibTorch's module constructors (Linear, Embedding) initialise their weights from the default
// CPU generator, which init_weights then overwrites from a private one. This puts the default
// generator back as it was, so that building a model (eval's, train's, whenever a stage builds
// it) never moves the stream dropout draws its masks from: a resumed run, whose generators the
// run layer restored before any stage was built, goes on with the masks it would have drawn.
class KeepCpuGenerator {
 public:
  KeepCpuGenerator() : gen_(at::globalContext().defaultGenerator(torch::kCPU)) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    state_ = gen_.get_state();
  }
  ~KeepCpuGenerator() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(state_);
  }
  KeepCpuGenerator(const KeepCpuGenerator&) = delete;
  KeepCpuGenerator& operator=(const KeepCpuGenerator&) = delete;

 private:
  at::Generator gen_;
  torch::Tensor state_;
};

}  // namespace

GPTImpl::GPTImpl(GPTConfig cfg, uint64_t seed) : cfg_(cfg) {
  cfg_.validate();
  {
    const KeepCpuGenerator keep;
    wte = register_module("wte", torch::nn::Embedding(cfg_.padded_vocab_size, cfg_.n_embd));
    wpe = register_module("wpe", torch::nn::Embedding(cfg_.block_size, cfg_.n_embd));
    drop = register_module("drop", torch::nn::Dropout(cfg_.dropout));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg_.n_layer; ++i) h->push_back(Block(cfg_));
    ln_f = register_module("ln_f", LayerNorm(cfg_.n_embd, cfg_.bias));
  }
  init_weights(seed);
}

void GPTImpl::set_recompute(Recompute r) {
  for (const auto& block : *h) block->as<Block>()->recompute = r;
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  return at::linear(features(idx), wte->weight);  // (B, T, Vp)
}

torch::Tensor GPTImpl::features(const torch::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "GPT::forward: expected idx of shape (B, T), got ", idx.sizes());
  TORCH_CHECK(idx.scalar_type() == torch::kLong, "GPT::forward: expected int64 token ids, got ",
              idx.scalar_type());
  const int64_t T = idx.size(1);
  TORCH_CHECK(T >= 1 && T <= cfg_.block_size, "GPT::forward: sequence length ", T,
              " must be in [1, block_size=", cfg_.block_size, "]");
  auto pos = torch::arange(T, idx.options());  // (T)
  auto x = drop(wte(idx) + wpe(pos));  // (B, T, C)
  for (const auto& block : *h) x = block->as<Block>()->forward(x);
  return ln_f(x);  // (B, T, C)
}

torch::Tensor GPTImpl::forward_cached(const torch::Tensor& idx, KVCache& cache) {
  TORCH_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kLong, "GPT::forward_cached: expected (B, t) int64 ids, got ",
              idx.sizes(), " ", idx.scalar_type());
  if (cache.capacity == 0) cache.capacity = cfg_.block_size;
  const int64_t t = idx.size(1), pos = cache.pos;
  TORCH_CHECK(cache.capacity <= cfg_.block_size && pos + t <= cache.capacity, "GPT::forward_cached: positions [", pos,
              ", ", pos + t, ") exceed the cache's ", cache.capacity, " (block_size ", cfg_.block_size, ")");
  if (cache.layers.empty()) cache.layers.resize(static_cast<size_t>(cfg_.n_layer));
  auto positions = torch::arange(pos, pos + t, idx.options());  // (t)
  auto x = drop(wte(idx) + wpe(positions));                     // (B, t, C)
  for (size_t i = 0; i < h->size(); ++i)
    x = h[i]->as<Block>()->forward_cached(x, cache.layers[i], pos, cache.capacity);
  cache.pos = pos + t;
  x = ln_f(x.select(1, t - 1));                           // (B, C): only the last position is needed
  return at::linear(x, wte->weight);  // (B, Vp)
}

std::string GPTImpl::attention_backend(int64_t T, torch::ScalarType dtype, torch::Device device) const {
  const int64_t C = cfg_.n_embd, H = cfg_.n_head, hd = C / H;
  auto qkv = torch::zeros({1, T, 3 * C}, torch::TensorOptions().dtype(dtype).device(device)).split(C, 2);
  auto q = qkv[0].view({1, T, H, hd}).transpose(1, 2);  // (1, H, T, hd), strided as in forward()
  auto k = qkv[1].view({1, T, H, hd}).transpose(1, 2);
  auto v = qkv[2].view({1, T, H, hd}).transpose(1, 2);
  switch (static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, k, v, {}, is_training() ? cfg_.dropout : 0.0, true))) {
    case at::SDPBackend::flash_attention: return "flash_attention";
    case at::SDPBackend::cudnn_attention: return "cudnn_attention";
    case at::SDPBackend::efficient_attention: return "efficient_attention";
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::overrideable: return "overrideable";
    default: return "none";
  }
}

// The loss is computed over row chunks, with its gradient computed in the same pass and kept for
// backward (as Liger's and llm.c's fused classifiers do). The straightforward form, slicing the
// real vocabulary off the logits and casting to fp32 for cross_entropy, materializes a (B*T, V)
// copy, then an fp32 copy (3.3 GB at 16x1024 in bf16), an fp32 log-softmax kept for backward,
// and in backward an fp32 gradient, a zero-filled padded one and the slice_scatter between
// them: about 10 GB of traffic per micro-batch. Here only the gradient, in the logits' dtype
// and padded shape (zero in the padded columns), is as large as the logits; the fp32 work is
// chunk-sized. Softmax runs over the real vocabulary only, so loss and gradients are those of
// an unpadded model (the padded columns never take probability mass; tests/test_model.cpp
// compares both against the sliced form).
namespace {

// A chunk's fp32 temporaries: cache-sized on the CPU, large on a GPU (few launches).
int64_t default_chunk_rows(const torch::Tensor& logits, int64_t vocab) {
  const int64_t bytes = logits.is_cuda() ? (int64_t{256} << 20) : (int64_t{4} << 20);
  return std::max<int64_t>(1, bytes / (vocab * static_cast<int64_t>(sizeof(float))));
}

// The rows whose target counts: ids in [0, vocab). The others are ignored, as PyTorch's
// ignore_index (-100) is: no loss, no gradient, and not counted in the mean. (N) bool.
torch::Tensor kept_rows(const torch::Tensor& targets, int64_t vocab) { return (targets >= 0).logical_and_(targets < vocab); }

// The mean's denominator: the rows kept, as a 0-dim fp32 on the targets' device (no host sync).
// All rows ignored gives 0/0 = NaN, as PyTorch's mean over no targets does.
torch::Tensor kept_count(const torch::Tensor& kept) { return kept.sum().to(torch::kFloat); }

// Sum over kept rows of -log softmax(logits[r, :vocab])[targets[r]], fp32 (0-dim), and, when
// `grad` is defined ((N, Vp), the logits' dtype), softmax - onehot into its first `vocab`
// columns (zero in ignored rows). A NaN logit makes its row's terms NaN (log_softmax keeps it).
torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& kept,
                                int64_t vocab, int64_t chunk_rows, const torch::Tensor& grad) {
  const int64_t N = logits.size(0);
  auto loss = torch::zeros({}, logits.options().dtype(torch::kFloat));  // ()
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, N - r0);
    auto z = logits.narrow(0, r0, n).narrow(1, 0, vocab);        // (n, V) view, row stride Vp
    auto ignored = kept.narrow(0, r0, n).logical_not().unsqueeze(1);  // (n, 1)
    auto t = targets.narrow(0, r0, n).unsqueeze(1).masked_fill(ignored, 0);  // (n, 1), a valid index everywhere
    auto lsm = at::log_softmax(z, 1, torch::kFloat);             // (n, V) fp32, chunk-sized
    loss.sub_(lsm.gather(1, t).masked_fill_(ignored, 0.0).sum());
    if (!grad.defined()) continue;
    auto p = lsm.exp_();                                         // (n, V) softmax, in place
    p.scatter_(1, t, p.gather(1, t) - 1.0);                      // - onehot(target)
    p.masked_fill_(ignored, 0.0);                                // ignored rows: no gradient
    grad.narrow(0, r0, n).narrow(1, 0, vocab).copy_(p);          // into the logits' dtype
  }
  return loss;
}

// The loss's gradient the forward saved, taken out of the context once: a second backward through
// the same loss is refused (the fused losses keep no graph to run again).
torch::Tensor take_saved_grad(torch::autograd::AutogradContext* ctx) {
  auto it = ctx->saved_data.find("grad");
  TORCH_CHECK(it != ctx->saved_data.end(),
              "GPT::loss: backward ran twice through one loss (retain_graph is not supported by the fused loss)");
  auto grad = it->second.toTensor();
  ctx->saved_data.erase(it);
  return grad;
}

// Autograd for the mean loss: the gradient was computed in forward; backward scales it by the
// incoming gradient over the rows counted, in place (it is this node's own buffer, used once).
class CrossEntropyRealVocab : public torch::autograd::Function<CrossEntropyRealVocab> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab, int64_t chunk_rows) {
    const int64_t N = logits.size(0), Vp = logits.size(1);
    auto grad = torch::empty({N, Vp}, logits.options());  // (N, Vp), the logits' dtype
    if (Vp > vocab) grad.narrow(1, vocab, Vp - vocab).zero_();
    const auto kept = kept_rows(targets, vocab);
    auto count = kept_count(kept);  // ()
    auto loss = cross_entropy_sum(logits, targets, kept, vocab, chunk_rows, grad);
    ctx->saved_data["grad"] = grad;
    ctx->saved_data["count"] = count;
    return loss / count;  // ()
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto grad = take_saved_grad(ctx);
    // No row counted: every row's gradient is zero already (and stays zero, not 0 * inf).
    const auto count = ctx->saved_data["count"].toTensor().clamp_min(1.0);
    grad.mul_(grad_out[0] / count);  // 0-dim tensors: no host sync
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The same loss on the CPU through cross_entropy_cpu.h's kernel (fp32 logits, a CPU with AVX2
// and FMA): one walk over each row, rows in parallel on LibTorch's intra-op threads. Forward
// writes the gradient, already divided by the rows counted, into a buffer of its own (the block
// cache hands the same pages back every step); backward scales it by the incoming gradient only
// when that is not 1. The rows' losses are summed in row order, in double: the same sum whatever
// the thread count.
torch::Tensor cpu_fused(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab, torch::Tensor* grad) {
  auto rows = logits.stride(1) == 1 ? logits : logits.contiguous();  // (N, Vp); rows may be strided
  auto ids = targets.to(torch::kLong).contiguous();                  // (N)
  const int64_t N = rows.size(0), Vp = rows.size(1);
  const int64_t* t = ids.data_ptr<int64_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < N; ++r) count += t[r] >= 0 && t[r] < vocab;
  auto row_loss = torch::empty({N}, rows.options());  // (N) fp32
  if (grad) *grad = torch::empty({N, Vp}, rows.options());  // (N, Vp) fp32
  const cpu_loss::Rows in{rows.data_ptr<float>(), rows.stride(0), vocab, Vp, t};
  float* g = grad ? grad->data_ptr<float>() : nullptr;
  const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
  float* loss_rows = row_loss.data_ptr<float>();
  at::parallel_for(0, N, /*grain_size=*/8, [&](int64_t begin, int64_t end) { cpu_loss::rows(in, loss_rows, g, scale, begin, end); });
  double sum = 0;
  for (int64_t r = 0; r < N; ++r) sum += loss_rows[r];
  // No row counted: 0/0 = NaN, as PyTorch's mean over no targets.
  return torch::scalar_tensor(static_cast<float>(sum / static_cast<double>(count)), rows.options());  // ()
}

class CrossEntropyFusedCpu : public torch::autograd::Function<CrossEntropyFusedCpu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab) {
    torch::Tensor grad;
    auto loss = cpu_fused(logits, targets, vocab, &grad);
    ctx->saved_data["grad"] = grad;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto grad = take_saved_grad(ctx);
    const float k = grad_out[0].item<float>();  // the CPU: no device to wait for
    if (k != 1.0f) grad.mul_(k);
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

#ifdef PIPELINE_HAVE_CUDA_LOSS
// The same loss on CUDA through the fused kernels (cross_entropy_cuda.h): forward keeps only
// each row's log-sum-exp; backward computes the gradient from the logits, which it keeps
// instead of a gradient buffer, and scales it by the incoming gradient read on the device.
cuda_loss::Rows rows_of(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab) {
  cuda_loss::Rows rows;
  rows.logits = logits.data_ptr();
  rows.bf16 = logits.scalar_type() == torch::kBFloat16;
  rows.rows = logits.size(0);
  rows.row_stride = logits.stride(0);
  rows.vocab = vocab;
  rows.padded = logits.size(1);
  rows.targets = targets.data_ptr<int64_t>();
  return rows;
}

// Returns the mean loss; `lse` gets each row's log-sum-exp and `count` the rows counted.
torch::Tensor fused_forward(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab, torch::Tensor& lse,
                            torch::Tensor& count) {
  const c10::cuda::CUDAGuard device(logits.device());
  const auto f32 = logits.options().dtype(torch::kFloat);
  lse = torch::empty({logits.size(0)}, f32);
  auto row_loss = torch::empty({logits.size(0)}, f32);
  cuda_loss::forward(rows_of(logits, targets, vocab), lse.data_ptr<float>(), row_loss.data_ptr<float>(),
                     c10::cuda::getCurrentCUDAStream(logits.device().index()).stream());
  count = kept_count(kept_rows(targets, vocab));
  return row_loss.sum() / count;  // ()
}

class CrossEntropyFusedCuda : public torch::autograd::Function<CrossEntropyFusedCuda> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab) {
    torch::Tensor lse, count;
    auto loss = fused_forward(logits, targets, vocab, lse, count);
    ctx->save_for_backward({logits, targets, lse, count});
    ctx->saved_data["vocab"] = vocab;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const c10::cuda::CUDAGuard device(logits.device());
    auto scale = (grad_out[0].to(torch::kFloat) / saved[3].clamp_min(1.0)).contiguous();  // 0-dim, on the device
    auto grad = torch::empty({logits.size(0), logits.size(1)}, logits.options());  // (N, Vp), contiguous
    cuda_loss::backward(rows_of(logits, saved[1], ctx->saved_data["vocab"].toInt()), saved[2].data_ptr<float>(),
                        scale.data_ptr<float>(), grad.data_ptr(),
                        c10::cuda::getCurrentCUDAStream(logits.device().index()).stream());
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};
#endif

// Whether the fused kernels can run on `device` (the build has them and an image for it).
bool fused_image_for(torch::Device device) {
#ifdef PIPELINE_HAVE_CUDA_LOSS
  if (!device.is_cuda()) return false;
  const c10::cuda::CUDAGuard guard(device);
  return cuda_loss::has_image_for_current_device();
#else
  (void)device;
  return false;
#endif
}

LossPath choose_for(torch::Device device, torch::ScalarType dtype, int64_t chunk_rows, bool image) {
  return choose_loss_path({.fused_built = fused_cross_entropy_built(),
                           .on_cuda = device.is_cuda(),
                           .dtype_supported = dtype == torch::kBFloat16 || dtype == torch::kFloat,
                           .chunk_rows = chunk_rows,
                           .image_for_device = image,
                           .on_cpu = device.is_cpu(),
                           .cpu_fp32 = dtype == torch::kFloat,
                           .cpu_kernel_runs = device.is_cpu() && cpu_loss::runs_here()});
}

torch::Tensor cross_entropy_as(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                               int64_t chunk_rows, bool fused) {
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
              "cross_entropy_real_vocab: expected logits (N, Vp) and targets (N), got ", logits.sizes(), " and ",
              targets.sizes());
  TORCH_CHECK(vocab >= 1 && vocab <= logits.size(1), "cross_entropy_real_vocab: vocab ", vocab, " outside [1, ",
              logits.size(1), "]");
  if (fused && logits.device().is_cpu()) {
    if (torch::GradMode::is_enabled() && logits.requires_grad()) return CrossEntropyFusedCpu::apply(logits, targets, vocab);
    return cpu_fused(logits, targets, vocab, nullptr);
  }
#ifdef PIPELINE_HAVE_CUDA_LOSS
  if (fused) {
    auto rows = logits.stride(1) == 1 ? logits : logits.contiguous();  // rows may be strided, columns not
    auto ids = targets.to(logits.device(), torch::kLong).contiguous();
    if (torch::GradMode::is_enabled() && logits.requires_grad()) return CrossEntropyFusedCuda::apply(rows, ids, vocab);
    torch::Tensor lse, count;
    return fused_forward(rows, ids, vocab, lse, count);
  }
#else
  (void)fused;
#endif
  if (chunk_rows <= 0) chunk_rows = default_chunk_rows(logits, vocab);
  auto ids = targets.to(logits.device(), torch::kLong);
  if (torch::GradMode::is_enabled() && logits.requires_grad())
    return CrossEntropyRealVocab::apply(logits, ids, vocab, chunk_rows);
  const auto kept = kept_rows(ids, vocab);
  return cross_entropy_sum(logits, ids, kept, vocab, chunk_rows, torch::Tensor()) / kept_count(kept);
}

}  // namespace

bool fused_cross_entropy_built() {
#ifdef PIPELINE_HAVE_CUDA_LOSS
  return true;
#else
  return false;
#endif
}

LossPath cross_entropy_path(torch::Device device, torch::ScalarType dtype, int64_t chunk_rows) {
  return choose_for(device, dtype, chunk_rows, fused_image_for(device));
}

torch::Tensor cross_entropy_real_vocab(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                                       int64_t chunk_rows) {
  return cross_entropy_as(logits, targets, vocab, chunk_rows,
                          cross_entropy_path(logits.device(), logits.scalar_type(), chunk_rows).fused);
}

LossPath GPTImpl::loss_path(torch::Device device, torch::ScalarType dtype) const {
  // Whether the kernels have an image for the device is a fact of the device: asked once per
  // device this model runs on, not at every step (and never inside a CUDA graph's capture).
  if (device.is_cuda() && image_device_ != device.index()) {
    image_ = fused_image_for(device);
    image_device_ = device.index();
  }
  return choose_for(device, dtype, 0, device.is_cuda() && image_);
}

torch::Tensor GPTImpl::loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
  TORCH_CHECK(logits.dim() == 3 && logits.size(2) == cfg_.padded_vocab_size,
              "GPT::loss: expected logits (B, T, ", cfg_.padded_vocab_size, "), got ", logits.sizes());
  TORCH_CHECK(targets.sizes() == logits.sizes().slice(0, 2), "GPT::loss: targets ", targets.sizes(),
              " do not match logits ", logits.sizes());
  // (B, T, Vp) -> (B*T, Vp) is a view of the contiguous logits.
  return cross_entropy_as(logits.reshape({-1, cfg_.padded_vocab_size}), targets.reshape({-1}), cfg_.vocab_size, 0,
                          loss_path(logits.device(), logits.scalar_type()).fused);
}

void GPTImpl::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const double std = 0.02;
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  // named_parameters() has a fixed order, so the draws are the same for a seed.
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    torch::Tensor fresh;
    const bool is_ln = name.find("ln_") != std::string::npos;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_bias) {
      fresh = torch::zeros(p.sizes());
    } else if (is_ln) {
      fresh = torch::ones(p.sizes());
    } else {
      const bool residual = name.find("c_proj.weight") != std::string::npos;
      fresh = torch::empty(p.sizes()).normal_(0.0, residual ? proj_std : std, gen);
    }
    p.copy_(fresh);
  }
}

int64_t GPTImpl::num_parameters() const {
  int64_t n = 0;
  std::unordered_set<const void*> seen;
  for (const auto& p : parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

void load_parameters(GPT& model, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  torch::NoGradGuard no_grad;
  auto params = model->named_parameters();
  std::unordered_map<std::string, const torch::Tensor*> given;
  for (const auto& [name, t] : named) {
    if (!params.contains(name)) {
      throw std::invalid_argument("load_parameters: tensor '" + name +
                                  "' is not a parameter of this model (different architecture?)");
    }
    given[name] = &t;
  }
  for (auto& item : params) {
    auto it = given.find(item.key());
    if (it == given.end()) {
      throw std::invalid_argument("load_parameters: parameter '" + item.key() + "' is missing");
    }
    const torch::Tensor& src = *it->second;
    if (src.sizes() != item.value().sizes()) {
      std::ostringstream os;
      os << "load_parameters: parameter '" << item.key() << "' has shape " << item.value().sizes()
         << " but the source has " << src.sizes();
      throw std::invalid_argument(os.str());
    }
    item.value().copy_(src);
  }
}

}  // namespace pipeline::model
