// Document lanes (document_lanes.h): per lane, a walk through each source's units and the mix's
// draws; the openers (one per source) shared by the lanes of this set.
#include "datasets/lanes/document_lanes.h"

#include <algorithm>

#include "datasets/lanes/source_walk.h"

namespace pipeline::datasets {

struct DocumentLanes::Impl {
  struct Lane {
    uint32_t lane = 0;
    uint64_t draws = 0;
    uint64_t drop = 0;  // tokens of the next document delivered before a resume
    std::vector<SourceWalk<DocumentUnit>> sources;
    bool ended = false;
  };
  DataOrder order;
  std::vector<std::unique_ptr<UnitOpener>> openers;
  std::vector<Lane> lanes;
  size_t high_water = 0;
};

DocumentLanes::DocumentLanes(const DataOrder& order, const std::vector<LaneCursor>& starts)
    : impl_(std::make_unique<Impl>()) {
  if (order.sources.empty()) throw DatasetError("document lanes: a data order without sources");
  if (order.content != UnitContent::documents)
    throw DatasetError(order.sources.front().catalog->source + ": holds tokens, not documents: read it with token lanes");
  impl_->order = order;
  for (const OrderSource& s : impl_->order.sources) impl_->openers.push_back(std::make_unique<UnitOpener>(*s.store, s.catalog));
  check_cursors(order, starts);
  for (const LaneCursor& c : starts) {
    Impl::Lane lane;
    lane.lane = c.lane;
    lane.draws = c.draws;
    lane.drop = c.tokens;
    for (size_t s = 0; s < order.sources.size(); ++s) lane.sources.emplace_back(impl_->order, s, c.lane, c.sources[s]);
    impl_->lanes.push_back(std::move(lane));
  }
}

DocumentLanes::~DocumentLanes() = default;
DocumentLanes::DocumentLanes(DocumentLanes&&) noexcept = default;
DocumentLanes& DocumentLanes::operator=(DocumentLanes&&) noexcept = default;

size_t DocumentLanes::size() const { return impl_->lanes.size(); }
uint32_t DocumentLanes::lane(size_t i) const { return impl_->lanes.at(i).lane; }

bool DocumentLanes::next(size_t i, std::string_view& document, LanePlace& place) {
  Impl::Lane& l = impl_->lanes.at(i);
  if (l.ended) return false;
  const size_t s = impl_->order.pick(l.lane, l.draws);
  SourceWalk<DocumentUnit>& walk = l.sources[s];
  for (;;) {
    DocumentUnit* unit = walk.current(*impl_->openers[s]);
    if (!unit) {
      l.ended = true;
      return false;
    }
    impl_->high_water = std::max(impl_->high_water, unit->memory());
    uint64_t item = 0;
    if (unit->next(document, item)) {
      place = LanePlace{l.draws, static_cast<uint32_t>(s), walk.n(), item, l.drop};
      walk.delivered();
      ++l.draws;
      l.drop = 0;
      return true;
    }
    walk.unit_done();
  }
}

size_t DocumentLanes::memory() const {
  size_t bytes = 0;
  for (const auto& o : impl_->openers) bytes += o->memory();
  for (const auto& l : impl_->lanes)
    for (const auto& w : l.sources) bytes += w.memory();
  return bytes;
}

size_t DocumentLanes::unit_memory_high_water() const { return impl_->high_water; }

}  // namespace pipeline::datasets
