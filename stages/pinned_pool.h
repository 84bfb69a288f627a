// The host buffers batches travel in, (B, T+1) uint16 rows each: a fixed pool, pinned when
// training on CUDA, that gates pack through the engine (graph::ResourcePool). pack is admitted an
// input only while a buffer is free, writes each batch's rows straight into one, and the buffer
// comes back when the last holder of its lease lets go: h2d hands its share to a CUDA host
// callback that runs once the copy out of the buffer is done, so no host thread ever waits for
// that copy; on the CPU, train lets go once it has widened the rows.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "graph/stage.h"
#include "model/device/device_event.h"
#include "stages/types.h"

namespace pipeline::stages {

/// A buffer of a WindowPool, handed out: destroying the lease gives it back.
class WindowLease {
 public:
  WindowLease(std::shared_ptr<graph::ResourcePool> pool, int index) : pool_(std::move(pool)), index_(index) {}
  ~WindowLease() { pool_->release(index_); }
  WindowLease(const WindowLease&) = delete;
  WindowLease& operator=(const WindowLease&) = delete;
  int index() const { return index_; }
  const graph::ResourcePool& pool() const { return *pool_; }

 private:
  std::shared_ptr<graph::ResourcePool> pool_;
  int index_;
};

/// Gives `lease` back once the work enqueued so far on `stream` (a copy out of its buffer) is
/// done, from a CUDA host callback counted in `callbacks` (the caller waits for them before it
/// ends); at once on a CPU stream. Giving back touches only host state (the pool and the
/// engine's admission), which is all such a callback may do.
void release_after(std::shared_ptr<WindowLease> lease, c10::Stream stream, model::HostCallbacks& callbacks);

class WindowPool {
 public:
  /// `count` buffers of (rows, cols) uint16 tokens each, page-locked when `device` is CUDA (made
  /// with `device` current, so that the pinned memory belongs to its context and no thread
  /// creates one on GPU 0, whichever thread allocates: the overflow path runs on TBB's).
  WindowPool(int count, int64_t rows, int64_t cols, c10::Device device);

  struct Window {
    torch::Tensor rows;                  // (rows, cols) uint16
    std::shared_ptr<WindowLease> lease;  // null for an overflow buffer
  };
  /// The buffer the engine reserved for the current invocation, for its first window; nullopt
  /// once taken. (The engine reserves one per invocation, and an invocation may carry a batch of
  /// inputs: only the first window of the batch finds the reservation.)
  std::optional<Window> reserved();
  /// Another buffer if one is free now; never waits.
  std::optional<Window> spare();
  /// A buffer from outside the pool, for a window beyond those the pool has free (an input that
  /// makes more windows than there are free buffers). Allocated per window, in pageable memory
  /// (pinning inside a task would hold a TBB worker for milliseconds); the engine's bound on
  /// pack's output queue limits how many exist at once. Counted in overflows().
  Window overflow();

  std::shared_ptr<graph::ResourcePool> gate() const { return gate_; }
  int size() const { return gate_->size(); }
  int64_t overflows() const { return overflows_.load(std::memory_order_relaxed); }

 private:
  Window window(int index);
  torch::Tensor fresh() const;
  std::shared_ptr<graph::ResourcePool> gate_;
  std::vector<torch::Tensor> buffers_;
  int64_t rows_, cols_;
  c10::Device device_;
  std::atomic<int64_t> overflows_{0};
};

}  // namespace pipeline::stages
