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

#include "datasets/sources/document_mix.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/parquet/parquet_reader.h"
#include "graph/stage.h"
#include "stages/lane_reading.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

// "PATH=WEIGHT" (WEIGHT > 0; "PATH" alone weighs 1), PATH resolved like [data] dataset.
datasets::MixSource parse_mix_entry(const std::string& entry, const RunContext& rc, const std::string& stage) {
  datasets::MixSource src;
  auto eq = entry.rfind('=');
  std::string path = eq == std::string::npos ? entry : entry.substr(0, eq);
  if (eq != std::string::npos) {
    const std::string w = entry.substr(eq + 1);
    size_t used = 0;
    try {
      src.weight = std::stod(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != w.size() || !(src.weight > 0))
      throw std::invalid_argument("[stages." + stage + "] mix: \"" + entry +
                                  "\": expected PATH=WEIGHT with a weight > 0, got weight '" + w + "'");
  }
  src.dir = config::resolve_data_path(path, rc.cfg.file, rc.cfg.source_dir);
  return src;
}

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
    auto [dir, split] = source_dataset(rc_, ctx.options);
    const auto& mix = ctx.options.get_string_list("mix");
    const std::string& column = ctx.options.get_string("column");
    if (rc_.lanes) {
      std::vector<datasets::SourceSpec> sources;
      if (mix.empty()) sources.push_back({dir.string(), 1.0});
      for (const auto& e : mix) {
        const auto src = parse_mix_entry(e, rc_, ctx.name);
        sources.push_back({src.dir.string(), src.weight});
      }
      lanes_.emplace(rc_, sources, LaneReadOptions{split, column, ctx.options.get_bool("shuffle")},
                     datasets::UnitContent::documents, ctx.name);
      return;
    }
    if (mix.empty()) {
      if (rc_.start.pos.mixed)
        throw std::invalid_argument("the checkpoint's data position is a mix of datasets, but [stages." + ctx.name +
                                    "] mix is empty");
      if (datasets::is_parquet_source(dir)) {
        parquet_.emplace();
        parquet_->open(dir, rc_.start.pos.pos, rc_.cfg.data.loop,
                       {.column = column,
                        .shuffle = ctx.options.get_bool("shuffle"),
                        .seed = static_cast<uint64_t>(rc_.cfg.run.seed),
                        .partition = data_partition(rc_)});
        return;
      }
      reader_.open(dir, split, rc_.start.pos.pos, rc_.cfg.data.loop, reader_options(rc_));
      return;
    }
    if (rc_.start.done && !rc_.start.pos.mixed)
      throw std::invalid_argument("the checkpoint's data position is one dataset's, but [stages." + ctx.name +
                                  "] mix names " + std::to_string(mix.size()) + " datasets");
    std::vector<datasets::MixSource> sources;
    for (const auto& e : mix) sources.push_back(parse_mix_entry(e, rc_, ctx.name));
    datasets::MixPosition start = rc_.start.pos.mixed ? rc_.start.pos.mix : datasets::MixPosition{};
    if (rc_.start.pos.mixed && start.sources.size() != sources.size())
      throw std::invalid_argument("the checkpoint's data position mixes " + std::to_string(start.sources.size()) +
                                  " datasets, [stages." + ctx.name + "] mix names " + std::to_string(sources.size()));
    mixed_.emplace();
    mixed_->open(sources, split, static_cast<uint64_t>(rc_.cfg.run.seed), start, reader_options(rc_), column);
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
      if (mixed_) {
        mixed_->next(doc_, nullptr, &mark);  // mixed sources loop: never runs dry
        doc = doc_;
      } else if (parquet_) {  // a view into the reader's decoded text: no copy on the way
        if (!parquet_->next(doc, &mark)) {
          more = false;
          break;
        }
      } else if (reader_.next(doc_, &mark)) {
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
    if (mixed_) {
      p.mixed = true;
      p.mix = mixed_->position();
    } else {
      p.pos = parquet_ ? parquet_->position() : reader_.position();
    }
    return p;
  }

  RunContext& rc_;
  size_t chunk_bytes_;
  std::string doc_;
  datasets::TextDatasetReader reader_;
  std::optional<datasets::ParquetDocumentReader> parquet_;
  std::optional<datasets::MixedDocumentReader> mixed_;
  std::optional<LaneReader> lanes_;  // the lanes order
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(read_shards, {.name = "read_shards",
                                  .output = typeid(TextChunk),
                                  .factory = graph::make_factory<ReadShards>()});

}  // namespace
}  // namespace pipeline::stages
