// Rows out of lanes (lane_rows.h). Each lane keeps its unpassed tokens in one buffer, indexed by
// the lane's stream position (tokens counted from its start cursor), and the pieces they came
// from; a row passes T tokens, and the pieces it passes whole fold into the lane's state, the
// cursor after them.
#include "datasets/lanes/lane_rows.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "datasets/dataset_error.h"

namespace pipeline::datasets {

struct LaneRows::Lane {
  struct Piece {
    uint64_t at = 0;  // stream position of its first kept token
    uint64_t n = 0;   // tokens kept
    LanePlace place;  // text: place.token is the document's first kept token
  };
  uint32_t lane = 0;
  std::vector<uint16_t> buf;  // tokens [head, size) are stream positions [base, end)
  size_t head = 0;
  uint64_t base = 0, end = 0, rows = 0;
  std::deque<Piece> pieces;
  LaneCursor state;  // where the lane goes on after every piece folded so far
  // What the next piece must be (pieces arrive in the lane's order).
  bool fresh = true;  // no piece yet: the first continues the start cursor
  LanePlace last;
  uint64_t last_n = 0;

};

namespace {

// `c` moved past a piece passed whole: a document (the next item of its source, the next draw),
// or a run of a unit's tokens.
void fold(LaneCursor& c, const LanePlace& place, uint64_t kept, UnitContent content) {
  if (content == UnitContent::documents) {
    c.sources[place.source] = {place.unit, place.item + 1};
    c.draws = place.draw + 1;
    c.tokens = 0;
  } else {
    c.sources[0] = {place.unit, place.item + kept};
  }
}

}  // namespace

LaneRows::LaneRows(uint32_t seq_len, UnitContent content, const std::vector<LaneCursor>& starts)
    : T_(seq_len), content_(content) {
  if (seq_len == 0) throw DatasetError("lane rows: a row needs T >= 1 (found seq_len 0)");
  if (starts.empty()) throw DatasetError("lane rows: no lanes");
  for (const LaneCursor& c : starts) {
    if (c.sources.empty() || (content == UnitContent::tokens && c.sources.size() != 1))
      throw DatasetError("lane rows: lane " + std::to_string(c.lane) + "'s cursor \"" + c.str() + "\" has " +
                         std::to_string(c.sources.size()) + " sources");
    if (c.lane >= index_.size()) index_.resize(c.lane + 1, -1);
    if (index_[c.lane] >= 0) throw DatasetError("lane rows: lane " + std::to_string(c.lane) + " given twice");
    index_[c.lane] = static_cast<int32_t>(lanes_.size());
    Lane lane;
    lane.lane = c.lane;
    lane.state = c;
    lanes_.push_back(std::move(lane));
  }
}

LaneRows::~LaneRows() = default;
LaneRows::LaneRows(LaneRows&&) noexcept = default;
LaneRows& LaneRows::operator=(LaneRows&&) noexcept = default;

size_t LaneRows::size() const { return lanes_.size(); }
uint32_t LaneRows::lane(size_t i) const { return lanes_.at(i).lane; }
uint32_t LaneRows::seq_len() const { return T_; }

size_t LaneRows::index_of(uint32_t lane) const {
  if (lane >= index_.size() || index_[lane] < 0)
    throw DatasetError("lane rows: lane " + std::to_string(lane) + " is not one of this rank's " +
                       std::to_string(lanes_.size()) + " lanes");
  return static_cast<size_t>(index_[lane]);
}

void LaneRows::push(size_t i, std::span<const uint16_t> tokens, const LanePlace& place) {
  Lane& l = lanes_.at(i);
  auto out_of_order = [&](const std::string& expected) {
    return DatasetError("lane rows: lane " + std::to_string(l.lane) + ": a piece at draw " + std::to_string(place.draw) +
                        " source " + std::to_string(place.source) + " unit " + std::to_string(place.unit) + " item " +
                        std::to_string(place.item) + " token " + std::to_string(place.token) + " where " + expected +
                        " was next (pieces must arrive in the lane's order)");
  };
  uint64_t drop = 0;
  if (content_ == UnitContent::documents) {
    const uint64_t draw = l.fresh ? l.state.draws : l.last.draw + 1;
    const uint64_t token = l.fresh ? l.state.tokens : 0;
    if (place.draw != draw || place.token != token || place.source >= l.state.sources.size())
      throw out_of_order("draw " + std::to_string(draw) + " token " + std::to_string(token));
    if (place.token > tokens.size())
      throw DatasetError("lane rows: lane " + std::to_string(l.lane) + ": a document of " +
                         std::to_string(tokens.size()) + " tokens resumed after its token " + std::to_string(place.token) +
                         " (the document is not the one the cursor was taken in)");
    drop = place.token;
  } else {
    const SourceCursor next = l.fresh ? l.state.sources[0] : SourceCursor{l.last.unit, l.last.item + l.last_n};
    const bool follows = (place.unit == next.unit && place.item == next.item) || (place.unit > next.unit && place.item == 0);
    if (place.source != 0 || place.token != 0 || !follows)
      throw out_of_order("unit " + std::to_string(next.unit) + " token " + std::to_string(next.item));
  }
  const std::span<const uint16_t> kept = tokens.subspan(static_cast<size_t>(drop));
  l.buf.insert(l.buf.end(), kept.begin(), kept.end());
  l.pieces.push_back({l.end, kept.size(), place});
  l.end += kept.size();
  l.fresh = false;
  l.last = place;
  l.last_n = kept.size();
  high_water_ = std::max(high_water_, l.end - l.base);
}

uint64_t LaneRows::buffered(size_t i) const {
  const Lane& l = lanes_.at(i);
  return l.end - l.base;
}

uint64_t LaneRows::rows_ready(size_t i) const {
  const uint64_t n = buffered(i);
  return n == 0 ? 0 : (n - 1) / T_;
}

uint64_t LaneRows::rows_taken(size_t i) const { return lanes_.at(i).rows; }

void LaneRows::take_row(size_t i, std::span<uint16_t> row) {
  Lane& l = lanes_.at(i);
  if (row.size() != size_t(T_) + 1)
    throw DatasetError("lane rows: a row is T+1 = " + std::to_string(T_ + 1) + " tokens, given room for " +
                       std::to_string(row.size()));
  if (rows_ready(i) == 0)
    throw DatasetError("lane rows: lane " + std::to_string(l.lane) + " holds " + std::to_string(buffered(i)) +
                       " tokens, not the T+1 = " + std::to_string(T_ + 1) + " of a row");
  std::memcpy(row.data(), l.buf.data() + l.head, row.size_bytes());
  l.head += T_;
  l.base += T_;
  ++l.rows;
  while (!l.pieces.empty() && l.pieces.front().at + l.pieces.front().n <= l.base) {
    fold(l.state, l.pieces.front().place, l.pieces.front().n, content_);
    l.pieces.pop_front();
  }
  // The passed tokens go once they are most of the buffer: amortised O(1) a token.
  if (l.head >= 4096 && l.head * 2 >= l.buf.size()) {
    l.buf.erase(l.buf.begin(), l.buf.begin() + static_cast<std::ptrdiff_t>(l.head));
    l.head = 0;
  }
}

LaneCursor LaneRows::cursor(size_t i) const {
  const Lane& l = lanes_.at(i);
  LaneCursor c = l.state;
  const uint64_t at = l.base;
  for (const Lane::Piece& p : l.pieces) {
    if (p.at + p.n <= at) {  // passed whole (a piece of no tokens at the cursor, too)
      fold(c, p.place, p.n, content_);
      continue;
    }
    if (content_ == UnitContent::documents) {
      c.sources[p.place.source] = {p.place.unit, p.place.item};
      c.draws = p.place.draw;
      c.tokens = p.place.token + (at - p.at);
    } else {
      c.sources[0] = {p.place.unit, p.place.item + (at - p.at)};
    }
    break;
  }
  return c;
}

uint64_t LaneRows::buffered_high_water() const { return high_water_; }

size_t LaneRows::memory() const {
  size_t bytes = lanes_.capacity() * sizeof(Lane) + index_.capacity() * sizeof(int32_t);
  for (const Lane& l : lanes_)
    bytes += l.buf.capacity() * sizeof(uint16_t) + l.pieces.size() * sizeof(Lane::Piece) +
             l.state.sources.capacity() * sizeof(SourceCursor);
  return bytes;
}

}  // namespace pipeline::datasets
