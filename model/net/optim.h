// AdamW with GPT-2 style weight-decay groups and a device-side learning rate and step count,
// plus gradient-norm clipping; neither makes a host sync on CUDA.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace pipeline::model {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Defaults are GPT-2 / nanoGPT's (betas 0.9/0.95, weight decay 0.1 on matrices only).
///
/// Example:
///   AdamW opt(model->named_parameters(), AdamWOptions{.lr = 3e-4, .weight_decay = 0.0});
struct AdamWOptions {
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool fused = true;  // at::_fused_adamw_ (CPU and CUDA kernels); false: plain tensor ops
};

/// AdamW over two groups: parameters with dim >= 2 (matrices, embeddings) decay, the rest
/// (biases, LayerNorm) do not. State (moments, a float32 step per parameter, the learning rate)
/// lives on the parameters' device, so step() and set_lr() enqueue work and never wait.
/// Parameters must all be on one device, and the optimizer is built after the model is moved.
class AdamW {
 public:
  AdamW(const torch::OrderedDict<std::string, torch::Tensor>& named_params, AdamWOptions options = {});
  AdamW(const NamedTensors& named_params, AdamWOptions options = {});

  /// One update of every parameter that has a gradient (those without are skipped).
  void step();
  /// The same, unless `found_inf` (0-dim float32 on the parameters' device) is 1: then nothing
  /// changes, neither weights nor moments nor step counts, whatever the gradients hold (NaN
  /// included). Decided on the device, with no host sync (model/net/spike_guard.h).
  void step(const torch::Tensor& found_inf);
  /// Drops the gradients (set to undefined, as PyTorch's set_to_none=True).
  void zero_grad();

  /// Writes the learning rate into the device tensor (a fill kernel, not a sync).
  void set_lr(double lr);
  /// Copies a 0-dim rate computed on the device (no sync; lr() is then unknown, NaN).
  void set_lr(const torch::Tensor& lr);
  double lr() const { return lr_host_; }
  const AdamWOptions& options() const { return options_; }

  /// Names of the parameters in the decaying / non-decaying group, in model order.
  const std::vector<std::string>& decay_names() const { return groups_[0].names; }
  const std::vector<std::string>& no_decay_names() const { return groups_[1].names; }

  /// State for checkpoints: "exp_avg/<param>", "exp_avg_sq/<param>", "step/<param>" and "lr",
  /// referencing the live device tensors (copy them before the next step if kept).
  NamedTensors state() const;
  /// Copies a state() back in; every name must be present with the right shape.
  void load_state(const NamedTensors& state);

 private:
  struct Group {
    double weight_decay = 0.0;
    std::vector<std::string> names;
    std::vector<torch::Tensor> params, exp_avgs, exp_avg_sqs, steps;
  };
  void init(const NamedTensors& named_params);
  void step_group(Group& g, const std::vector<size_t>& active, const torch::Tensor* found_inf);
  void step_all(const torch::Tensor* found_inf);

  AdamWOptions options_;
  Group groups_[2];  // [0] decay, [1] no decay
  torch::Tensor lr_;  // 0-dim float32 on the parameters' device
  double lr_host_;
};

/// Scales all gradients so that their global L2 norm is at most max_norm, and returns the norm
/// before clipping as a 0-dim float32 tensor on the gradients' device. No host sync: the
/// clip factor min(1, max_norm / (norm + 1e-6)) stays a tensor. Params without grads are skipped.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace pipeline::model
