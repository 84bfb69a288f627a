// RAII guard for bf16 autocast on CPU or CUDA (LibTorch has no C++ autocast guard).
//
// Autocast state is thread-local: create and destroy the guard on the same thread, around the
// forward pass and the loss only; run backward outside it (as torch.autocast is used in Python).
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>

namespace pipeline::model {

/// Enables autocast to `dtype` (bf16 by default; CUDA's own default would be fp16) for one
/// device type, restoring the previous enabled flag and dtype on exit. Nested guards work: the
/// cast cache is cleared when the outermost autocast region ends.
///
/// Example:
///   {
///     AutocastGuard autocast(device.type());
///     loss = model->loss(model(x), y);
///   }
///   loss.backward();
class AutocastGuard {
 public:
  explicit AutocastGuard(c10::DeviceType device_type, bool enabled = true,
                         at::ScalarType dtype = at::kBFloat16)
      : device_type_(device_type),
        prev_enabled_(at::autocast::is_autocast_enabled(device_type)),
        prev_dtype_(at::autocast::get_autocast_dtype(device_type)) {
    at::autocast::set_autocast_dtype(device_type_, dtype);
    at::autocast::set_autocast_enabled(device_type_, enabled);
    at::autocast::increment_nesting();
  }

  ~AutocastGuard() {
    // Cached bf16 copies of the weights are only valid for this step's weights.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
  }

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

}  // namespace pipeline::model
