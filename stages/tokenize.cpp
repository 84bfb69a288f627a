// tokenize: GPT-2 BPE over chunks of documents, any number of workers. Each document starts
// with <|endoftext|>, GPT-2's document separator, so the token stream equals the one in token
// shards written by `pipeline prepare --tokens`; a chunk of documents becomes one token chunk,
// which in the lanes order keeps the chunk's lane and each document's place.
#include "base/cache_line.h"
#include "datasets/tokenizer/tokenizer.h"
#include "graph/stage.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class Tokenize : public graph::Stage {
 public:
  explicit Tokenize(const graph::StageContext& ctx)
      : tok_(datasets::Tokenizer::gpt2()), allow_special_(ctx.options.get_bool("allow_special")), scratch_(static_cast<size_t>(ctx.workers)) {}

  void process(graph::Item in, graph::Emitter& out) override {
    const auto& chunk = in.get<TextChunk>();
    // Per-worker buffer: no allocation per chunk in steady state. Each on its own cache line:
    // every push_back writes the vector's end pointer, and two workers' headers side by side
    // cost a third of the stage's speed, depending on where the heap put the array.
    auto& ids = scratch_[static_cast<size_t>(out.worker())].value;
    ids.clear();
    TokenChunk c;
    c.marks = chunk.marks;  // one per document: where its tokens start, for pack
    std::vector<uint32_t> ends;  // the lanes order: where each document's tokens end
    if (chunk.lane >= 0) ends.reserve(chunk.documents());
    for (size_t i = 0; i < chunk.documents(); ++i) {
      if (i < c.marks.size()) c.marks[i].at = static_cast<uint32_t>(ids.size());
      ids.push_back(datasets::Tokenizer::eot_id);
      if (allow_special_)
        tok_.encode_append(chunk.document(i), true, ids);
      else
        tok_.encode_ordinary_append(chunk.document(i), ids);
      if (chunk.lane >= 0) ends.push_back(static_cast<uint32_t>(ids.size()));
    }
    c.pos = chunk.pos;
    c.tokens.assign(ids.begin(), ids.end());  // ids < 50257 fit in uint16
    if (chunk.lane >= 0) {  // the lanes order: each document is a piece of its lane, its <|endoftext|> first
      c.lane = chunk.lane;
      c.places = chunk.places;
      c.content = datasets::UnitContent::documents;
      c.estimate = chunk.estimate;
      c.ends = std::move(ends);
    }
    out.emit(std::move(c));
  }

 private:
  const datasets::Tokenizer& tok_;
  bool allow_special_;
  std::vector<CacheLinePadded<std::vector<uint32_t>>> scratch_;
};

// Declared, with its options, in stages/catalog.cpp.
PIPELINE_STAGE_IMPL(tokenize, {.name = "tokenize",
                               .input = typeid(TextChunk),
                               .output = typeid(TokenChunk),
                               .factory = graph::make_factory<Tokenize>()});

}  // namespace
}  // namespace pipeline::stages
