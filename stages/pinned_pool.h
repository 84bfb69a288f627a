// A fixed pool of pinned host buffers for batches. A buffer goes back to the pool when its
// PinnedSlot handle is destroyed, but is handed out again only after the event of the last
// copy out of it (set by h2d) has completed: the copy engine may still be reading it.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "stages/types.h"

namespace pipeline::stages {

class PinnedPool;

class PinnedSlot {
 public:
  PinnedSlot(std::shared_ptr<PinnedPool> pool, size_t index, torch::Tensor buf)
      : pool_(std::move(pool)), index_(index), buf(std::move(buf)) {}
  ~PinnedSlot();
  PinnedSlot(const PinnedSlot&) = delete;
  PinnedSlot& operator=(const PinnedSlot&) = delete;

  /// The event that completes when the copy out of this buffer is done (h2d sets it).
  void set_copy_event(std::shared_ptr<void> event) { copy_done_ = std::move(event); }

 private:
  std::shared_ptr<PinnedPool> pool_;
  size_t index_;
  std::shared_ptr<void> copy_done_;

 public:
  torch::Tensor buf;  // (2*B*T) int64, pinned: x then y
};

class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  /// `count` buffers of `elements` int64 each, in page-locked memory.
  static std::shared_ptr<PinnedPool> create(size_t count, int64_t elements);
  /// Blocks until a buffer is free and its last copy has completed.
  std::shared_ptr<PinnedSlot> acquire();
  size_t size() const { return buffers_.size(); }
  size_t free_count();

 private:
  friend class PinnedSlot;
  void release(size_t index, std::shared_ptr<void> copy_done);

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<torch::Tensor> buffers_;
  std::vector<size_t> free_;
  std::vector<std::shared_ptr<void>> pending_event_;  // per buffer: copy event to wait on before reuse
};

}  // namespace pipeline::stages
