// h2d: copies batches to the GPU on a side stream, without blocking the host, and hands train an
// event to wait on (on its compute stream, never a device-wide sync). The pinned buffer the copy
// reads from goes back to pin's pool tagged with that event, so it is reused only after the copy.
// Without CUDA it passes batches through.
#include "graph/stage.h"
#include "stages/pinned_pool.h"
#include "stages/types.h"

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace pipeline::stages {
namespace {

class H2D : public graph::Stage {
 public:
  explicit H2D(const graph::StageContext& ctx) : rc_(require_run_context(ctx.name)) {}

  void initialize() override {
#ifdef PIPELINE_HAVE_CUDA
    if (rc_.device.is_cuda()) {
      c10::cuda::set_device(rc_.device.index());
      stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, rc_.device.index());
    }
#endif
  }

  void process(graph::Item in, graph::Emitter& out) override {
    auto b = in.take<Batch>();
#ifdef PIPELINE_HAVE_CUDA
    if (rc_.device.is_cuda() && stream_) {
      c10::cuda::CUDAStreamGuard guard(*stream_);
      const int64_t B = b.x.size(0), T = b.x.size(1);
      // pin lays x and y out as one (2, B, T) buffer: one transfer.
      torch::Tensor host = b.slot ? b.slot->buf.view({2, B, T}) : torch::stack({b.x, b.y});  // (2, B, T)
      auto dev = host.to(rc_.device, torch::kInt64, /*non_blocking=*/true);  // allocated on the side stream
      auto ev = std::make_shared<at::cuda::CUDAEvent>();
      ev->record(*stream_);
      if (b.slot) {
        b.slot->set_copy_event(ev);
        b.slot.reset();  // back to the pool now; reused only after `ev`
      }
      b.x = dev[0];  // (B, T)
      b.y = dev[1];  // (B, T)
      b.ready = ev;
    }
#endif
    out.emit(std::move(b));
  }

 private:
  RunContext& rc_;
#ifdef PIPELINE_HAVE_CUDA
  std::optional<c10::cuda::CUDAStream> stream_;
#endif
};

PIPELINE_STAGE(h2d, {.name = "h2d",
                     .doc = "non-blocking host-to-device copy on a side stream with an event for train (pass-through without CUDA)",
                     .input = graph::port<Batch>("batch"),
                     .output = graph::port<Batch>("batch"),
                     .own_thread = true,
                     .max_workers = 1,
                     .factory = graph::make_factory<H2D>()});

}  // namespace
}  // namespace pipeline::stages
