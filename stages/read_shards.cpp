// read_shards: the source of a training graph. Reads documents from the text shards of a prepared
// dataset, from Parquet files (a file, directory, glob or hub snapshot), or, with `mix`, from
// several of these drawn by weight (reproducible and resumable). Documents leave in chunks of
// about `chunk_bytes` of text (whole documents), one message per chunk.
//
// In the lanes order ([data] order = "lanes", docs/data_order.md) it reads this rank's lanes, each
// its own units by random access, a chunk at a time from the neediest lane (stages/lane_reading.h);
// a chunk is one lane's, and each document carries its place in the lane. In the documents order
// it streams this rank's documents (d % W == r) from the run's resume position: shards
// decompressed incrementally, Parquet row groups shuffled with the run's seed
// (datasets/parquet/parquet_reader.h), each document marked with its place (for checkpoints that
// any number of ranks resumes).
#include <algorithm>
#include <optional>

#include "graph/stage.h"
#include "stages/dry_run.h"
#include "stages/lane_reading.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

// About one batch of text per chunk (GPT-2 BPE averages about 4 bytes per token on English),
// so that pack usually makes zero or one batch per chunk; in the lanes order, about what one lane
// gives a batch (lane_chunk_tokens), so that pack holds about a chunk per lane.
size_t auto_chunk_bytes(const RunContext& rc) {
  const auto tokens = rc.lanes ? static_cast<int64_t>(lane_chunk_tokens(rc))
                               : rc.cfg.training.batch_size * rc.cfg.training.seq_len;
  return static_cast<size_t>(std::clamp<int64_t>(4 * tokens, 1 << 10, 1 << 20));
}

class ReadShards : public graph::Stage {
 public:
  explicit ReadShards(const graph::StageContext& ctx) : rc_(run_context(ctx)) {
    auto chunk = ctx.options.get_int_or_auto("chunk_bytes");
    chunk_bytes_ = chunk ? static_cast<size_t>(*chunk) : auto_chunk_bytes(rc_);
    // Opening here, at build time, makes a missing or corrupt dataset an error before training starts.
    datasets::SourceRequest req = source_request(rc_.cfg, ctx.options, ctx.name, /*tokens=*/false);
    if (rc_.lanes) {
      lanes_.emplace(rc_, std::move(req), ctx.name);
      return;
    }
    req.options = reader_options(rc_);
    if (req.mix.empty()) {
      if (rc_.start.pos.mixed)
        throw std::invalid_argument("the checkpoint's data position is a mix of datasets, but [stages." + ctx.name +
                                    "] mix is empty");
      req.start = rc_.start.pos.pos;
    } else {
      if (rc_.start.done && !rc_.start.pos.mixed)
        throw std::invalid_argument("the checkpoint's data position is one dataset's, but [stages." + ctx.name +
                                    "] mix names " + std::to_string(req.mix.size()) + " datasets");
      if (rc_.start.pos.mixed && rc_.start.pos.mix.sources.size() != req.mix.size())
        throw std::invalid_argument("the checkpoint's data position mixes " +
                                    std::to_string(rc_.start.pos.mix.sources.size()) + " datasets, [stages." +
                                    ctx.name + "] mix names " + std::to_string(req.mix.size()));
      if (rc_.start.pos.mixed) req.mix_start = rc_.start.pos.mix;
    }
    source_ = open_stage_source(req, ctx.name);
  }

  bool produce(graph::Emitter& out) override {
    if (out.stop_requested()) return false;
    if (lanes_) {
      TextChunk chunk;
      chunk.text.reserve(chunk_bytes_ + chunk_bytes_ / 4);
      if (!lanes_->next_documents(chunk, chunk_bytes_)) return false;
      out.emit(std::move(chunk));
      return true;
    }
    TextChunk chunk;
    chunk.pos = position();
    chunk.text.reserve(chunk_bytes_ + chunk_bytes_ / 4);
    bool more = true;
    datasets::DocMark mark;
    while (chunk.text.size() < chunk_bytes_) {
      std::string_view doc;
      if (source_.mixed) {
        source_.mixed->next(doc_, nullptr, &mark);  // mixed sources loop: never runs dry
        doc = doc_;
      } else if (source_.parquet) {  // a view into the reader's decoded text: no copy on the way
        if (!source_.parquet->next(doc, &mark)) {
          more = false;
          break;
        }
      } else if (source_.text->next(doc_, &mark)) {
        doc = doc_;
      } else {
        more = false;
        break;
      }
      mark.at = static_cast<uint32_t>(chunk.ends.size());
      chunk.marks.push_back(mark);
      chunk.text += doc;
      chunk.ends.push_back(static_cast<uint32_t>(chunk.text.size()));
    }
    if (!chunk.ends.empty()) out.emit(std::move(chunk));
    return more;
  }

 private:
  SourcePosition position() const {
    SourcePosition p;
    if (source_.mixed) {
      p.mixed = true;
      p.mix = source_.mixed->position();
    } else {
      p.pos = source_.parquet ? source_.parquet->position() : source_.text->position();
    }
    return p;
  }

  RunContext& rc_;
  size_t chunk_bytes_;
  std::string doc_;
  datasets::OpenedSource source_;  // the documents order: a text dataset's, Parquet's or a mix's reader
  std::optional<LaneReader> lanes_;  // the lanes order
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(read_shards, {.name = "read_shards",
                                  .output = typeid(TextChunk),
                                  .factory = graph::make_factory<ReadShards>()});

}  // namespace
}  // namespace pipeline::stages
