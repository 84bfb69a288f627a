// Activation recompute ([training] recompute): memory traded for compute in backward, so that a
// larger micro-batch, or a larger model, fits a GPU.
//
//   none   autograd keeps what each op needs for backward (per layer and token, under bf16
//          autocast: about 38·C bytes, C the width).
//   mlp    as llm.c's recompute: the LayerNorms' outputs (what c_attn and c_fc multiply) and the
//          GELU's output (what the MLP's c_proj multiplies) are not kept but computed again in
//          backward from what is kept anyway (the LayerNorm's input, the GELU's input): a
//          LayerNorm and a GELU more per layer, no matmul more; about 12·C of the 38·C saved.
//   block  as torch.utils.checkpoint: only each block's input is kept; backward runs the block's
//          forward again, under grad mode, before its backward: about one forward more per step,
//          and per layer 4·C bytes a token kept instead of 38·C.
//
// Either way the losses and gradients are those of `none` (tests/test_model.cpp, fp32 on the
// CPU, to 1e-6): the recomputation runs the same kernels on the same inputs, under the autocast
// state of the forward, and with dropout the same masks (block restores the generators' states
// the forward saw, as torch.utils.checkpoint does).
#pragma once

#include <torch/torch.h>

#include <string>
#include <string_view>

namespace pipeline::model {

enum class Recompute { none, mlp, block };

/// "none", "mlp" or "block"; throws std::invalid_argument naming the value and the choices.
Recompute parse_recompute(std::string_view name);
std::string recompute_name(Recompute r);

/// layer_norm(x; ln_weight, ln_bias, eps 1e-5) followed by linear(·; weight, bias), keeping for
/// backward x and the weight only: the LayerNorm's output is computed again there. Under
/// autocast the linear runs in the autocast dtype, as at::linear would. x (B, T, C) -> (B, T, out).
torch::Tensor layer_norm_linear(const torch::Tensor& x, const torch::Tensor& ln_weight, const torch::Tensor& ln_bias,
                                const torch::Tensor& weight, const torch::Tensor& bias);

/// linear(gelu_tanh(u); weight, bias), keeping u and the weight only: the GELU's output is
/// computed again in backward. u (B, T, 4C) -> (B, T, out).
torch::Tensor gelu_linear(const torch::Tensor& u, const torch::Tensor& weight, const torch::Tensor& bias);

/// `run(x)` whose backward keeps only x: forward runs without recording anything; backward runs
/// `run` again on x under grad mode (with the forward's autocast state and, when `same_rng`, the
/// CPU and CUDA generator states the forward saw) and backpropagates through it. `params` are the
/// tensors `run` reads that need gradients (a block's parameters), in a fixed order.
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& run, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& params, bool same_rng);

}  // namespace pipeline::model
