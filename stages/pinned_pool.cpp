// See pinned_pool.h.
#include "stages/pinned_pool.h"

#include <c10/core/DeviceGuard.h>

#include <optional>
#include <stdexcept>

#include "model/device/device_event.h"

namespace pipeline::stages {

void release_after(std::shared_ptr<WindowLease> lease, c10::Stream stream, model::HostCallbacks& callbacks) {
  callbacks.after(stream, [lease = std::move(lease)]() mutable { lease.reset(); });
}

WindowPool::WindowPool(int count, int64_t rows, int64_t cols, c10::Device device)
    : gate_(std::make_shared<graph::ResourcePool>(count)), rows_(rows), cols_(cols), device_(device) {
  for (int i = 0; i < count; ++i) buffers_.push_back(fresh());
}

torch::Tensor WindowPool::fresh() const {
  const bool pinned = device_.is_cuda();
  // The guard makes device_ current only for this allocation, and torch's guard does not create
  // a context on the device it restores.
  c10::OptionalDeviceGuard guard(pinned ? std::optional<c10::Device>(device_) : std::nullopt);
  return torch::empty({rows_, cols_}, torch::TensorOptions().dtype(torch::kUInt16).pinned_memory(pinned));
}

WindowPool::Window WindowPool::window(int index) {
  return Window{buffers_[static_cast<size_t>(index)], std::make_shared<WindowLease>(gate_, index)};
}

std::optional<WindowPool::Window> WindowPool::reserved() {
  // acquire() reports "no reservation left" by throwing; here that is an expected answer.
  try {
    return window(gate_->acquire());
  } catch (const std::logic_error&) {
    return std::nullopt;
  }
}

std::optional<WindowPool::Window> WindowPool::spare() {
  if (auto i = gate_->try_acquire()) return window(*i);
  return std::nullopt;
}

WindowPool::Window WindowPool::overflow() {
  overflows_.fetch_add(1, std::memory_order_relaxed);
  // Pageable, never pinned: pinning takes the driver's lock and can take milliseconds, and pack
  // runs on a TBB worker. The copy out of pageable memory is staged by the driver before the
  // copy call returns, so the buffer may go as soon as h2d lets go of it.
  return Window{torch::empty({rows_, cols_}, torch::TensorOptions().dtype(torch::kUInt16)), nullptr};
}

}  // namespace pipeline::stages
