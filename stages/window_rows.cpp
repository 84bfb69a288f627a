// The documents order's micro-batches (batch_rows.h): this rank's token stream, cut nanoGPT style
// into windows of B*T+1 consecutive tokens, the next window B*T tokens later, each written as B
// overlapping rows (row b: the window's tokens [b*T, b*T+T]), so x = rows[:, :T] and
// y = rows[:, 1:] are the window's x and y, as before batches were rows.
//
// Each batch records the exact data position after it, which a checkpoint stores: the reader
// position and tokens after it (this rank's), and the document and token the stream goes on with
// (every rank's alike: datasets/plan/partition.h), from the documents the chunks mark. A document
// that an earlier run began comes marked with the tokens to drop, and they are dropped here.
#include <algorithm>
#include <cstring>
#include <deque>
#include <span>

#include "stages/batch_rows.h"

namespace pipeline::stages {
namespace {

class WindowRows : public BatchRows {
 public:
  explicit WindowRows(const RunContext& rc)
      : rc_(rc), B_(rc.cfg.training.batch_size), T_(rc.cfg.training.seq_len), skip_(rc.start.skip) {}

  void push(TokenChunk& chunk) override {
    // Drops what earlier runs consumed (a document's first tokens; on a resume from a checkpoint
    // that holds only this rank's cursor, the stream's first tokens) and notes where each
    // document's kept tokens lie in the stream.
    const int64_t chunk_start = keep_unconsumed(chunk);
    chunks_.push_back({chunk.pos, chunk_start});
    fresh_ = std::move(chunk.tokens);
    start_ = 0;
  }

  // The tokens at hand are carry_ (not yet consumed) followed by fresh_.
  bool ready() const override { return carry_.size() + fresh_.size() - start_ >= static_cast<size_t>(B_ * T_ + 1); }

  DataCursor take(uint16_t* rows) override {
    for (int64_t r = 0; r < B_; ++r)  // row r: the window's tokens [r*T, r*T+T]
      copy_tokens(rows + r * (T_ + 1), start_ + static_cast<size_t>(r * T_), static_cast<size_t>(T_ + 1));
    start_ += static_cast<size_t>(B_ * T_);
    consumed_ += static_cast<uint64_t>(B_ * T_);
    return cursor();
  }

  // Keeps what the next window starts with.
  void settle() override {
    if (start_ < carry_.size()) {
      carry_.erase(carry_.begin(), carry_.begin() + static_cast<std::ptrdiff_t>(start_));
      carry_.insert(carry_.end(), fresh_.begin(), fresh_.end());
    } else {
      carry_.assign(fresh_.begin() + static_cast<std::ptrdiff_t>(start_ - carry_.size()), fresh_.end());
    }
    fresh_.clear();
    start_ = 0;
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

  // dst <- tokens [start, start + n) of carry_ followed by fresh_.
  void copy_tokens(uint16_t* dst, size_t start, size_t n) const {
    if (start < carry_.size()) {
      const size_t k = std::min(n, carry_.size() - start);
      std::memcpy(dst, carry_.data() + start, k * sizeof(uint16_t));
      dst += k;
      n -= k;
      start += k;
    }
    std::memcpy(dst, fresh_.data() + (start - carry_.size()), n * sizeof(uint16_t));
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

  const RunContext& rc_;
  int64_t B_, T_;
  uint64_t skip_;
  std::vector<uint16_t> carry_;  // tokens of earlier chunks not yet consumed
  std::vector<uint16_t> fresh_;  // the last chunk's (kept) tokens
  size_t start_ = 0;             // the next window's first token, counted from carry_'s first
  std::deque<ChunkStart> chunks_;
  std::deque<Piece> pieces_;
  uint64_t kept_ = 0;      // tokens that entered the stream
  uint64_t consumed_ = 0;  // tokens of the stream the batches so far consumed
  // The document the next input token belongs to: its place, which token of it that is, and how
  // many tokens of it are still to drop.
  datasets::DocKey doc_;
  uint64_t token_ = 0, drop_ = 0;
  bool known_ = false, by_shard_ = false;
};

}  // namespace

std::unique_ptr<BatchRows> window_rows(const RunContext& rc) { return std::make_unique<WindowRows>(rc); }

}  // namespace pipeline::stages
