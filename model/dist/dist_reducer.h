// Gradient averaging for data-parallel training: c10d's Reducer (the engine of PyTorch's
// DistributedDataParallel) on the group's process group. It hooks each parameter's gradient
// accumulator, packs gradients into buckets (about 25 MB; the first 1 MB, so communication starts
// early in backward) in the order they become ready, and all-reduces each bucket as soon as it is
// full, while backward goes on computing the rest. The result is divided by the world size: the
// average. On CUDA the NCCL all-reduces run on NCCL's own stream, ordered after the gradient
// kernels and before the optimizer by CUDA events; the host never waits. Bucket order is rebuilt
// once, after the first synchronised backward, from the order gradients actually arrived (as DDP).
//
// c10d::Reducer is exported by libtorch_cpu but is not a documented C++ API; this wrapper is the
// only place that touches it. Per step, with grad_accum micro-batches:
//   for each micro-batch: if (last) r.before_forward();  forward;  r.before_backward(loss, last);  backward
// Micro-batches before the last accumulate locally (as DDP's no_sync); the last one's backward
// all-reduces the accumulated gradients.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "model/dist/dist_group.h"

namespace pipeline::dist {

struct ReducerOptions {
  int64_t bucket_bytes = int64_t(25) << 20;       // c10d's default bucket cap
  int64_t first_bucket_bytes = int64_t(1) << 20;  // c10d's default first bucket
};

class GradientReducer {
 public:
  /// `params`: the model's parameters, each once, all requiring grad, on one device.
  GradientReducer(Group& group, const std::vector<torch::Tensor>& params, ReducerOptions options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Before the forward pass of a step's last micro-batch (may rebuild the buckets: a collective).
  void before_forward();
  /// Before backward: with `sync`, this backward's gradients are averaged over the ranks.
  void before_backward(const torch::Tensor& loss, bool sync);

  /// Buckets and their sizes in bytes, in reduction order.
  std::vector<int64_t> bucket_sizes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The buckets c10d would assign to `params` (sizes in bytes, in reduction order), without a
/// process group: for reporting (bench and `pipeline run`'s start-up line).
std::vector<int64_t> plan_buckets(const std::vector<torch::Tensor>& params, ReducerOptions options = {});

}  // namespace pipeline::dist
