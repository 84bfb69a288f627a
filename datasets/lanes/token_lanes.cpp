// Token lanes (token_lanes.h): per lane, a walk through the source's units.
#include "datasets/lanes/token_lanes.h"

#include <algorithm>

#include "datasets/lanes/source_walk.h"

namespace pipeline::datasets {

struct TokenLanes::Impl {
  struct Lane {
    uint32_t lane = 0;
    SourceWalk<TokenUnit> walk;
    bool ended = false;
  };
  DataOrder order;
  std::unique_ptr<UnitOpener> opener;
  std::vector<Lane> lanes;
  size_t high_water = 0;
};

TokenLanes::TokenLanes(const DataOrder& order, const std::vector<LaneCursor>& starts) : impl_(std::make_unique<Impl>()) {
  if (order.sources.empty()) throw DatasetError("token lanes: a data order without sources");
  if (order.content != UnitContent::tokens || order.sources.size() != 1)
    throw DatasetError(order.sources.front().catalog->source +
                       ": token lanes read one source of tokens (prepared token shards or llm.c shards)");
  impl_->order = order;
  const OrderSource& source = impl_->order.sources.front();
  impl_->opener = std::make_unique<UnitOpener>(*source.store, source.catalog);
  check_cursors(order, starts);
  for (const LaneCursor& c : starts) {
    if (c.draws != 0 || c.tokens != 0)
      throw DatasetError("lane cursor \"" + c.str() + "\": not a token lane's (it counts draws or tokens of a document)");
    impl_->lanes.push_back({c.lane, SourceWalk<TokenUnit>(impl_->order, 0, c.lane, c.sources[0]), false});
  }
}

TokenLanes::~TokenLanes() = default;
TokenLanes::TokenLanes(TokenLanes&&) noexcept = default;
TokenLanes& TokenLanes::operator=(TokenLanes&&) noexcept = default;

size_t TokenLanes::size() const { return impl_->lanes.size(); }
uint32_t TokenLanes::lane(size_t i) const { return impl_->lanes.at(i).lane; }

size_t TokenLanes::read(size_t i, std::span<uint16_t> out, LanePlace& place) {
  Impl::Lane& l = impl_->lanes.at(i);
  if (l.ended || out.empty()) return 0;
  for (;;) {
    TokenUnit* unit = l.walk.current(*impl_->opener);
    if (!unit) {
      l.ended = true;
      return 0;
    }
    impl_->high_water = std::max(impl_->high_water, unit->memory());
    const uint64_t offset = unit->offset();
    if (const size_t n = unit->read(out); n > 0) {
      place = LanePlace{0, 0, l.walk.n(), offset, 0};
      l.walk.delivered();
      return n;
    }
    l.walk.unit_done();
  }
}

size_t TokenLanes::memory() const {
  size_t bytes = impl_->opener->memory();
  for (const auto& l : impl_->lanes) bytes += l.walk.memory();
  return bytes;
}

size_t TokenLanes::unit_memory_high_water() const { return impl_->high_water; }

}  // namespace pipeline::datasets
