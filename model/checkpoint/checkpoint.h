// Training checkpoints: a versioned, checksummed binary file holding the model weights, the
// optimizer state, the step, the RNG states and an opaque metadata string (the caller's JSON).
//
// Saving is split so the train thread only pays for device-to-host copies:
//   auto snap = snapshot(model, &opt, step, meta_json);  // enqueues copies into pinned memory
//   std::thread([snap = std::move(snap), path] { write_checkpoint(path, snap); }).detach();
// write_checkpoint() waits for the copies itself (an event, on the writer's thread), then writes
// PATH.tmp, fsyncs it and renames it over PATH, so PATH is always a complete checkpoint.
//
// File layout (little-endian), version 1:
//   [0, 64) header: magic "PIPECKPT", u32 version, u32 header bytes (64), i64 step,
//           u64 metadata bytes, u64 payload bytes, u32 tensor count, u32 CRC-32 of the payload,
//           zero padding
//   payload: metadata bytes, then per tensor: u32 name length, name, u8 dtype code, u8 ndim,
//           u16 0, i64 dims[ndim], u64 data bytes, raw contiguous data.
// Tensor names: "model/<param>", "optim/<state>", "rng/cpu", "rng/cuda/<device>".
#pragma once

#include "model/checkpoint/checkpoint_file.h"
#include "model/device/device_event.h"
#include "model/net/gpt2.h"
#include "model/net/optim.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipeline::model {

/// Everything a checkpoint holds, as host (CPU) tensors.
struct CheckpointState {
  int64_t step = 0;
  std::string metadata;  // opaque to this module: the caller's JSON (config, data position)
  NamedTensors model;  // parameter name -> weights
  NamedTensors optimizer;  // AdamW::state() names -> tensors; empty when saved without one
  torch::Tensor rng_cpu;  // uint8 state of the default CPU generator
  std::vector<torch::Tensor> rng_cuda;  // uint8 state per CUDA device; empty without CUDA
  /// Set when snapshot() enqueued non-blocking device-to-host copies: they are complete once
  /// this event has fired. wait() blocks on it (sleeping, not spinning); write_checkpoint()
  /// calls wait() first.
  std::shared_ptr<DeviceEvent> ready;
  /// The reusable buffers the tensors above live in, when a SnapshotPool made this state
  /// (model/checkpoint/snapshot.h): they go back to the pool when the last copy of the state is gone.
  std::shared_ptr<void> buffers;

  /// Blocks until the copies are done; returns how long it waited.
  std::chrono::nanoseconds wait() const;
};

/// Copies model weights, optimizer state (optimizer may be null) and RNG states to the host.
/// With non_blocking and CUDA tensors, the copies go into pinned memory on the current stream and
/// the call returns without waiting (an event in `ready` marks their completion). Later kernels
/// on that stream (the next optimizer step) are ordered after the copies, so the snapshot is of
/// this step. Call it on the thread that owns the stream.
CheckpointState snapshot(GPT& model, const AdamW* optimizer, int64_t step, std::string metadata,
                         bool non_blocking = true);

/// Fills state.rng_cpu and state.rng_cuda with the default generators' current states (a few
/// bytes each, read on the host).
void capture_rng_states(CheckpointState& state);

/// Writes state atomically to path (path.tmp, fsync, rename, fsync of the directory; see
/// base/atomic_file.h). On an I/O error (disk full, read-only directory) it throws
/// pipeline::FileWriteError naming the path and the step, removes path.tmp and leaves an
/// existing checkpoint at path untouched.
void write_checkpoint(const std::string& path, const CheckpointState& state);

/// Reads and verifies a checkpoint (magic, version, length, CRC-32). Throws std::runtime_error
/// naming the path and what was found (bad magic, unsupported version, truncation, checksum).
CheckpointState read_checkpoint(const std::string& path);

/// Puts a checkpoint back: weights into model, state into optimizer (if both are non-null/non-
/// empty) and, when restore_rng, the CPU and CUDA generator states (restore_rng below).
void restore(const CheckpointState& state, GPT& model, AdamW* optimizer, bool restore_rng = true);

/// Sets the process's default CPU and CUDA generators to the states the checkpoint holds (the
/// run layer does this before the engine starts; runner/run_setup.cpp).
void restore_rng(const CheckpointState& state);

/// snapshot() + write_checkpoint() on the calling thread.
void save_checkpoint(const std::string& path, GPT& model, const AdamW* optimizer, int64_t step,
                     std::string metadata);

}  // namespace pipeline::model
