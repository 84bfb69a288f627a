// See open_source.h.
#include "datasets/sources/open_source.h"

#include <stdexcept>

namespace pipeline::datasets {

namespace {

// The lanes order's sources: the one dataset, or the mix's, by weight.
std::vector<SourceSpec> order_sources(const SourceRequest& r) {
  if (r.mix.empty()) return {{r.dataset.string(), 1.0}};
  std::vector<SourceSpec> out;
  for (const auto& m : r.mix) out.push_back({m.dir.string(), m.weight});
  return out;
}

}  // namespace

OpenedSource open_source(const SourceRequest& r) {
  OpenedSource s;
  if (r.lanes > 0) {
    DataOrderOptions o;
    o.lanes = r.lanes;
    o.seed = r.seed;
    o.shuffle = r.shuffle;
    o.loop = r.loop;
    o.split = r.split;
    o.column = r.column;
    o.llmc_unit_tokens = r.llmc_unit_tokens;
    s.order = std::make_unique<DataOrder>(open_data_order(order_sources(r), o));
  } else if (!r.mix.empty()) {
    if (r.tokens) throw std::invalid_argument("a mix draws documents: it cannot be read as token ids");
    s.mixed = std::make_unique<MixedDocumentReader>();
    s.mixed->open(r.mix, r.split, r.seed, r.mix_start, r.options, r.column);
  } else if (r.tokens) {
    s.tokens = std::make_unique<TokenDatasetReader>();
    s.tokens->open(r.dataset, r.split, r.start, r.loop, r.options);
  } else if (is_parquet_source(r.dataset)) {
    s.parquet = std::make_unique<ParquetDocumentReader>();
    s.parquet->open(r.dataset, r.start, r.loop,
                    {.column = r.column, .shuffle = r.shuffle, .seed = r.seed, .partition = r.options.partition});
  } else {
    s.text = std::make_unique<TextDatasetReader>();
    s.text->open(r.dataset, r.split, r.start, r.loop, r.options);
  }
  return s;
}

}  // namespace pipeline::datasets
