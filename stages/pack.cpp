// pack: cuts what the input side delivers into micro-batches of B rows of T+1 tokens (x =
// rows[:, :T], y = rows[:, 1:]), as the run's data order says (stages/batch_rows.h: one window of
// this rank's stream in the documents order; the next rows of this rank's lanes in the lanes
// order). Each batch is written once, as uint16, straight into a buffer of pack's pool (pinned on
// CUDA; stages/pinned_pool.h) that h2d copies to the device as is: 2 bytes a token cross the bus.
// Each batch carries the hash of its rows (datasets/lanes/row_hash.h), which train sums into the
// step's "windows", and its data step.
//
// The pool gates pack: the engine hands it an input only while a buffer is free and reserves
// that buffer for the input's first batch (for the first input's, when an invocation carries a
// batch of inputs). An input that completes several batches (a long document, or small B*T)
// takes further free buffers if there are, and otherwise puts the rest into overflow buffers
// allocated for them, counted and reported at the end of the run. Holding batches back instead
// would grow pack's memory without bound under a slow consumer; overflow batches are bounded by
// the engine's limit on pack's output queue.
//
// Single worker, input in order, so the batches are the same whatever the upstream worker
// counts. Each batch records the exact data position after it, which a checkpoint stores.
#include <span>

#include "datasets/lanes/row_hash.h"
#include "graph/stage.h"
#include "stages/batch_rows.h"
#include "stages/lane_reading.h"
#include "stages/pinned_pool.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

// The pool's size when `buffers` is "auto": 72 (a queue of 64 after pack and the batches the
// stages after it hold), and in the lanes order, beside them, the batches one round of lane chunks
// completes at once: each of this rank's lanes arrives lane_chunk_tokens at a time, so a round
// makes about chunk / T rows a lane (at small T, more than 72 batches: at 8x128 the quick start's
// round is 128 of them, 256 KiB in all).
int auto_buffers(const RunContext& rc) {
  constexpr int64_t kQueueAndHeld = 72, kMost = 1024;
  if (!rc.lanes) return static_cast<int>(kQueueAndHeld);
  const auto& t = rc.cfg.training;
  const auto rows_a_lane = (static_cast<int64_t>(lane_chunk_tokens(rc)) + t.seq_len - 1) / t.seq_len;
  const auto lanes = static_cast<int64_t>(std::max<size_t>(1, rc.lanes->mine.size()));
  const auto round = (rows_a_lane * lanes + t.batch_size - 1) / t.batch_size;
  return static_cast<int>(std::min(kMost, kQueueAndHeld + round));
}

class Pack : public graph::Stage {
 public:
  explicit Pack(const graph::StageContext& ctx) : rc_(run_context(ctx)), name_(ctx.name) {
    B_ = rc_.cfg.training.batch_size;
    T_ = rc_.cfg.training.seq_len;
    next_index_ = rc_.start_step * rc_.cfg.training.grad_accum;
    rows_ = rc_.lanes ? lane_batches(rc_) : window_rows(rc_);
    const auto buffers = ctx.options.get_int_or_auto("buffers");
    pool_ = std::make_unique<WindowPool>(buffers ? static_cast<int>(*buffers) : auto_buffers(rc_), B_, T_ + 1, rc_.device);
  }

  std::shared_ptr<graph::ResourcePool> resource_pool() override { return pool_->gate(); }

  void process(graph::Item in, graph::Emitter& out) override {
    auto chunk = in.take<TokenChunk>();
    rows_->push(chunk);
    const size_t tokens = static_cast<size_t>(B_ * (T_ + 1));
    for (bool first = true; rows_->ready(); first = false) {
      WindowPool::Window w = next_buffer(first);
      auto* rows = static_cast<uint16_t*>(w.rows.data_ptr());  // (B, T+1)
      Batch b;
      b.after = rows_->take(rows);
      b.windows = datasets::rows_hash(std::span<const uint16_t>(rows, tokens), static_cast<size_t>(T_ + 1));
      b.rows = std::move(w.rows);  // (B, T+1) uint16
      b.lease = std::move(w.lease);
      b.B = B_;
      b.T = T_;
      b.index = next_index_++;
      b.data_step = rc_.start_data_step + batches_ / rc_.cfg.training.grad_accum;
      ++batches_;
      out.emit(std::move(b));
    }
    rows_->settle();
  }

  void finalize(graph::Emitter&) override {
    if (const int64_t n = pool_->overflows(); n > 0)
      rc_.log->print(name_ + ": " + std::to_string(n) + " of " + std::to_string(batches_) +
                     " batches went to buffers outside its pool of " + std::to_string(pool_->size()) +
                     " (inputs that make several batches while few buffers were free); a larger [stages." + name_ +
                     "] buffers keeps them in the pool");
    if (const auto line = rows_->summary(); !line.empty()) rc_.log->print(name_ + ": " + line);
  }

 private:
  // The invocation's reserved buffer (first batch of an input), else a free one, else overflow.
  WindowPool::Window next_buffer(bool first) {
    if (first)
      if (auto w = pool_->reserved()) return std::move(*w);
    if (auto w = pool_->spare()) return std::move(*w);
    return pool_->overflow();
  }

  RunContext& rc_;
  std::string name_;
  int64_t B_, T_, next_index_;
  std::unique_ptr<BatchRows> rows_;
  std::unique_ptr<WindowPool> pool_;
  int64_t batches_ = 0;  // made by this run
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(pack, {.name = "pack",
                           .input = typeid(TokenChunk),
                           .output = typeid(Batch),
                           .factory = graph::make_factory<Pack>()});

}  // namespace
}  // namespace pipeline::stages
