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
// counts. Each batch records the exact data position after it, which a checkpoint stores: the
// reader position and tokens after it (this rank's), and the document and token the stream goes
// on with (every rank's alike: datasets/plan/partition.h), from the documents the chunks mark. A
// document that an earlier run began comes marked with the tokens to drop, and pack drops them.
#include <algorithm>
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
    pool_ = std::make_unique<WindowPool>(static_cast<int>(ctx.options.get_int("buffers")), B_, T_ + 1, rc_.device);
  }

  std::shared_ptr<graph::ResourcePool> resource_pool() override { return pool_->gate(); }

  void process(graph::Item in, graph::Emitter& out) override {
    auto chunk = in.take<TokenChunk>();
    // Drops what earlier runs consumed (a document's first tokens; on a resume from a checkpoint
    // that holds only this rank's cursor, the stream's first tokens) and notes where each
    // document's kept tokens lie in the stream.
    const int64_t chunk_start = keep_unconsumed(chunk);
    const std::span<const uint16_t> fresh(chunk.tokens);
    chunks_.push_back({chunk.pos, chunk_start});

    // The tokens at hand are carry_ (not yet consumed) followed by fresh.
    const size_t need = static_cast<size_t>(B_ * T_ + 1), stride = static_cast<size_t>(B_ * T_);
    const size_t avail = carry_.size() + fresh.size();
    size_t start = 0;
    for (bool first = true; avail - start >= need; first = false) {
      WindowPool::Window w = next_buffer(first);
      auto* rows = static_cast<uint16_t*>(w.rows.data_ptr());  // (B, T+1)
      for (int64_t r = 0; r < B_; ++r)  // row r: the window's tokens [r*T, r*T+T]
        copy_tokens(rows + r * (T_ + 1), start + static_cast<size_t>(r * T_), static_cast<size_t>(T_ + 1), fresh);
      start += stride;
      consumed_ += stride;
      Batch b;
      b.rows = std::move(w.rows);  // (B, T+1) uint16
      b.lease = std::move(w.lease);
      b.B = B_;
      b.T = T_;
      b.index = next_index_++;
      b.data_step = rc_.start_data_step + windows_ / rc_.cfg.training.grad_accum;
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
  // A chunk, by where its first token would lie in the stream (tokens kept before it, less those
  // of it that a resume from a rank's own cursor dropped): the reader position a rank's own
  // cursor reopens at.
  struct ChunkStart {
    SourcePosition pos;
    int64_t at;  // negative when the stream's first tokens were dropped
  };
  // Kept tokens of one document, from stream index `at` on, starting with its token `token`.
  struct Piece {
    uint64_t at;
    datasets::DocKey doc;
    uint64_t token;
    bool known;     // false: tokens of a source that marks no documents
    bool by_shard;
  };

  // Walks the chunk's documents (its marks), drops each one's `skip` tokens and the stream's first
  // skip_ tokens, compacts the rest to the front of chunk.tokens and records the pieces. Returns
  // the chunk's ChunkStart::at.
  int64_t keep_unconsumed(TokenChunk& chunk) {
    auto& t = chunk.tokens;
    const uint64_t kept_before = kept_;
    uint64_t stream_dropped = 0;  // by skip_
    size_t w = 0, m = 0;
    auto start_document = [&](const datasets::DocMark& mk) {
      doc_ = mk.key;
      token_ = mk.first;
      drop_ = mk.skip;
      by_shard_ = mk.by_shard;
      known_ = true;
    };
    for (size_t r = 0; r < t.size();) {
      if (m < chunk.marks.size() && chunk.marks[m].at <= r) {  // a document starts here
        start_document(chunk.marks[m++]);
        continue;
      }
      const size_t end = m < chunk.marks.size() ? std::min<size_t>(chunk.marks[m].at, t.size()) : t.size();
      size_t n = end - r;
      const size_t d1 = static_cast<size_t>(std::min<uint64_t>(drop_, n));       // the document's consumed tokens
      const size_t d2 = static_cast<size_t>(std::min<uint64_t>(skip_, n - d1));  // the stream's (own cursor)
      drop_ -= d1;
      skip_ -= d2;
      stream_dropped += d2;
      token_ += d1 + d2;
      r += d1 + d2;
      n -= d1 + d2;
      if (n > 0) {
        pieces_.push_back({kept_, doc_, token_, known_, by_shard_});
        if (w != r) std::memmove(t.data() + w, t.data() + r, n * sizeof(uint16_t));
        w += n;
        r += n;
        kept_ += n;
        token_ += n;
      }
    }
    for (; m < chunk.marks.size(); ++m) start_document(chunk.marks[m]);  // documents that start at the end
    t.resize(w);
    return static_cast<int64_t>(kept_before) - static_cast<int64_t>(stream_dropped);
  }

  // The invocation's reserved buffer (first window of an input), else a free one, else overflow.
  WindowPool::Window next_buffer(bool first) {
    if (first)
      if (auto w = pool_->reserved()) return std::move(*w);
    if (auto w = pool_->spare()) return std::move(*w);
    return pool_->overflow();
  }

  // dst <- tokens [start, start + n) of carry_ followed by fresh.
  void copy_tokens(uint16_t* dst, size_t start, size_t n, std::span<const uint16_t> fresh) const {
    if (start < carry_.size()) {
      const size_t k = std::min(n, carry_.size() - start);
      std::memcpy(dst, carry_.data() + start, k * sizeof(uint16_t));
      dst += k;
      n -= k;
      start += k;
    }
    std::memcpy(dst, fresh.data() + (start - carry_.size()), n * sizeof(uint16_t));
  }

  // Where the stream goes on after the tokens consumed so far, in both forms (types.h).
  DataCursor cursor() {
    const auto now = static_cast<int64_t>(consumed_);
    while (chunks_.size() > 1 && chunks_[1].at <= now) chunks_.pop_front();
    while (pieces_.size() > 1 && pieces_[1].at <= consumed_) pieces_.pop_front();
    DataCursor c;
    c.pos = chunks_.front().pos;
    c.skip = static_cast<uint64_t>(now - chunks_.front().at);
    c.done = rc_.start.done;
    if (!pieces_.empty() && pieces_.front().known && pieces_.front().at <= consumed_) {
      const Piece& p = pieces_.front();
      c.has_next = true;
      c.next = {p.doc, p.token + (consumed_ - p.at)};
      c.by_shard = p.by_shard;
    }
    return c;
  }

  RunContext& rc_;
  std::string name_;
  int64_t B_, T_, next_index_;
  uint64_t skip_;
  std::unique_ptr<WindowPool> pool_;
  std::vector<uint16_t> carry_;
  std::deque<ChunkStart> chunks_;
  std::deque<Piece> pieces_;
  uint64_t kept_ = 0;      // tokens that entered the stream
  uint64_t consumed_ = 0;  // tokens of the stream the batches so far consumed
  // The document the next input token belongs to: its place, which token of it that is, and how
  // many tokens of it are still to drop.
  datasets::DocKey doc_;
  uint64_t token_ = 0, drop_ = 0;
  bool known_ = false, by_shard_ = false;
  int64_t windows_ = 0;
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(pack, {.name = "pack",
                           .input = typeid(TokenChunk),
                           .output = typeid(Batch),
                           .factory = graph::make_factory<Pack>()});

}  // namespace
}  // namespace pipeline::stages
