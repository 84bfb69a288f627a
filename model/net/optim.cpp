// AdamW (fused kernel or plain tensor ops, both without host syncs) and gradient clipping.
#include "model/net/optim.h"

#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace pipeline::model {

namespace {

NamedTensors to_named(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  NamedTensors out;
  out.reserve(dict.size());
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

AdamW::AdamW(const torch::OrderedDict<std::string, torch::Tensor>& named_params, AdamWOptions options)
    : AdamW(to_named(named_params), options) {}

AdamW::AdamW(const NamedTensors& named_params, AdamWOptions options)
    : options_(options), lr_host_(options.lr) {
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("AdamW: " + what);
  };
  check(options.lr >= 0.0, "lr must be >= 0, got " + std::to_string(options.lr));
  check(options.beta1 >= 0.0 && options.beta1 < 1.0,
        "beta1 must be in [0, 1), got " + std::to_string(options.beta1));
  check(options.beta2 >= 0.0 && options.beta2 < 1.0,
        "beta2 must be in [0, 1), got " + std::to_string(options.beta2));
  check(options.eps > 0.0, "eps must be > 0, got " + std::to_string(options.eps));
  check(options.weight_decay >= 0.0,
        "weight_decay must be >= 0, got " + std::to_string(options.weight_decay));
  check(!named_params.empty(), "no parameters to optimise");
  init(named_params);
}

void AdamW::init(const NamedTensors& named_params) {
  const torch::Device device = named_params.front().second.device();
  groups_[0].weight_decay = options_.weight_decay;
  groups_[1].weight_decay = 0.0;
  for (const auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    if (p.device() != device) {
      std::ostringstream os;
      os << "AdamW: parameter '" << name << "' is on " << p.device() << " but '"
         << named_params.front().first << "' is on " << device << " (one device per optimizer)";
      throw std::invalid_argument(os.str());
    }
    Group& g = groups_[p.dim() >= 2 ? 0 : 1];
    g.names.push_back(name);
    g.params.push_back(p);
    g.exp_avgs.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    g.exp_avg_sqs.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    // The fused kernels want a float32 step tensor per parameter on the parameter's device.
    g.steps.push_back(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device)));
  }
  lr_ = torch::full({}, options_.lr, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

void AdamW::set_lr(double lr) {
  lr_host_ = lr;
  lr_.fill_(lr);
}

void AdamW::zero_grad() {
  for (auto& g : groups_) {
    for (auto& p : g.params) p.mutable_grad().reset();
  }
}

void AdamW::set_lr(const torch::Tensor& lr) {
  lr_host_ = std::numeric_limits<double>::quiet_NaN();
  lr_.copy_(lr.reshape({}));
}

void AdamW::step() { step_all(nullptr); }

void AdamW::step(const torch::Tensor& found_inf) {
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == torch::kFloat && found_inf.device() == lr_.device(),
              "AdamW::step: found_inf must be one float32 on ", lr_.device(), ", got ", found_inf.sizes(), " ",
              found_inf.scalar_type(), " on ", found_inf.device());
  step_all(&found_inf);
}

void AdamW::step_all(const torch::Tensor* found_inf) {
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) {
    std::vector<size_t> active;
    active.reserve(g.params.size());
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (g.params[i].grad().defined()) active.push_back(i);
    }
    if (!active.empty()) step_group(g, active, found_inf);
  }
}

void AdamW::step_group(Group& g, const std::vector<size_t>& active, const torch::Tensor* found_inf) {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  for (size_t i : active) {
    params.push_back(g.params[i]);
    grads.push_back(g.params[i].grad());
    exp_avgs.push_back(g.exp_avgs[i]);
    exp_avg_sqs.push_back(g.exp_avg_sqs[i]);
    steps.push_back(g.steps[i]);
  }
  const double b1 = options_.beta1, b2 = options_.beta2;
  // Both kernels read the already-incremented step for the bias correction (as torch.optim does).
  // A skipped step adds 0 (1 - found_inf): the count stays, exactly.
  if (found_inf)
    at::_foreach_add_(steps, 1.0 - *found_inf);
  else
    at::_foreach_add_(steps, 1);
  if (options_.fused) {
    // found_inf = 1: the kernel returns before touching anything (AMP's skipped step).
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr_, b1,
                      b2, g.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt,
                      found_inf ? std::optional<torch::Tensor>(*found_inf) : std::optional<torch::Tensor>());
    return;
  }
  // Plain version, kept as a cross-check of the fused kernel: every scalar that depends on the
  // step or the learning rate stays a tensor, so this path does not sync either. A step that may
  // be skipped is computed in place as usual and then undone where found_inf says so, from copies.
  std::vector<torch::Tensor> before;
  if (found_inf)
    for (size_t i = 0; i < params.size(); ++i)
      before.insert(before.end(), {params[i].clone(), exp_avgs[i].clone(), exp_avg_sqs[i].clone()});
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    const auto& grad = grads[i];
    if (g.weight_decay != 0.0) p.mul_(1.0 - lr_ * g.weight_decay);
    exp_avgs[i].lerp_(grad, 1.0 - b1);
    exp_avg_sqs[i].mul_(b2).addcmul_(grad, grad, 1.0 - b2);
    auto bias1 = 1.0 - torch::pow(b1, steps[i]);  // 0-dim
    auto bias2_sqrt = (1.0 - torch::pow(b2, steps[i])).sqrt();  // 0-dim
    auto denom = (exp_avg_sqs[i].sqrt() / bias2_sqrt).add_(options_.eps);
    p.sub_(exp_avgs[i] / denom * (lr_ / bias1));
  }
  if (!found_inf) return;
  const auto skip = found_inf->reshape({}).gt(0.5);  // () bool
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].copy_(torch::where(skip, before[3 * i], params[i]));
    exp_avgs[i].copy_(torch::where(skip, before[3 * i + 1], exp_avgs[i]));
    exp_avg_sqs[i].copy_(torch::where(skip, before[3 * i + 2], exp_avg_sqs[i]));
  }
}

NamedTensors AdamW::state() const {
  NamedTensors out;
  for (const auto& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      out.emplace_back("exp_avg/" + g.names[i], g.exp_avgs[i]);
      out.emplace_back("exp_avg_sq/" + g.names[i], g.exp_avg_sqs[i]);
      out.emplace_back("step/" + g.names[i], g.steps[i]);
    }
  }
  out.emplace_back("lr", lr_);
  return out;
}

void AdamW::load_state(const NamedTensors& state) {
  torch::NoGradGuard no_grad;
  std::unordered_map<std::string, const torch::Tensor*> given;
  for (const auto& [name, t] : state) given[name] = &t;
  auto load = [&](const std::string& name, torch::Tensor& dst) {
    auto it = given.find(name);
    if (it == given.end()) {
      throw std::invalid_argument("AdamW::load_state: '" + name + "' is missing from the state");
    }
    if (it->second->sizes() != dst.sizes()) {
      std::ostringstream os;
      os << "AdamW::load_state: '" << name << "' has shape " << it->second->sizes()
         << ", expected " << dst.sizes();
      throw std::invalid_argument(os.str());
    }
    dst.copy_(*it->second);
  };
  for (auto& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      load("exp_avg/" + g.names[i], g.exp_avgs[i]);
      load("exp_avg_sq/" + g.names[i], g.exp_avg_sqs[i]);
      load("step/" + g.names[i], g.steps[i]);
    }
  }
  auto it = given.find("lr");
  if (it != given.end()) {
    // The host shadow is only for display; reading it back is a tiny CPU copy at load time.
    lr_host_ = it->second->to(torch::kCPU).item<double>();
    lr_.copy_(*it->second);
  }
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  TORCH_CHECK(!grads.empty(), "clip_grad_norm: no parameter has a gradient");
  auto norms = at::_foreach_norm(grads, 2, torch::kFloat);  // one 0-dim tensor per grad
  auto total = torch::linalg_vector_norm(torch::stack(norms), 2);  // 0-dim float32
  auto coef = (max_norm / (total + 1e-6)).clamp_max(1.0);  // 0-dim, stays on the device
  at::_foreach_mul_(grads, coef);
  return total;
}

}  // namespace pipeline::model
