// A training step as CUDA graphs: forward + backward (per micro-batch) and clip + AdamW, each
// captured once into a private memory pool and replayed every step, so the host launches a
// handful of graphs instead of hundreds of kernels (C++ has no torch.compile; this is what
// "reduce-overhead" does). Off by default ([training] cuda_graph) until measured on a GPU:
// build-nanogpt found it slightly slower for 124M.
//
// What makes the step capturable (DESIGN.md): the fused AdamW with its learning rate in a
// device tensor and a float32 step tensor per parameter (model/net/optim.h), clipping with
// _foreach_norm / _foreach_mul_ and a tensor coefficient, and static inputs: a batch's (B, T+1)
// rows are widened into two fixed (B, T) int64 buffers, x = rows[:, :T] and y = rows[:, 1:], that
// the graphs read.
//
// Graphs (sharing one pool, replayed in the order they were captured):
//   first  micro-batch 0: forward, backward into gradients that did not exist (they become
//          the graph's static gradients), loss -> the loss sum
//   accum  micro-batches 1..accum-1: forward, backward accumulating into those gradients
//   update clip + AdamW (with a spike guard: clip, the guard's verdict and learning rate, then
//          AdamW told by the verdict whether to change anything; model/net/spike_guard.h)
// The caller runs ~3 eager steps first (cuBLAS handles, workspaces and the optimizer's first
// state are made outside capture), with zero_grad(set_to_none) after each; after capture it must
// not touch the gradients again (they live in the graph's pool).
#pragma once

#include <memory>
#include <utility>

#include "model/net/gpt2.h"
#include "model/net/optim.h"
#include "model/net/spike_guard.h"

namespace pipeline::model {

struct CapturedStepOptions {
  int64_t B = 8, T = 1024;  // micro-batch shape
  int64_t accum = 1;        // micro-batches per optimizer step
  double grad_clip = 1.0;   // 0: no clipping (the norm is still computed)
  bool autocast = true;     // bf16 autocast around forward and loss
  /// Judged inside the update graph, which then takes its learning rate from the guard (the
  /// caller keeps it alive as long as this object); null: no guard.
  SpikeGuard* guard = nullptr;
};

/// Example (on the thread and stream that train, after 3 eager steps):
///   CapturedStep graphs(model, opt, {.B = 16, .T = 1024});
///   graphs.micro_batch(rows_on_device, 0);            // captures on first use, then replays
///   auto [loss, norm] = graphs.update(lr);             // static device tensors: copy them out
class CapturedStep {
 public:
  /// Needs a CUDA model, and a non-default current stream (capture cannot run on the legacy one).
  CapturedStep(GPT model, AdamW& optimizer, CapturedStepOptions options);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  /// Micro-batch `micro` (0-based) of a step: widens `rows` ((B, T+1) uint16 or int64 on the
  /// device, readable on the current stream) into the static inputs, then replays forward and
  /// backward (capturing them first the first time).
  void micro_batch(const torch::Tensor& rows, int64_t micro);

  /// Writes `lr` into the optimizer's device tensor and replays clip + AdamW. Returns the loss
  /// (mean over the step's micro-batches) and the gradient norm before clipping, 0-dim fp32
  /// device tensors that the next step overwrites: copy them out on the same stream first. With
  /// a guard, `lr` is not used (the guard's table gives the rate) and its verdict() is this step's.
  std::pair<torch::Tensor, torch::Tensor> update(double lr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeline::model
