// A run's data order (data_order.h): stores, catalogues and plans of its sources.
#include "datasets/lanes/data_order.h"

#include "datasets/dataset_error.h"
#include "datasets/plan/mix_pick.h"
#include "datasets/plan/splitmix.h"

namespace pipeline::datasets {

size_t DataOrder::pick(uint32_t lane, uint64_t draw) const {
  if (sources.size() == 1) return 0;
  // Each lane draws from a sequence of its own: lane l's draws never depend on another lane's.
  return mix_pick(cumulative, splitmix64(seed ^ splitmix64(0x4d49584c414e4500ull + lane)), draw);  // "MIXLANE"
}

DataOrder make_data_order(std::vector<OrderSource> sources, const DataOrderOptions& options) {
  if (sources.empty()) throw DatasetError("data order: no sources given");
  DataOrder order;
  order.lanes = options.lanes;
  order.seed = options.seed;
  order.content = sources.front().catalog->content;
  std::vector<double> weights;
  std::vector<std::string> names;
  for (const OrderSource& s : sources) {
    weights.push_back(s.weight);
    names.push_back(s.catalog->source);
  }
  order.cumulative = mix_cumulative(weights, names);
  if (sources.size() > 1)
    for (const OrderSource& s : sources)
      if (s.catalog->content != UnitContent::documents)
        throw DatasetError("dataset mix: " + s.catalog->source + " holds tokens (" +
                           source_format_name(s.catalog->format) +
                           "); a mix draws documents, so its sources are text: prepared text datasets and Parquet");
  for (size_t i = 0; i < sources.size(); ++i) {
    OrderSource& s = sources[i];
    const uint64_t seed = splitmix64(options.seed ^ splitmix64(0x534f555243450000ull + i));  // "SOURCE"
    s.plan = DataPlan(s.catalog->units.size(),
                      {.lanes = options.lanes, .seed = seed, .shuffle = options.shuffle, .loop = options.loop},
                      s.catalog->source + " (" + source_format_name(s.catalog->format) + ")");
  }
  order.sources = std::move(sources);
  return order;
}

DataOrder open_data_order(const std::vector<SourceSpec>& specs, const DataOrderOptions& options) {
  return open_data_order(specs, options, nullptr);
}

DataOrder open_data_order(const std::vector<SourceSpec>& specs, const DataOrderOptions& options,
                          std::shared_ptr<io::Store> store) {
  std::vector<OrderSource> sources;
  for (const SourceSpec& spec : specs) {
    OrderSource s;
    s.store = store ? store : std::shared_ptr<io::Store>(io::open_store(spec.source));
    s.catalog = std::make_shared<const Catalog>(build_catalog(*s.store, spec.source,
                                                              {.split = options.split,
                                                               .column = options.column,
                                                               .lanes = options.lanes,
                                                               .llmc_unit_tokens = options.llmc_unit_tokens,
                                                               .verify = options.verify}));
    s.weight = spec.weight;
    sources.push_back(std::move(s));
  }
  return make_data_order(std::move(sources), options);
}

void check_cursors(const DataOrder& order, const std::vector<LaneCursor>& cursors) {
  std::vector<bool> seen(order.lanes, false);
  for (const LaneCursor& c : cursors) {
    if (c.lane >= order.lanes || seen[c.lane])
      throw DatasetError("lane cursor \"" + c.str() + "\": lane " + std::to_string(c.lane) +
                         (c.lane >= order.lanes ? " of " : " given twice among ") + std::to_string(order.lanes) +
                         " lanes");
    if (c.sources.size() != order.sources.size())
      throw DatasetError("lane cursor \"" + c.str() + "\": " + std::to_string(c.sources.size()) +
                         " sources, the data order has " + std::to_string(order.sources.size()));
    seen[c.lane] = true;
  }
}

std::vector<LaneCursor> start_cursors(const DataOrder& order, const std::vector<uint32_t>& lanes) {
  std::vector<LaneCursor> out;
  for (uint32_t l : lanes) out.push_back(LaneCursor::start(l, order.sources.size()));
  return out;
}

}  // namespace pipeline::datasets
