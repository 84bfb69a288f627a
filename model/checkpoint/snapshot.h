// Checkpoint snapshots into host buffers that are allocated once and reused, so that taking a
// snapshot during training allocates nothing (1.5 GB of pinned memory for GPT-2 124M with its
// Adam moments would otherwise be allocated, and page-locked, on the train thread each time).
//
// On CUDA the device-to-host copies run on a copy stream of their own, ordered after the
// training stream's work by an event, so training goes on while they run; the training stream
// waits for them (on the device) only before the next in-place update of what they read:
//
//   train stream:  ... step k ─┬─ fwd/bwd k+1 ───────────── [waits copies] ─ AdamW k+1 ...
//   copy stream:               └─ weights, moments -> pinned set ─ ready ┘
//
// A buffer set goes back to the pool when the last copy of the CheckpointState that uses it is
// destroyed (the checkpoint stage, after writing it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/checkpoint/checkpoint.h"

namespace pipeline::model {

/// Example:
///   SnapshotPool pool(model, &opt);           // allocates the buffers now
///   auto state = pool.take(step, meta_json);  // enqueues the copies, returns at once
///   ...                                        // forward, backward of the next step
///   pool.order_before_update();                // before set_lr / the optimizer step
///   opt.step();
class SnapshotPool {
 public:
  /// `sets` buffer sets shaped like model's parameters and optimizer's state() (optimizer may be
  /// null), pinned when the model is on CUDA. Call on the thread that trains (its current stream
  /// is the one the snapshots are ordered after).
  SnapshotPool(GPT model, const AdamW* optimizer, int sets = 1);
  ~SnapshotPool();
  SnapshotPool(const SnapshotPool&) = delete;
  SnapshotPool& operator=(const SnapshotPool&) = delete;

  /// Copies the weights, optimizer state and RNG states into a free set and returns a state whose
  /// tensors live there. CUDA: the copies are enqueued on the copy stream after the work already
  /// on the calling thread's current stream, and `ready` completes when they are done; the call
  /// does not wait for them. CPU: the copies are done on return. While every set is still held
  /// by an earlier snapshot (its writer is behind), blocks until one comes back: waited() says
  /// for how long in all.
  CheckpointState take(int64_t step, std::string metadata);

  /// Makes the calling thread's current stream wait (on the device) for the copies of the last
  /// take(): call before anything updates the weights or the optimizer state in place.
  void order_before_update();

  /// Blocks until every set is back (each snapshot taken so far written, or dropped, by whoever
  /// held it); returns how long it waited.
  std::chrono::nanoseconds wait_idle();

  int sets() const;
  /// Host buffers allocated so far (two per set, all at construction).
  int64_t allocations() const { return allocations_; }
  /// Bytes of one set.
  int64_t set_bytes() const { return set_bytes_; }
  std::chrono::nanoseconds waited() const;

 private:
  struct Set;
  struct Shared;
  GPT model_;
  const AdamW* optimizer_;
  torch::Device device_;
  std::shared_ptr<Shared> shared_;
  // The ready event of the last take(), until ordered before an update. A plain pointer: it must
  // not keep the set out of the pool (the set's events live as long as the pool).
  DeviceEvent* pending_ = nullptr;
  int64_t allocations_ = 0;
  int64_t set_bytes_ = 0;
};

}  // namespace pipeline::model
