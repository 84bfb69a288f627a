// See recompute.h. Three custom autograd functions: two that recompute an elementwise op (llm.c's
// way), one that recomputes a whole block (torch.utils.checkpoint's reentrant way).
#include "model/net/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <stdexcept>

#include "model/net/autocast.h"

namespace pipeline::model {

Recompute parse_recompute(std::string_view name) {
  if (name == "none") return Recompute::none;
  if (name == "mlp") return Recompute::mlp;
  if (name == "block") return Recompute::block;
  throw std::invalid_argument("recompute: expected \"none\", \"mlp\" or \"block\", got \"" + std::string(name) + "\"");
}

std::string recompute_name(Recompute r) {
  switch (r) {
    case Recompute::mlp: return "mlp";
    case Recompute::block: return "block";
    default: return "none";
  }
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kLayerNormEps = 1e-5;  // GPT-2's, as LayerNormImpl

// The dtype a linear computes in here: autocast's for the tensor's device when it is on (the
// forward runs inside the caller's autocast region), the weight's otherwise.
at::ScalarType compute_dtype(const torch::Tensor& x, const torch::Tensor& weight) {
  const auto device = x.device().type();
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : weight.scalar_type();
}

torch::Tensor cast(const torch::Tensor& t, at::ScalarType dtype) {
  return t.defined() && t.scalar_type() != dtype ? t.to(dtype) : t;
}

// A linear's backward as autograd computes it for at::linear on contiguous (B, T, in) input,
// which folds it into addmm(bias, x2d, W^T): the same matmuls in the same order. g (.., out),
// h (.., in), w (out, in), all in the compute dtype. Returns the gradients of h, w and b (b
// undefined when there is none).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> linear_backward(const torch::Tensor& g, const torch::Tensor& h,
                                                                        const torch::Tensor& w, bool has_bias) {
  const int64_t out = w.size(0), in = w.size(1);
  auto g2 = g.reshape({-1, out});  // (N, out)
  auto h2 = h.reshape({-1, in});   // (N, in)
  auto grad_h = g2.mm(w).view(h.sizes());  // (.., in)
  auto grad_w = g2.t().mm(h2);             // (out, in)
  auto grad_b = has_bias ? g2.sum(0) : torch::Tensor();  // (out)
  return {grad_h, grad_w, grad_b};
}

// The gradient of a parameter leaves the function in the parameter's dtype, as autocast's cast
// does in backward.
torch::Tensor like(const torch::Tensor& grad, const torch::Tensor& param) {
  return grad.defined() ? cast(grad, param.scalar_type()) : grad;
}

class LayerNormLinear : public torch::autograd::Function<LayerNormLinear> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& ln_weight,
                               const torch::Tensor& ln_bias, const torch::Tensor& weight, const torch::Tensor& bias) {
    const auto dtype = compute_dtype(x, weight);
    auto h = std::get<0>(at::native_layer_norm(x, {x.size(-1)}, ln_weight, ln_bias, kLayerNormEps));  // (B, T, C)
    auto w = cast(weight, dtype);
    auto y = at::linear(cast(h, dtype), w, cast(bias, dtype));  // (B, T, out)
    // The cast weight is what autograd keeps for an autocast linear too; h is not kept.
    ctx->save_for_backward({x, ln_weight, ln_bias, w, weight, bias});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &ln_weight = saved[1], &ln_bias = saved[2], &w = saved[3], &weight = saved[4],
               &bias = saved[5];
    auto [h, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, ln_weight, ln_bias, kLayerNormEps);  // again
    auto g = cast(grad_out[0], w.scalar_type()).contiguous();
    auto [grad_h, grad_w, grad_b] = linear_backward(g, cast(h, w.scalar_type()), w, bias.defined());
    auto [grad_x, grad_ln_w, grad_ln_b] =
        at::native_layer_norm_backward(cast(grad_h, h.scalar_type()), x, {x.size(-1)}, mean, rstd, ln_weight, ln_bias,
                                       {true, ln_weight.defined(), ln_bias.defined()});
    return {grad_x, grad_ln_w, grad_ln_b, like(grad_w, weight), like(grad_b, bias)};
  }
};

class GeluLinear : public torch::autograd::Function<GeluLinear> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& u, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
    const auto dtype = compute_dtype(u, weight);
    auto w = cast(weight, dtype);
    auto y = at::linear(cast(at::gelu(u, "tanh"), dtype), w, cast(bias, dtype));  // (B, T, out)
    ctx->save_for_backward({u, w, weight, bias});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &u = saved[0], &w = saved[1], &weight = saved[2], &bias = saved[3];
    auto g = cast(grad_out[0], w.scalar_type()).contiguous();
    auto [grad_a, grad_w, grad_b] = linear_backward(g, cast(at::gelu(u, "tanh"), w.scalar_type()), w, bias.defined());
    auto grad_u = at::gelu_backward(cast(grad_a, u.scalar_type()), u, "tanh");
    return {grad_u, like(grad_w, weight), like(grad_b, bias)};
  }
};

// What the block's backward needs besides x: how to run it again, and under what state.
struct Rerun : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> run;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
  bool same_rng = false;
  torch::Tensor cpu_rng;                 // the CPU generator's state before the forward
  std::optional<torch::Tensor> cuda_rng;  // and the CUDA one's, for a tensor on CUDA
  c10::DeviceIndex cuda_index = -1;
};

at::Generator cuda_generator(c10::DeviceIndex index) {
  return at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CUDA, index));
}

torch::Tensor state_of(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_state(at::Generator gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Sets the generators to the forward's states for the recomputation and puts back what they were.
class SameRandomness {
 public:
  explicit SameRandomness(const Rerun& r) : r_(r) {
    if (!r_.same_rng) return;
    cpu_now_ = state_of(at::globalContext().defaultGenerator(c10::DeviceType::CPU));
    set_state(at::globalContext().defaultGenerator(c10::DeviceType::CPU), r_.cpu_rng);
    if (r_.cuda_rng) {
      cuda_now_ = state_of(cuda_generator(r_.cuda_index));
      set_state(cuda_generator(r_.cuda_index), *r_.cuda_rng);
    }
  }
  ~SameRandomness() {
    if (!r_.same_rng) return;
    set_state(at::globalContext().defaultGenerator(c10::DeviceType::CPU), cpu_now_);
    if (r_.cuda_rng) set_state(cuda_generator(r_.cuda_index), cuda_now_);
  }
  SameRandomness(const SameRandomness&) = delete;
  SameRandomness& operator=(const SameRandomness&) = delete;

 private:
  const Rerun& r_;
  torch::Tensor cpu_now_, cuda_now_;
};

class Checkpoint : public torch::autograd::Function<Checkpoint> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList params,
                               c10::intrusive_ptr<Rerun> rerun) {
    // x, then the parameters (inputs so that autograd routes their gradients, which backward
    // computes, to them; kept as references, not copies).
    std::vector<torch::Tensor> kept{x};
    kept.insert(kept.end(), params.begin(), params.end());
    ctx->save_for_backward(kept);
    ctx->saved_data["rerun"] = c10::IValue::make_capsule(rerun);
    return rerun->run(x);  // grad mode is off inside forward: nothing is recorded
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto rerun = c10::static_intrusive_pointer_cast<Rerun>(ctx->saved_data["rerun"].toCapsule());
    auto inputs = ctx->get_saved_variables();  // x, then the parameters in the order they were passed
    auto x = inputs[0].detach().requires_grad_(true);
    inputs[0] = x;
    torch::Tensor y;
    {
      // Backward runs on autograd's thread for the device (CUDA) with grad mode off and no
      // autocast: the forward's state is set here for the recomputation.
      torch::AutoGradMode grad(true);
      SameRandomness rng(*rerun);
      AutocastGuard autocast(rerun->device_type, rerun->autocast, rerun->autocast_dtype);
      y = rerun->run(x);
    }
    auto grads = torch::autograd::grad({y}, inputs, {grad_out[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    grads.push_back(torch::Tensor());  // the Rerun argument
    return grads;
  }
};

}  // namespace

torch::Tensor layer_norm_linear(const torch::Tensor& x, const torch::Tensor& ln_weight, const torch::Tensor& ln_bias,
                                const torch::Tensor& weight, const torch::Tensor& bias) {
  return LayerNormLinear::apply(x, ln_weight, ln_bias, weight, bias);
}

torch::Tensor gelu_linear(const torch::Tensor& u, const torch::Tensor& weight, const torch::Tensor& bias) {
  return GeluLinear::apply(u, weight, bias);
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& run, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& params, bool same_rng) {
  auto rerun = c10::make_intrusive<Rerun>();
  rerun->run = run;
  rerun->device_type = x.device().type();
  rerun->autocast = at::autocast::is_autocast_enabled(rerun->device_type);
  rerun->autocast_dtype = at::autocast::get_autocast_dtype(rerun->device_type);
  rerun->same_rng = same_rng;
  if (same_rng) {
    rerun->cpu_rng = state_of(at::globalContext().defaultGenerator(c10::DeviceType::CPU));
    if (x.is_cuda()) {
      rerun->cuda_index = x.device().index();
      rerun->cuda_rng = state_of(cuda_generator(rerun->cuda_index));
    }
  }
  return Checkpoint::apply(x, at::TensorList(params), rerun);
}

}  // namespace pipeline::model
