// Per-step objects that train hands to other stages (CUDA events, pinned host scalars), reused
// once every other holder has let go instead of being created and destroyed every step. The
// owner is the only one that hands them out, so a use count of 1 means no one else holds the
// object and no one else can take it again: reusing it is safe. (The acquire fence pairs with
// the release of the last other holder's decrement, so what that holder did with the object,
// such as waiting on the event, happens before it is reused.)
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace pipeline::model {

/// Objects handed out as shared_ptr and taken back when the pool holds the only reference.
///
/// Example (one timing event per phase, re-recorded when log is done with the step):
///   ReusePool<DeviceEvent> events([] { return std::make_shared<DeviceEvent>(DeviceEvent::Kind::timing); });
///   span.start = events.take();
template <class T>
class ReusePool {
 public:
  explicit ReusePool(std::function<std::shared_ptr<T>()> make) : make_(std::move(make)) {}

  /// An object that nobody else holds (a new one when every pooled object is out).
  std::shared_ptr<T> take() {
    for (size_t i = 0; i < items_.size(); ++i) {
      auto& p = items_[(next_ + i) % items_.size()];
      if (p.use_count() == 1) {
        std::atomic_thread_fence(std::memory_order_acquire);
        next_ = (next_ + i + 1) % items_.size();
        return p;
      }
    }
    items_.push_back(make_());
    return items_.back();
  }
  /// Objects made so far (the most ever out at once).
  size_t size() const { return items_.size(); }

 private:
  std::function<std::shared_ptr<T>()> make_;
  std::vector<std::shared_ptr<T>> items_;
  size_t next_ = 0;
};

/// Tensors reused when neither they nor any view of their storage is held outside the pool.
class TensorReusePool {
 public:
  explicit TensorReusePool(std::function<torch::Tensor()> make) : make_(std::move(make)) {}

  torch::Tensor take() {
    for (size_t i = 0; i < items_.size(); ++i) {
      auto& t = items_[(next_ + i) % items_.size()];
      if (t.use_count() == 1 && t.storage().use_count() == 1) {
        std::atomic_thread_fence(std::memory_order_acquire);
        next_ = (next_ + i + 1) % items_.size();
        return t;
      }
    }
    items_.push_back(make_());
    return items_.back();
  }
  size_t size() const { return items_.size(); }

 private:
  std::function<torch::Tensor()> make_;
  std::vector<torch::Tensor> items_;
  size_t next_ = 0;
};

}  // namespace pipeline::model
