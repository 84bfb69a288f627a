// c10d::Reducer behind a small interface (see dist_reducer.h).
#include "model/dist/dist_reducer.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "model/dist/dist_internal.h"

namespace pipeline::dist {
namespace {

// DDP hands the reducer its parameters in reverse order: gradients arrive roughly from the last
// layer to the first, so the first buckets fill first.
std::vector<at::Tensor> reversed(const std::vector<torch::Tensor>& params) {
  return std::vector<at::Tensor>(params.rbegin(), params.rend());
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<at::Tensor>& params, const ReducerOptions& o) {
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      params, {static_cast<size_t>(o.first_bucket_bytes), static_cast<size_t>(o.bucket_bytes)},
      std::vector<bool>(params.size(), false));
  (void)limits;
  return buckets;
}

std::vector<int64_t> sizes_of(const std::vector<std::vector<size_t>>& buckets, const std::vector<at::Tensor>& params) {
  std::vector<int64_t> out;
  for (const auto& b : buckets) {
    int64_t bytes = 0;
    for (size_t i : b) bytes += params[i].numel() * static_cast<int64_t>(params[i].element_size());
    out.push_back(bytes);
  }
  return out;
}

}  // namespace

struct GradientReducer::Impl {
  std::vector<at::Tensor> params;
  std::unique_ptr<c10d::Reducer> reducer;
};

GradientReducer::GradientReducer(Group& group, const std::vector<torch::Tensor>& params, ReducerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->params = reversed(params);
  for (const auto& p : impl_->params)
    TORCH_CHECK(p.requires_grad(), "GradientReducer: every parameter must require grad");
  auto buckets = assign_buckets(impl_->params, options);
  impl_->reducer = std::make_unique<c10d::Reducer>(
      impl_->params, std::move(buckets), detail::process_group_of(group), std::vector<bool>(impl_->params.size(), false),
      options.bucket_bytes, /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/false,
      std::unordered_map<size_t, std::string>{}, options.first_bucket_bytes,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false, std::vector<int64_t>{});
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::before_forward() { impl_->reducer->rebuild_buckets(); }

void GradientReducer::before_backward(const torch::Tensor& loss, bool sync) {
  // Without prepare_for_backward the reducer's hooks do nothing: gradients accumulate locally.
  if (sync) impl_->reducer->prepare_for_backward({loss});
}

std::vector<int64_t> GradientReducer::bucket_sizes() const {
  std::vector<int64_t> out;
  auto buckets = impl_->reducer->get_grad_buckets(/*return_zero_tensors=*/true);
  for (auto& b : buckets) out.push_back(b.getBufferRef().numel() * static_cast<int64_t>(b.getBufferRef().element_size()));
  return out;
}

std::vector<int64_t> plan_buckets(const std::vector<torch::Tensor>& params, ReducerOptions options) {
  auto p = reversed(params);
  return sizes_of(assign_buckets(p, options), p);
}

}  // namespace pipeline::dist
