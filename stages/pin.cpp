// pin: copies each batch into a pinned host buffer from a fixed pool, so that h2d can copy it
// to the GPU asynchronously. Buffers return to the pool only once their device copy completed.
// Without CUDA (training on the CPU) it passes batches through untouched.
#include "stages/pinned_pool.h"

#include "graph/stage.h"

#ifdef PIPELINE_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace pipeline::stages {

PinnedSlot::~PinnedSlot() { pool_->release(index_, std::move(copy_done_)); }

std::shared_ptr<PinnedPool> PinnedPool::create(size_t count, int64_t elements) {
  auto pool = std::shared_ptr<PinnedPool>(new PinnedPool());
  for (size_t i = 0; i < count; ++i) {
    pool->buffers_.push_back(torch::empty({elements}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(true)));
    pool->free_.push_back(i);
  }
  pool->pending_event_.resize(count);
  return pool;
}

std::shared_ptr<PinnedSlot> PinnedPool::acquire() {
  size_t index;
  std::shared_ptr<void> event;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    index = free_.back();
    free_.pop_back();
    event = std::move(pending_event_[index]);
  }
#ifdef PIPELINE_HAVE_CUDA
  // The copy engine may still be reading this buffer: wait for that copy only (not the device).
  if (event) static_cast<at::cuda::CUDAEvent*>(event.get())->synchronize();
#endif
  return std::make_shared<PinnedSlot>(shared_from_this(), index, buffers_[index]);
}

size_t PinnedPool::free_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

void PinnedPool::release(size_t index, std::shared_ptr<void> copy_done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_event_[index] = std::move(copy_done);
    free_.push_back(index);
  }
  cv_.notify_one();
}

namespace {

class Pin : public graph::Stage {
 public:
  explicit Pin(const graph::StageContext& ctx) : rc_(require_run_context(ctx.name)), buffers_(ctx.options.get_int("buffers")) {}

  void initialize() override {
    if (rc_.device.is_cuda())
      pool_ = PinnedPool::create(static_cast<size_t>(buffers_),
                                 2 * rc_.cfg.training.batch_size * rc_.cfg.training.seq_len);
  }

  void process(graph::Item in, graph::Emitter& out) override {
    auto b = in.take<Batch>();
    if (!pool_) {  // CPU training: nothing to pin
      out.emit(std::move(b));
      return;
    }
    auto slot = pool_->acquire();
    auto buf = slot->buf.view({2, b.x.size(0), b.x.size(1)});  // (2, B, T): x then y, one transfer for h2d
    buf[0].copy_(b.x);
    buf[1].copy_(b.y);
    b.x = buf[0];  // (B, T)
    b.y = buf[1];  // (B, T)
    b.slot = std::move(slot);
    out.emit(std::move(b));
  }

 private:
  RunContext& rc_;
  int64_t buffers_;
  std::shared_ptr<PinnedPool> pool_;
};

PIPELINE_STAGE(pin, {.name = "pin",
                     .doc = "copies batches into a fixed pool of pinned host buffers (pass-through without CUDA)",
                     .input = graph::port<Batch>("batch"),
                     .output = graph::port<Batch>("batch"),
                     .options = config::Schema().integer("buffers", 6, "pinned buffers in the pool", 2, 1024),
                     .own_thread = true,
                     .max_workers = 1,
                     .factory = graph::make_factory<Pin>()});

}  // namespace
}  // namespace pipeline::stages
