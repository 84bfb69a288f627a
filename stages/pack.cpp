// pack: concatenates the token stream into batches of B windows of T+1 tokens, nanoGPT style:
// a batch reads B*T+1 consecutive tokens, x = tokens[0:B*T] and y = tokens[1:B*T+1] viewed as
// (B, T), and the next batch starts B*T tokens later. Single worker, input in order, so the
// batches are the same whatever the upstream worker counts. Each batch records the exact data
// position after it, which is what a checkpoint stores to resume.
#include <deque>

#include "graph/stage.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class Pack : public graph::Stage {
 public:
  explicit Pack(const graph::StageContext& ctx) : rc_(require_run_context(ctx.name)) {
    B_ = rc_.cfg.training.batch_size;
    T_ = rc_.cfg.training.seq_len;
    next_index_ = rc_.start_step * rc_.cfg.training.grad_accum;
    skip_ = rc_.start.skip;
  }

  void process(graph::Item in, graph::Emitter& out) override {
    auto chunk = in.take<TokenChunk>();
    // On resume, the first chunk(s) repeat tokens that earlier batches already used.
    int64_t offset = static_cast<int64_t>(pending_.size());
    size_t drop = std::min<uint64_t>(skip_, chunk.tokens.size());
    marks_.push_back({chunk.pos, offset - static_cast<int64_t>(drop)});
    skip_ -= drop;
    pending_.insert(pending_.end(), chunk.tokens.begin() + static_cast<std::ptrdiff_t>(drop), chunk.tokens.end());

    const size_t need = static_cast<size_t>(B_ * T_ + 1);
    while (pending_.size() >= need) {
      auto buf = torch::empty({B_ * T_ + 1}, torch::kInt64);  // (B*T+1)
      auto* p = buf.data_ptr<int64_t>();
      for (size_t i = 0; i < need; ++i) p[i] = pending_[i];
      Batch b;
      b.x = buf.narrow(0, 0, B_ * T_).view({B_, T_});  // (B, T)
      b.y = buf.narrow(0, 1, B_ * T_).view({B_, T_});  // (B, T)
      b.index = next_index_++;
      consume(static_cast<size_t>(B_ * T_));
      b.after = cursor();
      out.emit(std::move(b));
    }
  }

 private:
  struct Mark {
    SourcePosition pos;
    int64_t offset;  // index in pending_ of the chunk's first token (negative once consumed past)
  };

  void consume(size_t n) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
    for (auto& m : marks_) m.offset -= static_cast<int64_t>(n);
    // Keep only the chunk that holds pending_[0] and those after it.
    while (marks_.size() > 1 && marks_[1].offset <= 0) marks_.pop_front();
  }

  DataCursor cursor() const {
    const Mark& m = marks_.front();
    return DataCursor{m.pos, static_cast<uint64_t>(-m.offset)};
  }

  RunContext& rc_;
  int64_t B_, T_, next_index_;
  uint64_t skip_;
  std::vector<uint16_t> pending_;
  std::deque<Mark> marks_;
};

PIPELINE_STAGE(pack, {.name = "pack",
                      .doc = "packs the token stream into (B, T) input/target batches ([training] batch_size, seq_len)",
                      .input = graph::port<TokenChunk>("tokens"),
                      .output = graph::port<Batch>("batch"),
                      .ordered = true,
                      .max_workers = 1,
                      .factory = graph::make_factory<Pack>()});

}  // namespace
}  // namespace pipeline::stages
