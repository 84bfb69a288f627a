// read_shards: the source of a training graph. Streams documents from the text shards of a
// prepared dataset (zstd, decompressed incrementally), in order, from the run's resume position.
#include "datasets/dataset_reader.h"
#include "graph/stage.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class ReadShards : public graph::Stage {
 public:
  explicit ReadShards(const graph::StageContext& ctx) : rc_(require_run_context(ctx.name)) {
    // Opening here, at build time, makes a missing or corrupt dataset an error before training starts.
    auto [dir, split] = source_dataset(rc_, ctx.options);
    reader_.open(dir, split, rc_.start.pos, rc_.cfg.data.loop);
  }

  bool produce(graph::Emitter& out) override {
    if (out.stop_requested() || rc_.input_done.load(std::memory_order_relaxed)) return false;
    TextDocument doc;
    doc.pos = reader_.position();
    if (!reader_.next(doc.text)) return false;
    out.emit(std::move(doc));
    return true;
  }

 private:
  RunContext& rc_;
  datasets::TextDatasetReader reader_;
};

PIPELINE_STAGE(read_shards,
               {.name = "read_shards",
                .doc = "reads documents from the text shards of a prepared dataset, in order, resumably",
                .input = graph::no_port(),
                .output = graph::port<TextDocument>("documents"),
                .options = config::Schema()
                               .string("dataset", "", "dataset directory (empty: [data] dataset)")
                               .string("split", "", "split to read (empty: [data] train_split)"),
                .max_workers = 1,
                .factory = graph::make_factory<ReadShards>()});

}  // namespace
}  // namespace pipeline::stages
