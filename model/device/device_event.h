// Device events for the training stages: ordering between CUDA streams, host waits that sleep
// instead of spinning, and device-side timing. On the CPU (or a build without CUDA) every
// operation is a no-op, so stage code calls them unconditionally.
//
// Why not c10::Event: it cannot ask for cudaEventBlockingSync, and without it a host thread
// waiting on an event spins a core (the issue this file answers: log, eval and checkpoint
// each burned one while they waited).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace pipeline::model {

/// One CUDA event.
///
/// Example (a copy on a side stream that a compute stream waits for, and a host thread too):
///   DeviceEvent done;                      // blocking sync: a host wait sleeps
///   done.record(copy_stream);
///   done.block(compute_stream);            // device-side order, the host does not wait
///   auto waited = done.wait();             // on another thread: sleeps until the copy is done
class DeviceEvent {
 public:
  enum class Kind {
    sync,    // waited on by host threads: cudaEventBlockingSync, no timing
    timing,  // brackets device work for elapsed_ms(); never waited on by the host directly
  };
  explicit DeviceEvent(Kind kind = Kind::sync);
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  /// Records the event at the current end of `stream`'s work. A CPU stream records nothing.
  void record(c10::Stream stream);
  /// Records on the calling thread's current stream of `device` (nothing for the CPU).
  void record_current(c10::Device device);
  /// Makes `stream` wait for the event on the device (no host wait). No-op when unrecorded.
  void block(c10::Stream stream) const;
  /// Host wait until the event completed, sleeping rather than spinning (sync events).
  /// Returns the time waited; zero when unrecorded or on the CPU.
  std::chrono::nanoseconds wait() const;
  /// True when the event completed or was never recorded. Never waits.
  bool query() const;
  /// Milliseconds from this timing event to `end`, both recorded and completed (throws
  /// otherwise); makes no sync. Wait on a later event of the same stream first.
  double elapsed_ms(const DeviceEvent& end) const;
  bool recorded() const { return recorded_; }
  Kind kind() const { return kind_; }

 private:
  struct Impl;
  Kind kind_;
  bool recorded_ = false;
  std::unique_ptr<Impl> impl_;
};

/// The calling thread's current stream on `device` (CUDA), or the CPU's default stream.
c10::Stream current_stream(c10::Device device);

/// Makes `device` the calling thread's current CUDA device; nothing for the CPU. The current
/// device is per thread and defaults to 0: every thread that makes a CUDA call (waits on an
/// event, allocates pinned memory, launches work) calls this first, or a rank bound to GPU k
/// creates a context of its own on GPU 0 (about 500 MB each).
void use_device(c10::Device device);

/// The device's name as CUDA reports it ("NVIDIA H100 80GB HBM3"); "" for the CPU.
std::string device_name(c10::Device device);

/// Calls `fn` on a host thread once the work enqueued so far on `stream` has completed
/// (cudaLaunchHostFunc); on a CPU stream, calls it now. `fn` runs on a CUDA driver thread and
/// must not call CUDA (or free CUDA-allocated tensors): it is for giving back host resources,
/// such as a pinned buffer that a copy was reading. An exception `fn` throws is swallowed there
/// (it cannot cross the driver's C callback); use HostCallbacks to see it.
void after_stream_work(c10::Stream stream, std::function<void()> fn);

/// The host callbacks one owner (a stage) has enqueued, counted until they have run, so that the
/// owner can wait for the last one before it ends: a callback that fired after the run ended
/// would reach an engine being torn down. The count lives in a shared block that the callbacks
/// hold, so a callback never touches a destroyed HostCallbacks.
///
/// Example (h2d: a pinned buffer goes back to the pool once its copy is done):
///   HostCallbacks callbacks_;                                 // a member of the stage
///   callbacks_.after(copy_stream, [lease] { ... });           // per batch
///   void finalize(...) { callbacks_.wait_all(); }             // and the destructor waits too
class HostCallbacks {
 public:
  HostCallbacks();
  /// Waits for the callbacks still pending (they follow device work that completes), at most
  /// 30 s: after a device fault they may never run.
  ~HostCallbacks();
  HostCallbacks(const HostCallbacks&) = delete;
  HostCallbacks& operator=(const HostCallbacks&) = delete;

  /// after_stream_work(stream, fn), counted.
  void after(c10::Stream stream, std::function<void()> fn);
  /// Sleeps until every callback enqueued so far has run; returns the time waited. Throws
  /// std::runtime_error with the first callback's error, if one threw (once).
  std::chrono::nanoseconds wait_all();
  /// Callbacks enqueued and not yet run.
  int64_t pending() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace pipeline::model
