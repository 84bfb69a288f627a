// h2d: copies each batch's rows ((B, T+1) uint16, pinned) to the GPU on a side stream,
// without blocking the host, and hands train the copy's event to wait on (on its compute stream,
// never on the host). The pinned buffer goes back to pack's pool from a CUDA host callback
// enqueued after the copy, so it is rewritten only once the copy has read it and no host thread
// waits for that. Those callbacks are counted: h2d ends (finalize, or its destruction after a
// failed run) only once the last has run, so none reaches the engine after the run. Without
// CUDA it passes batches through.
#include "graph/stage.h"
#include "stages/pinned_pool.h"
#include "stages/types.h"

#ifdef PIPELINE_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pipeline::stages {
namespace {

class H2D : public graph::Stage {
 public:
  explicit H2D(const graph::StageContext& ctx) : rc_(run_context(ctx)) {}

  void initialize() override {
#ifdef PIPELINE_HAVE_CUDA
    if (rc_.device.is_cuda()) {
      model::use_device(rc_.device);
      stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, rc_.device.index());
    }
#endif
  }

  void process(graph::Item in, graph::Emitter& out) override {
    auto b = in.take<Batch>();
#ifdef PIPELINE_HAVE_CUDA
    if (stream_ && !b.rows.is_cuda()) {
      c10::cuda::CUDAStreamGuard guard(*stream_);
      // Allocated on this stream; train records its own stream on it before reading.
      auto dev = torch::empty(b.rows.sizes(), b.rows.options().device(rc_.device).pinned_memory(false));
      dev.copy_(b.rows, /*non_blocking=*/true);  // (B, T+1) uint16: 2 bytes a token
      b.ready = std::make_shared<model::DeviceEvent>();
      b.ready->record(*stream_);
      if (b.lease) release_after(std::move(b.lease), *stream_, callbacks_);
      b.rows = std::move(dev);
    }
#endif
    out.emit(std::move(b));
  }

  // Every buffer this stage handed to a callback is back in pack's pool before h2d passes the
  // end of the stream on; a failed run's teardown waits the same way (~HostCallbacks).
  void finalize(graph::Emitter& out) override { out.add_device_wait(callbacks_.wait_all()); }

 private:
  RunContext& rc_;
  model::HostCallbacks callbacks_;
#ifdef PIPELINE_HAVE_CUDA
  std::optional<c10::cuda::CUDAStream> stream_;
#endif
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(h2d, {.name = "h2d",
                          .input = typeid(Batch),
                          .output = typeid(Batch),
                          .factory = graph::make_factory<H2D>()});

}  // namespace
}  // namespace pipeline::stages
