// read_shards: the source of a training graph. Streams documents from the text shards of a
// prepared dataset (zstd, decompressed incrementally), in order, from the run's resume position;
// from Parquet files (a file, directory, glob or hub snapshot: datasets/parquet/parquet_reader.h, row
// groups shuffled with the run's seed, decoded on the reader's own thread); or, with `mix`, from
// several of these drawn by weight (reproducible and resumable). Documents
// leave in chunks of about `chunk_bytes` of text (whole documents), one message per chunk, each
// document marked with its place (for checkpoints that any number of ranks resumes).
#include <algorithm>

#include "graph/stage.h"
#include "stages/dry_run.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

// About one batch of text per chunk (GPT-2 BPE averages about 4 bytes per token on English),
// so that pack usually makes zero or one batch per chunk.
size_t auto_chunk_bytes(const RunContext& rc) {
  const int64_t bytes = 4 * rc.cfg.training.batch_size * rc.cfg.training.seq_len;
  return static_cast<size_t>(std::clamp<int64_t>(bytes, 1 << 10, 1 << 20));
}

class ReadShards : public graph::Stage {
 public:
  explicit ReadShards(const graph::StageContext& ctx) : rc_(run_context(ctx)) {
    auto chunk = ctx.options.get_int_or_auto("chunk_bytes");
    chunk_bytes_ = chunk ? static_cast<size_t>(*chunk) : auto_chunk_bytes(rc_);
    // Opening here, at build time, makes a missing or corrupt dataset an error before training starts.
    datasets::SourceRequest req = source_request(rc_.cfg, ctx.options, ctx.name, /*tokens=*/false);
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
  datasets::OpenedSource source_;  // a text dataset's, Parquet's or a mix's reader (stages/dry_run.h)
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(read_shards, {.name = "read_shards",
                                  .output = typeid(TextChunk),
                                  .factory = graph::make_factory<ReadShards>()});

}  // namespace
}  // namespace pipeline::stages
