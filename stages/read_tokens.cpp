// read_tokens: a source that replaces read_shards + tokenize. Reads pre-tokenized uint16 ids from
// the token shards of a prepared dataset (`pipeline prepare --tokens`) or from llm.c shards. In
// the lanes order ([data] order = "lanes") it reads this rank's lanes, a chunk at a time from the
// neediest (stages/lane_reading.h), a chunk of about what one lane gives a batch. In the documents
// order it streams this rank's share, a chunk of one batch's worth of tokens (B*T) by default, so
// that each chunk completes about one batch and pack's buffers, not overflow ones, carry them
// (stages/pack.cpp).
#include <optional>

#include "datasets/sources/dataset_reader.h"
#include "graph/stage.h"
#include "stages/dry_run.h"
#include "stages/lane_reading.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class ReadTokens : public graph::Stage {
 public:
  explicit ReadTokens(const graph::StageContext& ctx)
      : rc_(run_context(ctx)) {
    const auto chunk = ctx.options.get_int_or_auto("chunk_tokens");
    chunk_ = chunk ? static_cast<size_t>(*chunk)
         : rc_.lanes ? lane_chunk_tokens(rc_)
                     : static_cast<size_t>(rc_.cfg.training.batch_size * rc_.cfg.training.seq_len);
    // Opening here, at build time, makes a missing or corrupt dataset an error before training starts.
    datasets::SourceRequest req = source_request(rc_.cfg, ctx.options, ctx.name, /*tokens=*/true);
    if (rc_.lanes) {
      lanes_.emplace(rc_, std::move(req), ctx.name);
      return;
    }
    if (rc_.start.pos.mixed)
      throw std::invalid_argument("the checkpoint's data position is a mix of datasets; read_tokens reads one");
    req.start = rc_.start.pos.pos;
    req.options = reader_options(rc_);
    reader_ = std::move(*open_stage_source(req, ctx.name).tokens);
  }

  bool produce(graph::Emitter& out) override {
    if (out.stop_requested()) return false;
    TokenChunk c;
    if (lanes_) {
      if (!lanes_->next_tokens(c, chunk_)) return false;
      out.emit(std::move(c));
      return true;
    }
    c.pos.pos = reader_.position();
    c.tokens.resize(chunk_);
    size_t n = reader_.read(c.tokens, &c.marks);
    if (n == 0) return false;
    c.tokens.resize(n);
    out.emit(std::move(c));
    return true;
  }

 private:
  RunContext& rc_;
  size_t chunk_ = 0;
  datasets::TokenDatasetReader reader_;
  std::optional<LaneReader> lanes_;  // the lanes order
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(read_tokens, {.name = "read_tokens",
                                  .output = typeid(TokenChunk),
                                  .factory = graph::make_factory<ReadTokens>()});

}  // namespace
}  // namespace pipeline::stages
