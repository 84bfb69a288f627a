// See device_event.h.
#include "model/device_event.h"

#include <stdexcept>
#include <utility>

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
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

// The host function's payload: owned by the callback, freed there.
void CUDART_CB run_host_fn(void* p) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(p));
  (*fn)();
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

void after_stream_work(c10::Stream stream, std::function<void()> fn) {
  if (stream.device_type() != c10::DeviceType::CUDA) {
    fn();
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
void after_stream_work(c10::Stream, std::function<void()> fn) { fn(); }

#endif

}  // namespace pipeline::model
