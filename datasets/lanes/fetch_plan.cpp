// Plans the remote stores' fetching from a rank's lane cursors (fetch_plan.h).
#include "datasets/lanes/fetch_plan.h"

#include <memory>

namespace pipeline::datasets {
namespace {

io::UnitRef unit_ref(const Catalog& catalog, uint64_t unit) {
  const Unit& u = catalog.units.at(unit);
  return {catalog.files.at(u.file).object, u.offset, u.bytes};
}

}  // namespace

void fetch_ahead(DataOrder& order, const std::vector<LaneCursor>& cursors) {
  bool any = false;
  for (size_t s = 0; s < order.sources.size(); ++s) {
    OrderSource& source = order.sources[s];
    if (!source.store || !source.store->remote()) continue;
    any = true;
    std::vector<io::LaneUnits> lanes;
    for (const LaneCursor& c : cursors) {
      // The plan and catalogue are copied into the closure: the fetch threads call it while the
      // order may move.
      lanes.push_back([plan = source.plan, catalog = source.catalog, lane = c.lane,
                       n = c.sources.at(s).unit]() mutable -> std::optional<io::UnitRef> {
        const auto planned = plan.lane_unit(lane, n);
        if (!planned) return std::nullopt;
        ++n;
        return unit_ref(*catalog, planned->unit);
      });
    }
    source.store->prefetch(std::move(lanes));
  }
  if (!any) return;
  std::vector<std::pair<std::shared_ptr<io::Store>, std::shared_ptr<const Catalog>>> stores;
  for (const OrderSource& source : order.sources) stores.emplace_back(source.store, source.catalog);
  order.unit_done = [stores = std::move(stores), before = std::move(order.unit_done)](size_t source, uint64_t unit) {
    if (before) before(source, unit);
    const auto& [store, catalog] = stores.at(source);
    if (store && store->remote()) store->release(unit_ref(*catalog, unit));
  };
}

}  // namespace pipeline::datasets
