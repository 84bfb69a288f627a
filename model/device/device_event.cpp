// See device_event.h.
#include "model/device/device_event.h"

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace pipeline::model {

#ifdef PIPELINE_HAVE_CUDA

struct DeviceEvent::Impl {
  at::cuda::CUDAEvent event;
  explicit Impl(unsigned flags) : event(flags) {}
};

namespace {

c10::cuda::CUDAStream cuda_stream(c10::Stream s) { return c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s); }

unsigned flags_of(DeviceEvent::Kind kind) {
  return kind == DeviceEvent::Kind::sync ? cudaEventBlockingSync | cudaEventDisableTiming : cudaEventDefault;
}

// The host function's payload: owned by the callback, freed there. Nothing may propagate out of
// the driver's C callback (it would terminate the process): the function is noexcept, and
// HostCallbacks wraps what it enqueues to keep the error for wait_all().
void CUDART_CB run_host_fn(void* p) noexcept {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(p));
  try {
    (*fn)();
  } catch (...) {
  }
}

}  // namespace

DeviceEvent::DeviceEvent(Kind kind) : kind_(kind), impl_(std::make_unique<Impl>(flags_of(kind))) {}
DeviceEvent::~DeviceEvent() = default;

void DeviceEvent::record(c10::Stream stream) {
  if (stream.device_type() != c10::DeviceType::CUDA) return;
  impl_->event.record(cuda_stream(stream));
  recorded_ = true;
}

void DeviceEvent::record_current(c10::Device device) {
  if (!device.is_cuda()) return;
  record(c10::cuda::getCurrentCUDAStream(device.index()));
}

void DeviceEvent::block(c10::Stream stream) const {
  if (!recorded_ || stream.device_type() != c10::DeviceType::CUDA) return;
  impl_->event.block(cuda_stream(stream));
}

std::chrono::nanoseconds DeviceEvent::wait() const {
  if (!recorded_) return std::chrono::nanoseconds(0);
  auto t0 = std::chrono::steady_clock::now();
  impl_->event.synchronize();
  return std::chrono::steady_clock::now() - t0;
}

bool DeviceEvent::query() const { return !recorded_ || impl_->event.query(); }

double DeviceEvent::elapsed_ms(const DeviceEvent& end) const {
  if (!recorded_ || !end.recorded_) throw std::logic_error("DeviceEvent::elapsed_ms: both events must be recorded");
  return impl_->event.elapsed_time(end.impl_->event);
}

c10::Stream current_stream(c10::Device device) {
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index());
  return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
}

void use_device(c10::Device device) {
  if (device.is_cuda()) c10::cuda::set_device(device.index());
}

std::string device_name(c10::Device device) {
  if (!device.is_cuda()) return "";
  return at::cuda::getDeviceProperties(device.index() < 0 ? c10::cuda::current_device() : device.index())->name;
}

void after_stream_work(c10::Stream stream, std::function<void()> fn) {
  if (stream.device_type() != c10::DeviceType::CUDA) {
    try {
      fn();
    } catch (...) {
    }
    return;
  }
  auto payload = std::make_unique<std::function<void()>>(std::move(fn));
  C10_CUDA_CHECK(cudaLaunchHostFunc(cuda_stream(stream).stream(), run_host_fn, payload.get()));
  payload.release();  // the callback owns it now
}

#else  // no CUDA in this build: everything is host-side and already complete

struct DeviceEvent::Impl {};

DeviceEvent::DeviceEvent(Kind kind) : kind_(kind) {}
DeviceEvent::~DeviceEvent() = default;
void DeviceEvent::record(c10::Stream) {}
void DeviceEvent::record_current(c10::Device) {}
void DeviceEvent::block(c10::Stream) const {}
std::chrono::nanoseconds DeviceEvent::wait() const { return std::chrono::nanoseconds(0); }
bool DeviceEvent::query() const { return true; }
double DeviceEvent::elapsed_ms(const DeviceEvent&) const {
  throw std::logic_error("DeviceEvent::elapsed_ms: this build has no CUDA");
}
c10::Stream current_stream(c10::Device) { return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU)); }
void use_device(c10::Device device) {
  if (device.is_cuda()) throw std::invalid_argument("use_device: this build has no CUDA");
}
std::string device_name(c10::Device) { return ""; }
void after_stream_work(c10::Stream, std::function<void()> fn) {
  try {
    fn();
  } catch (...) {
  }
}

#endif

// ---------------------------------------------------------------------------------------------

struct HostCallbacks::State {
  mutable std::mutex mu;
  std::condition_variable idle;
  int64_t pending = 0;
  std::string error;  // the first callback's, until wait_all() reports it
};

HostCallbacks::HostCallbacks() : state_(std::make_shared<State>()) {}

HostCallbacks::~HostCallbacks() {
  // Bounded: after a device fault the driver may never run them. What is still pending then
  // holds the shared state, not this object, so giving up here is safe for the callbacks.
  std::unique_lock lock(state_->mu);
  state_->idle.wait_for(lock, std::chrono::seconds(30), [&] { return state_->pending == 0; });
}

void HostCallbacks::after(c10::Stream stream, std::function<void()> fn) {
  {
    std::lock_guard lock(state_->mu);
    ++state_->pending;
  }
  // The callback holds the state, not this object: it may run after the owner is gone.
  auto counted = [state = state_, fn = std::move(fn)]() mutable {
    std::string error;
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    fn = nullptr;  // what it captured (a lease) is released before the count says done
    std::lock_guard lock(state->mu);
    if (!error.empty() && state->error.empty()) state->error = std::move(error);
    if (--state->pending == 0) state->idle.notify_all();
  };
  try {
    after_stream_work(stream, std::move(counted));
  } catch (...) {  // not enqueued (a CUDA error): it will never run
    std::lock_guard lock(state_->mu);
    if (--state_->pending == 0) state_->idle.notify_all();
    throw;
  }
}

std::chrono::nanoseconds HostCallbacks::wait_all() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(state_->mu);
  state_->idle.wait(lock, [&] { return state_->pending == 0; });
  if (!state_->error.empty()) {
    std::string e = std::move(state_->error);
    state_->error.clear();
    throw std::runtime_error("a host callback failed: " + e);
  }
  return std::chrono::steady_clock::now() - t0;
}

int64_t HostCallbacks::pending() const {
  std::lock_guard lock(state_->mu);
  return state_->pending;
}

}  // namespace pipeline::model
