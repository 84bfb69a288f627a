// pack: cuts the token stream into batches, nanoGPT style: a batch is one window of B*T+1
// consecutive tokens (x = window[0:B*T], y = window[1:B*T+1], each viewed as (B, T) by train),
// and the next batch starts B*T tokens later. Each window is written once, as uint16, straight
// into a buffer of pack's pool (pinned on CUDA; stages/pinned_pool.h) that h2d copies to the
// device as is: 2 bytes a token cross the bus, where x and y as int64 took 16.
//
// The pool gates pack: the engine hands it an input only while a buffer is free and reserves
// that buffer for the input's first window (for the first input's, when an invocation carries a
// batch of inputs). An input that completes several windows (a long
// document, or small B*T) takes further free buffers if there are, and otherwise puts the rest
// into overflow buffers allocated for them, counted and reported at the end of the run. Holding
// windows back instead would grow pack's memory without bound under a slow consumer; overflow
// windows are bounded by the engine's limit on pack's output queue.
//
// Single worker, input in order, so the batches are the same whatever the upstream worker
// counts. Each batch records the exact data position after it, which a checkpoint stores.
#include <cstring>
#include <deque>
#include <span>

#include "graph/stage.h"
#include "stages/pinned_pool.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class Pack : public graph::Stage {
 public:
  explicit Pack(const graph::StageContext& ctx) : rc_(run_context(ctx)), name_(ctx.name) {
    B_ = rc_.cfg.training.batch_size;
    T_ = rc_.cfg.training.seq_len;
    next_index_ = rc_.start_step * rc_.cfg.training.grad_accum;
    skip_ = rc_.start.skip;
    pool_ = std::make_unique<WindowPool>(static_cast<int>(ctx.options.get_int("buffers")), B_ * T_ + 1,
                                         rc_.device);
  }

  std::shared_ptr<graph::ResourcePool> resource_pool() override { return pool_->gate(); }

  void process(graph::Item in, graph::Emitter& out) override {
    auto chunk = in.take<TokenChunk>();
    // On resume, the first chunk(s) repeat tokens that earlier batches already used.
    const size_t drop = std::min<uint64_t>(skip_, chunk.tokens.size());
    skip_ -= drop;
    const std::span<const uint16_t> fresh(chunk.tokens.data() + drop, chunk.tokens.size() - drop);
    marks_.push_back({chunk.pos, static_cast<int64_t>(carry_.size()) - static_cast<int64_t>(drop)});

    // The tokens at hand are carry_ (not yet consumed) followed by fresh.
    const size_t need = static_cast<size_t>(B_ * T_ + 1), stride = static_cast<size_t>(B_ * T_);
    const size_t avail = carry_.size() + fresh.size();
    size_t start = 0;
    for (bool first = true; avail - start >= need; first = false) {
      WindowPool::Window w = next_buffer(first);
      copy_window(static_cast<uint16_t*>(w.tokens.data_ptr()), start, need, fresh);
      start += stride;
      consume(stride);
      Batch b;
      b.tokens = std::move(w.tokens);  // (B*T+1) uint16
      b.lease = std::move(w.lease);
      b.B = B_;
      b.T = T_;
      b.index = next_index_++;
      b.after = cursor();
      ++windows_;
      out.emit(std::move(b));
    }
    // Keep what the next window starts with.
    if (start < carry_.size()) {
      carry_.erase(carry_.begin(), carry_.begin() + static_cast<std::ptrdiff_t>(start));
      carry_.insert(carry_.end(), fresh.begin(), fresh.end());
    } else {
      carry_.assign(fresh.begin() + static_cast<std::ptrdiff_t>(start - carry_.size()), fresh.end());
    }
  }

  void finalize(graph::Emitter&) override {
    if (const int64_t n = pool_->overflows(); n > 0)
      rc_.log->print(name_ + ": " + std::to_string(n) + " of " + std::to_string(windows_) +
                     " windows went to buffers outside its pool of " + std::to_string(pool_->size()) +
                     " (inputs that make several windows while few buffers were free); a larger [stages." + name_ +
                     "] buffers keeps them in the pool");
  }

 private:
  struct Mark {
    SourcePosition pos;
    int64_t offset;  // index of the chunk's first kept token in the tokens at hand (negative once consumed past)
  };

  // The invocation's reserved buffer (first window of an input), else a free one, else overflow.
  WindowPool::Window next_buffer(bool first) {
    if (first)
      if (auto w = pool_->reserved()) return std::move(*w);
    if (auto w = pool_->spare()) return std::move(*w);
    return pool_->overflow();
  }

  // dst <- tokens [start, start + n) of carry_ followed by fresh.
  void copy_window(uint16_t* dst, size_t start, size_t n, std::span<const uint16_t> fresh) const {
    if (start < carry_.size()) {
      const size_t k = std::min(n, carry_.size() - start);
      std::memcpy(dst, carry_.data() + start, k * sizeof(uint16_t));
      dst += k;
      n -= k;
      start += k;
    }
    std::memcpy(dst, fresh.data() + (start - carry_.size()), n * sizeof(uint16_t));
  }

  void consume(size_t n) {
    for (auto& m : marks_) m.offset -= static_cast<int64_t>(n);
    // Keep only the chunk that holds the next token and those after it.
    while (marks_.size() > 1 && marks_[1].offset <= 0) marks_.pop_front();
  }

  DataCursor cursor() const {
    const Mark& m = marks_.front();
    return DataCursor{m.pos, static_cast<uint64_t>(-m.offset)};
  }

  RunContext& rc_;
  std::string name_;
  int64_t B_, T_, next_index_;
  uint64_t skip_;
  std::unique_ptr<WindowPool> pool_;
  std::vector<uint16_t> carry_;
  std::deque<Mark> marks_;
  int64_t windows_ = 0;
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(pack, {.name = "pack",
                           .input = typeid(TokenChunk),
                           .output = typeid(Batch),
                           .factory = graph::make_factory<Pack>()});

}  // namespace
}  // namespace pipeline::stages
