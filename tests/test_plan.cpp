// The data plan and what pack does with lanes, without data files: epoch orders, the lanes' units,
// the ranks' lanes and rows (datasets/plan/data_plan.h), lane cursors as text and JSON
// (lane_cursor.h), rows and cursors out of lanes (datasets/lanes/lane_rows.h), the row hash and
// the neediest lane (lane_demand.h), the latter with pack and a reader on two threads.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/json.h"
#include "datasets/dataset_error.h"
#include "datasets/lanes/lane_demand.h"
#include "datasets/lanes/lane_rows.h"
#include "datasets/lanes/row_hash.h"
#include "datasets/plan/data_plan.h"
#include "datasets/plan/lane_cursor.h"
#include "test_util.h"

using namespace pipeline;
using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;

TEST_CASE("an epoch's order is a permutation drawn from (seed, epoch); without shuffle, the catalogue's") {
  for (uint64_t m : {1, 2, 3, 5, 17, 64, 1000, 4099}) {
    CAPTURE(m);
    DataPlan plan(m, {.lanes = 1, .seed = 1337}, "src");
    std::vector<uint64_t> first;
    for (uint64_t e = 0; e < 3; ++e) {
      std::vector<uint64_t> order;
      for (uint64_t p = 0; p < m; ++p) order.push_back(plan.unit_at(e, p));
      std::vector<uint64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<uint64_t> all(m);
      std::iota(all.begin(), all.end(), 0);
      CHECK(sorted == all);  // every unit once
      if (e == 0) first = order;
      if (e > 0 && m >= 5) CHECK(order != first);  // a new order each epoch
    }
    if (m >= 5) {
      bool identity = true;
      for (uint64_t p = 0; p < m; ++p) identity &= plan.unit_at(0, p) == p;
      CHECK_FALSE(identity);
      DataPlan other(m, {.lanes = 1, .seed = 7}, "src");
      bool same = true;
      for (uint64_t p = 0; p < m; ++p) same &= other.unit_at(0, p) == plan.unit_at(0, p);
      CHECK_FALSE(same);
    }
    DataPlan again(m, {.lanes = 1, .seed = 1337}, "src");
    for (uint64_t p = 0; p < m; ++p) CHECK(again.unit_at(0, p) == first[p]);
    DataPlan ordered(m, {.lanes = 1, .seed = 1337, .shuffle = false}, "src");
    for (uint64_t p = 0; p < m; ++p) CHECK(ordered.unit_at(4, p) == p);
  }
}

TEST_CASE("lane l reads positions l, l+K, ... of every epoch's order; without loop it ends after epoch 0") {
  const uint64_t m = 23;
  const uint32_t k = 5;
  DataPlan plan(m, {.lanes = k, .seed = 3}, "src");
  for (uint64_t e = 0; e < 3; ++e) {
    std::vector<uint64_t> seen;
    for (uint32_t l = 0; l < k; ++l) {
      const uint64_t per = plan.lane_units_per_epoch(l);
      CHECK(per == (m - l + k - 1) / k);
      uint64_t before = 0;  // the lane's units in earlier epochs
      for (uint64_t ee = 0; ee < e; ++ee) before += per;
      for (uint64_t i = 0; i < per; ++i) {
        const auto u = plan.lane_unit(l, before + i);
        REQUIRE(u);
        CHECK(u->epoch == e);
        CHECK(u->unit == plan.unit_at(e, l + i * k));
        seen.push_back(u->unit);
      }
    }
    std::sort(seen.begin(), seen.end());
    CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
    CHECK(seen.size() == m);  // the lanes read every unit of an epoch once between them
  }
  DataPlan once(m, {.lanes = k, .seed = 3, .loop = false}, "src");
  CHECK(once.lane_unit(0, once.lane_units_per_epoch(0) - 1));
  CHECK_FALSE(once.lane_unit(0, once.lane_units_per_epoch(0)));
  CHECK(contains(error_of([&] { plan.lane_unit(5, 0); }), "lane 5 of 5 lanes"));
}

TEST_CASE("too few units for the lanes, and a world that does not divide the lanes: errors that say what to change") {
  std::string e = error_of([] { DataPlan(10, {.lanes = 12}, "data/small (block shards)"); });
  INFO(e);
  CHECK(contains(e, "data/small (block shards): 10 units for 12 lanes"));
  CHECK(contains(e, "[data] lanes to at most 10"));
  CHECK(contains(e, "--block-bytes"));
  CHECK(contains(e, "row groups"));
  CHECK(contains(error_of([] { DataPlan(10, {.lanes = 0}, "x"); }), "[data] lanes = 0"));

  CHECK(lanes_of(1, 4, 12) == std::vector<uint32_t>{1, 5, 9});
  CHECK(lanes_of(0, 1, 3) == std::vector<uint32_t>{0, 1, 2});
  e = error_of([] { lanes_of(0, 5, 12); });
  CHECK(contains(e, "a world of 5 ranks does not divide the run's 12 lanes"));
  CHECK(contains(error_of([] { lanes_of(4, 4, 12); }), "rank 4 of a world of 4"));
  CHECK(contains(error_of([] { RowLayout(12, 5, 24); }), "24 rows a step"));
  CHECK(contains(error_of([] { RowLayout(16, 4, 24); }), "16 lanes"));
}

TEST_CASE("a step's rows are the same (lane, row) pairs for every world size that divides the lanes") {
  const uint32_t k = 12;
  const uint64_t n = 24;  // 2 rows of each lane a step
  std::map<uint32_t, std::vector<std::set<std::pair<uint32_t, uint64_t>>>> by_world;
  for (uint32_t w : {1u, 2u, 3u, 4u, 6u, 12u}) {
    RowLayout layout(k, w, n);
    CHECK(layout.rows_per_rank() == n / w);
    for (uint64_t s = 0; s < 3; ++s) {
      std::set<std::pair<uint32_t, uint64_t>> rows;
      for (uint32_t r = 0; r < w; ++r) {
        std::map<uint32_t, uint64_t> next_row;  // a rank takes each lane's rows in order
        for (uint64_t q = 0; q < layout.rows_per_rank(); ++q) {
          const auto [lane, row] = layout.rank_row(r, s, q);
          CHECK(lane % w == r);  // only its own lanes
          if (next_row.count(lane)) CHECK(row == next_row[lane]);
          next_row[lane] = row + 1;
          CHECK(rows.insert({lane, row}).second);
        }
      }
      CHECK(rows.size() == n);
      by_world[w].push_back(rows);
    }
  }
  for (const auto& [w, steps] : by_world) CHECK(steps == by_world.at(1));
  // Step s holds rows s*(N/K) .. of every lane.
  CHECK(by_world.at(1)[2].count({7, 4}) == 1);
  CHECK(by_world.at(1)[2].count({7, 5}) == 1);
}

TEST_CASE("a lane cursor reads back from its text; a bad one is an error naming the field") {
  LaneCursor c;
  c.lane = 3;
  c.draws = 17;
  c.tokens = 5;
  c.sources = {{12, 40}, {0, 0}, {7, 2}};
  CHECK(c.str() == "lane=3 draws=17 tokens=5 units=12,0,7 items=40,0,2");
  CHECK(LaneCursor::parse(c.str()) == c);
  CHECK(LaneCursor::parse("  items=1 units=2 tokens=0 draws=0 lane=9 ") ==
        LaneCursor{9, 0, 0, {SourceCursor{2, 1}}});
  CHECK(LaneCursor::start(4, 2) == LaneCursor{4, 0, 0, {SourceCursor{}, SourceCursor{}}});
  const std::pair<const char*, const char*> bad[] = {
      {"lane=1 draws=0 tokens=0 units=0", "items is missing"},
      {"lane=1 draws=0 tokens=0 units=0 items=0 epoch=2", "unknown key \"epoch\""},
      {"lane=1 lane=2 draws=0 tokens=0 units=0 items=0", "lane given twice"},
      {"lane=x draws=0 tokens=0 units=0 items=0", "lane: \"x\" is not a non-negative integer"},
      {"lane=1 draws=-1 tokens=0 units=0 items=0", "draws: \"-1\" is not a non-negative integer"},
      {"lane=1 draws=0 tokens=0 units=0,1 items=0", "items: 1 values for 2 units"},
      {"lane=1 draws=0 tokens=0 units=0,,1 items=0,0,0", "units: \"\" is not a non-negative integer"},
      {"lane=99999999999 draws=0 tokens=0 units=0 items=0", "lane: 99999999999 is too large"},
      {"lane=1 draws=0 tokens=0 units=0 items", "\"items\" is not KEY=VALUE"},
  };
  for (const auto& pair : bad) {  // not a structured binding: clang 14 cannot capture one
    const char* text = pair.first;
    const char* why = pair.second;
    CAPTURE(text);
    const std::string e = error_of([&] { LaneCursor::parse(text); });
    CHECK(contains(e, std::string("lane cursor \"") + text + "\""));
    CHECK(contains(e, why));
  }
}

TEST_CASE("every lane's cursor as a checkpoint's JSON: read back by lane; errors name the field") {
  std::vector<LaneCursor> cursors;
  for (uint32_t l : {2u, 0u, 1u}) cursors.push_back({l, l * 10, l, {{l, l + 1}}});
  const std::string json = lane_cursors_to_json(cursors, 3);
  const auto back = lane_cursors_from_json(json_parse(json), 1);
  REQUIRE(back.size() == 3);
  for (uint32_t l = 0; l < 3; ++l) CHECK(back[l] == LaneCursor{l, l * 10, l, {{l, l + 1}}});
  auto error = [](const std::string& text, size_t sources = 1) {
    return error_of([&] { lane_cursors_from_json(json_parse(text), sources); });
  };
  CHECK(contains(error("[]"), "expected an object"));
  CHECK(contains(error(R"({"cursors": []})"), "lane cursors: lanes"));
  CHECK(contains(error(R"({"lanes": 0, "cursors": []})"), "expected a positive integer, found 0"));
  CHECK(contains(error(R"({"lanes": 2, "cursors": ["lane=0 draws=0 tokens=0 units=0 items=0"]})"),
                 "1 cursors for 2 lanes"));
  CHECK(contains(error(R"({"lanes": 1, "cursors": ["lane=3 draws=0 tokens=0 units=0 items=0"]})"),
                 "lane 3 of 1 lanes"));
  CHECK(contains(error(R"({"lanes": 1, "cursors": ["lane=3 draws=0 tokens=0 units=0 items=0"]})"),
                 "lane cursors: cursors[0] (byte offset "));
  CHECK(contains(error(R"({"lanes": 2, "cursors": ["lane=1 draws=0 tokens=0 units=0 items=0",
                                                   "lane=1 draws=0 tokens=0 units=0 items=0"]})"),
                 "cursors[1]"));
  CHECK(contains(error(R"({"lanes": 1, "cursors": ["lane=0 draws=0 tokens=0 units=0 items=0"]})", 2),
                 "1 sources, the data order has 2"));
  CHECK(contains(error(R"({"lanes": 1, "cursors": ["lane=0 draws=0"]})"), "cursors[0]"));
  CHECK(contains(error(R"({"lanes": 1, "cursors": [7]})"), "expected a string"));
}

TEST_CASE("the row hash is XXH3-64 of the row's bytes; a step's hash is the sum, in any order") {
  CHECK(row_hash({}) == 0x2D06800538D394C2ull);  // XXH3_64bits of no bytes (xxHash's test vector)
  std::mt19937 rng(1);
  std::vector<uint16_t> rows(5 * 9);
  for (auto& t : rows) t = static_cast<uint16_t>(rng() % 50257);
  std::vector<uint64_t> hashes;
  for (size_t r = 0; r < 5; ++r) hashes.push_back(row_hash(std::span<const uint16_t>(rows).subspan(r * 9, 9)));
  CHECK(std::set<uint64_t>(hashes.begin(), hashes.end()).size() == 5);
  uint64_t sum = 0;
  for (uint64_t h : hashes) sum += h;
  CHECK(rows_hash(rows, 9) == sum);
  // Rows swapped: the same step hash. A token changed: another.
  std::vector<uint16_t> swapped(rows.begin() + 9, rows.begin() + 18);
  swapped.insert(swapped.end(), rows.begin(), rows.begin() + 9);
  swapped.insert(swapped.end(), rows.begin() + 18, rows.end());
  CHECK(rows_hash(swapped, 9) == sum);
  swapped[3] ^= 1;
  CHECK(rows_hash(swapped, 9) != sum);
  CHECK(contains(error_of([&] { rows_hash(rows, 7); }), "not whole rows of 7"));
}

namespace {

// A synthetic document lane: unit n holds (n % 3) + 1 documents (and unit 4 none), document
// (n, k) is `len(n, k)` tokens, each token naming where it came from. Read from any cursor, the
// way DocumentLanes reads (the first document after a cursor inside one carries its tokens).
struct FakeDocs {
  static uint64_t docs_in(uint64_t n) { return n == 4 ? 0 : n % 3 + 1; }
  static size_t len(uint64_t n, uint64_t k) { return 1 + (n * 7 + k * 5) % 11; }
  static uint16_t token(uint64_t n, uint64_t k, size_t i) { return static_cast<uint16_t>(n * 1000 + k * 50 + i); }
  uint64_t n, k, draw, drop;
  explicit FakeDocs(const LaneCursor& c) : n(c.sources[0].unit), k(c.sources[0].item), draw(c.draws), drop(c.tokens) {}
  std::vector<uint16_t> next(LanePlace& place) {
    while (k >= docs_in(n)) {
      ++n;
      k = 0;
    }
    std::vector<uint16_t> doc;
    for (size_t i = 0; i < len(n, k); ++i) doc.push_back(token(n, k, i));
    place = {draw++, 0, n, k++, drop};
    drop = 0;
    return doc;
  }
};

// Rows of one lane from `start`, fed one document at a time as rows are wanted; the cursor after
// each row.
std::pair<std::vector<std::vector<uint16_t>>, std::vector<LaneCursor>> rows_from(const LaneCursor& start, uint32_t T,
                                                                                 size_t rows) {
  LaneRows lr(T, UnitContent::documents, {start});
  FakeDocs docs(start);
  std::vector<std::vector<uint16_t>> out;
  std::vector<LaneCursor> cursors;
  std::vector<uint16_t> row(T + 1);
  while (out.size() < rows) {
    while (lr.rows_ready(0) == 0) {
      LanePlace place;
      const auto doc = docs.next(place);
      lr.push(0, doc, place);
    }
    lr.take_row(0, row);
    out.push_back(row);
    cursors.push_back(lr.cursor(0));
  }
  return {out, cursors};
}

}  // namespace

TEST_CASE("lane rows: row j is tokens [jT, jT+T]; from the cursor after any row, a lane goes on exactly") {
  for (uint32_t T : {1u, 4u, 7u, 32u}) {
    CAPTURE(T);
    // The lane's tokens in order, straight from the synthetic documents.
    std::vector<uint16_t> stream;
    FakeDocs all(LaneCursor::start(0, 1));
    while (stream.size() < 60 * T + 1) {
      LanePlace p;
      const auto d = all.next(p);
      stream.insert(stream.end(), d.begin(), d.end());
    }
    const auto from_start = rows_from(LaneCursor::start(0, 1), T, 60);
    const auto& rows = from_start.first;
    const auto& cursors = from_start.second;
    for (size_t j = 0; j < rows.size(); ++j)
      CHECK(rows[j] == std::vector<uint16_t>(stream.begin() + j * T, stream.begin() + j * T + T + 1));
    // Resumed from every cursor: the rows that follow.
    bool inside = false;
    for (size_t j = 0; j + 10 < rows.size(); ++j) {
      CAPTURE(cursors[j].str());
      inside |= cursors[j].tokens > 0;
      const auto resumed = rows_from(cursors[j], T, 10).first;
      for (size_t i = 0; i < 10; ++i) CHECK(resumed[i] == rows[j + 1 + i]);
    }
    if (T > 1) CHECK(inside);  // some cursors were inside a document
  }
}

TEST_CASE("lane rows of tokens: the cursor is the unit and the offset of the next row's first token") {
  const uint32_t T = 5;
  LaneRows lr(T, UnitContent::tokens, {LaneCursor{7, 0, 0, {{2, 3}}}, LaneCursor::start(1, 1)});
  CHECK(lr.index_of(7) == 0);
  CHECK(lr.index_of(1) == 1);
  CHECK(contains(error_of([&] { lr.index_of(2); }), "lane 2 is not one of this rank's 2 lanes"));
  const std::vector<uint16_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8, 9, 10, 11};
  lr.push(0, a, {0, 0, 2, 3, 0});  // unit 2, tokens 3..6 (the start cursor's)
  CHECK(lr.rows_ready(0) == 0);
  lr.push(0, b, {0, 0, 5, 0, 0});  // the lane's next unit
  CHECK(lr.buffered(0) == 11);
  CHECK(lr.rows_ready(0) == 2);
  std::vector<uint16_t> row(T + 1);
  lr.take_row(0, row);
  CHECK(row == std::vector<uint16_t>{1, 2, 3, 4, 5, 6});
  CHECK(lr.cursor(0) == LaneCursor{7, 0, 0, {{5, 1}}});  // token 6 is unit 5's second
  lr.take_row(0, row);
  CHECK(row == std::vector<uint16_t>{6, 7, 8, 9, 10, 11});
  CHECK(lr.cursor(0) == LaneCursor{7, 0, 0, {{5, 6}}});
  CHECK(lr.rows_taken(0) == 2);
  CHECK(lr.buffered(0) == 1);
  CHECK(contains(error_of([&] { lr.take_row(0, row); }), "lane 7 holds 1 tokens, not the T+1 = 6 of a row"));
  // Out of order: a piece that skips tokens of its unit, or goes back.
  CHECK(contains(error_of([&] { lr.push(0, a, {0, 0, 5, 9, 0}); }), "pieces must arrive in the lane's order"));
  CHECK(contains(error_of([&] { lr.push(1, a, {0, 0, 0, 4, 0}); }), "pieces must arrive in the lane's order"));
  std::vector<uint16_t> wrong(T);
  CHECK(contains(error_of([&] { lr.take_row(0, wrong); }), "a row is T+1 = 6 tokens"));
}

TEST_CASE("lane rows of documents: a mix's cursor keeps every source's place; a resumed document drops its tokens") {
  const uint32_t T = 3;
  LaneCursor start{0, 4, 2, {{1, 5}, {3, 0}}};  // draw 4 is source 0's unit 1 item 5, 2 tokens delivered
  LaneRows lr(T, UnitContent::documents, {start});
  CHECK(lr.cursor(0) == start);
  CHECK(contains(error_of([&] { lr.push(0, std::vector<uint16_t>{1, 2, 3}, {4, 0, 1, 5, 0}); }),
                 "draw 4 token 2 was next"));
  lr.push(0, std::vector<uint16_t>{90, 91, 92, 93}, {4, 0, 1, 5, 2});  // keeps 92, 93
  lr.push(0, std::vector<uint16_t>{80, 81}, {5, 1, 3, 0, 0});
  lr.push(0, std::vector<uint16_t>{70, 71, 72}, {6, 0, 1, 6, 0});
  std::vector<uint16_t> row(T + 1);
  lr.take_row(0, row);
  CHECK(row == std::vector<uint16_t>{92, 93, 80, 81});
  // Next row starts at 81: source 1's document, token 1; source 0 is past its item 5.
  CHECK(lr.cursor(0) == LaneCursor{0, 5, 1, {{1, 6}, {3, 0}}});
  lr.take_row(0, row);
  CHECK(row == std::vector<uint16_t>{81, 70, 71, 72});
  CHECK(lr.cursor(0) == LaneCursor{0, 6, 2, {{1, 6}, {3, 1}}});
  CHECK(contains(error_of([&] { lr.push(0, std::vector<uint16_t>{1}, {7, 0, 1, 7, 3}); }), "draw 7 token 0 was next"));
  // A document shorter than the tokens the cursor says were delivered: not the cursor's document.
  LaneRows other(T, UnitContent::documents, {start});
  CHECK(contains(error_of([&] { other.push(0, std::vector<uint16_t>{1}, {4, 0, 1, 5, 2}); }),
                 "a document of 1 tokens resumed after its token 2"));
}

TEST_CASE("lane rows hold only what the rows have not passed, over many epochs of documents") {
  const uint32_t T = 16;
  LaneRows lr(T, UnitContent::documents, {LaneCursor::start(0, 1)});
  FakeDocs docs(LaneCursor::start(0, 1));
  std::vector<uint16_t> row(T + 1);
  for (int i = 0; i < 20000; ++i) {
    while (lr.rows_ready(0) == 0) {
      LanePlace place;
      const auto d = docs.next(place);
      lr.push(0, d, place);
    }
    lr.take_row(0, row);
  }
  CHECK(lr.buffered_high_water() <= T + 11);  // a row's worth and one document (at most 11 tokens)
  CHECK(lr.memory() < 64 * 1024);
}

TEST_CASE("the neediest lane: smallest supply, ended lanes never; pack and the reader on two threads") {
  LaneDemand d(3);
  CHECK(d.neediest() == 0);
  d.sent(0, 100);
  CHECK(d.neediest() == 1);
  d.sent(1, 50);
  d.sent(2, 70);
  CHECK(d.neediest() == 1);
  d.publish(1, 200, 50);  // pack received lane 1's 50 and holds 200 tokens of it
  CHECK(d.supply(1) == 200);
  CHECK(d.neediest() == 2);
  d.ended(2);
  CHECK(d.neediest() == 0);
  d.ended(0);
  d.ended(1);
  CHECK(d.neediest() == 3);

  // A reader feeding the neediest of 8 lanes, pack consuming every lane at the same rate: no lane
  // runs more than a few pieces ahead of the others.
  constexpr size_t kLanes = 8, kPiece = 10, kRow = 25, kRows = 4000;
  LaneDemand demand(kLanes);
  std::atomic<uint64_t> sent_total[kLanes] = {};
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) {
      const size_t i = demand.neediest();
      if (demand.supply(i) > 4 * kRow) {  // everyone has enough: wait for pack
        std::this_thread::yield();
        continue;
      }
      demand.sent(i, kPiece);
      sent_total[i].fetch_add(kPiece);
    }
  });
  uint64_t consumed[kLanes] = {}, received[kLanes] = {};
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t i = 0; i < kLanes; ++i) {
      for (;;) {  // pack "receives" what the reader sent, and needs a row from every lane
        received[i] = sent_total[i].load();
        if (received[i] >= consumed[i] + kRow) break;
        demand.publish(i, received[i] - consumed[i], received[i]);
        std::this_thread::yield();
      }
      consumed[i] += kRow;
      demand.publish(i, received[i] - consumed[i], received[i]);
    }
  }
  stop = true;
  reader.join();
  uint64_t most = 0, least = UINT64_MAX;
  for (size_t i = 0; i < kLanes; ++i) {
    most = std::max<uint64_t>(most, sent_total[i].load());
    least = std::min<uint64_t>(least, sent_total[i].load());
  }
  CHECK(least >= kRows * kRow);
  CHECK(most - least <= 6 * kRow);  // demand kept the lanes level
}
