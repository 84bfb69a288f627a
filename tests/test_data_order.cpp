// One data order whatever the world size (issue 38), on real data: catalogues of every source kind
// (datasets/units/catalog.h), lanes reading their units through the store (datasets/lanes/),
// rows and cursors out of them (lane_rows.h). For text shards of both formats, token shards of
// both, llm.c shards, a mix, and the bundled tiny-shakespeare, W = 1, 2, 3 and 4 ranks are
// simulated in-process (rank r serves lanes r, r+W, ...; B and grad_accum chosen so a step has the
// same rows): every step's set of rows, by hash and by content, is the same for every W, and a
// run resumed from its cursors (4 -> 2 -> 3, taken inside units and documents) goes on as the
// uninterrupted one. Memory stays bounded (no lane holds more than one unit; the row buffers stay
// small over many epochs), and every error names what is wrong.
//
// The Parquet cases (named "parquet: ...") need pyarrow to write their files: CTest runs them as
// test_data_order_parquet, which exits 77 (skipped) without it.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/json.h"
#include "datasets/dataset_error.h"
#include "datasets/io/store.h"
#include "datasets/lanes/data_order.h"
#include "datasets/lanes/document_lanes.h"
#include "datasets/lanes/lane_rows.h"
#include "datasets/lanes/row_hash.h"
#include "datasets/lanes/token_lanes.h"
#include "datasets/plan/data_plan.h"
#include "datasets/prepare/prepare.h"
#include "datasets/shards/shard_bytes.h"
#include "datasets/tokenizer/tokenizer.h"
#include "datasets/units/catalog.h"
#include "datasets/units/unit_reader.h"
#include "parquet_files.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;
using namespace pipeline::datasets;
using test_util::contains;
using test_util::error_of;

namespace {

const fs::path kBundled = fs::path(PIPELINE_SOURCE_DIR) / "datasets" / "data" / "tinyshakespeare";

// Blank-line documents of 1 to 120 words, each naming its number.
void write_corpus(const fs::path& file, size_t count, uint32_t seed) {
  static const char* words[] = {"the", "king", "shall", "never", "speak", "of", "love", "and", "war", "my",
                                "lord", "hath", "done", "thee", "wrong", "caf\xc3\xa9", "na\xc3\xafve", "x"};
  std::mt19937 rng(seed);
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    text += "doc " + std::to_string(i) + ":";
    for (size_t w = 0, n = 1 + rng() % 120; w < n; ++w) {
      text += ' ';
      text += words[rng() % std::size(words)];
      if (rng() % 15 == 0) text += '\n';
    }
    text += "\n\n";
  }
  test_util::write_file(file, text);
}

struct Dataset {
  fs::path dir;
  std::string source() const { return dir.string(); }
};

// What `pipeline prepare` makes of a generated corpus.
struct Make {
  bool tokens = false;
  bool llmc = false;
  uint64_t shard_size = uint64_t(128) << 20;
  uint64_t block_bytes = kDefaultBlockBytes;
  size_t docs = 150;
};

Dataset make_dataset(const fs::path& root, const std::string& name, const Make& m) {
  write_corpus(root / (name + ".txt"), m.docs, 11);
  PrepareOptions o;
  o.out_dir = root / name;
  o.tokens = m.tokens;
  o.llmc = m.llmc;
  o.llmc_prefix = "data";
  o.shard_size = m.shard_size;
  o.block_bytes = m.block_bytes;
  o.val_fraction = 0;
  prepare_dataset({root / (name + ".txt")}, o);
  return {o.out_dir};
}

// A store that counts the files it opens: how many units a run reads.
class CountingStore : public io::Store {
 public:
  bool remote() const override { return false; }
  std::vector<io::ObjectInfo> list(const std::string& p) override { return local_.list(p); }
  io::ObjectInfo stat(const std::string& uri) override { return local_.stat(uri); }
  std::unique_ptr<io::RangeFile> open(const io::ObjectInfo& info) override {
    opens.fetch_add(1);
    return local_.open(info);
  }
  std::atomic<uint64_t> opens{0};

 private:
  io::LocalStore local_;
};

DataOrder order_of(const std::vector<SourceSpec>& specs, const DataOrderOptions& o,
                   std::shared_ptr<CountingStore> store = nullptr) {
  return open_data_order(specs, o, store);
}

// One step's rows, every rank's: their hashes' sum and the rows themselves, sorted.
struct StepRows {
  uint64_t hash = 0;
  std::vector<std::vector<uint16_t>> rows;
  bool operator==(const StepRows&) const = default;
};

struct Figures {
  size_t unit_high_water = 0;  // the most one lane's open unit held
  size_t lanes_memory = 0;     // the most a rank's lanes held at once
  uint64_t row_buffer_high_water = 0;
};

// A rank's input side as the stages run it: its lanes read on demand (and, to show that timing
// does not matter, sometimes ahead), tokenized when they are text, into LaneRows.
class Rank {
 public:
  Rank(const DataOrder& order, uint32_t T, const std::vector<LaneCursor>& cursors, uint32_t seed)
      : rows_(T, order.content, cursors), rng_(seed) {
    if (order.content == UnitContent::documents)
      docs_.emplace(order, cursors);
    else
      tokens_.emplace(order, cursors);
  }

  // The next row of lane `lane`, which must be its row `row`.
  std::vector<uint16_t> take(uint32_t lane, uint64_t row) {
    const size_t i = rows_.index_of(lane);
    REQUIRE(rows_.rows_taken(i) == row);
    while (rows_.rows_ready(i) == 0) feed(i);
    if (rng_() % 4 == 0) feed(rng_() % rows_.size());  // read ahead, at random
    std::vector<uint16_t> out(rows_.seq_len() + 1);
    rows_.take_row(i, out);
    return out;
  }

  LaneCursor cursor(uint32_t lane) const { return rows_.cursor(rows_.index_of(lane)); }
  size_t lanes() const { return rows_.size(); }
  uint32_t lane(size_t i) const { return rows_.lane(i); }

  void figures(Figures& f) const {
    f.unit_high_water = std::max(f.unit_high_water, docs_ ? docs_->unit_memory_high_water() : tokens_->unit_memory_high_water());
    f.lanes_memory = std::max(f.lanes_memory, docs_ ? docs_->memory() : tokens_->memory());
    f.row_buffer_high_water = std::max(f.row_buffer_high_water, rows_.buffered_high_water());
  }

 private:
  void feed(size_t i) {
    LanePlace place;
    if (docs_) {
      std::string_view doc;
      REQUIRE(docs_->next(i, doc, place));
      ids_.assign(1, Tokenizer::eot_id);
      Tokenizer::gpt2().encode_ordinary_append(doc, ids_);
      std::vector<uint16_t> t(ids_.begin(), ids_.end());
      rows_.push(i, t, place);
    } else {
      std::vector<uint16_t> t(1 + rng_() % 300);  // pieces of any size
      const size_t n = tokens_->read(i, t, place);
      REQUIRE(n > 0);
      rows_.push(i, std::span<const uint16_t>(t).first(n), place);
    }
  }

  LaneRows rows_;
  std::optional<DocumentLanes> docs_;
  std::optional<TokenLanes> tokens_;
  std::vector<uint32_t> ids_;
  std::mt19937 rng_;
};

struct Shape {
  uint32_t world, batch, accum;  // batch x accum x world rows a step
};

// `steps` steps on `world` ranks from every lane's cursor (by lane); appends each step's rows to
// `out` and returns every lane's cursor after them.
std::vector<LaneCursor> run(const DataOrder& order, uint32_t T, Shape shape, uint64_t steps,
                            const std::vector<LaneCursor>& from, std::vector<StepRows>& out, Figures* figures = nullptr) {
  const uint64_t n = uint64_t(shape.batch) * shape.accum * shape.world;
  RowLayout layout(order.lanes, shape.world, n);
  std::vector<std::unique_ptr<Rank>> ranks;
  for (uint32_t r = 0; r < shape.world; ++r) {
    std::vector<LaneCursor> mine;
    for (uint32_t l : lanes_of(r, shape.world, order.lanes)) mine.push_back(from.at(l));
    ranks.push_back(std::make_unique<Rank>(order, T, mine, 1000 + r));
  }
  for (uint64_t s = 0; s < steps; ++s) {
    StepRows step;
    for (uint32_t r = 0; r < shape.world; ++r)
      for (uint32_t m = 0; m < shape.accum; ++m)  // micro-batches of B rows
        for (uint64_t q = m * shape.batch; q < (m + 1) * uint64_t(shape.batch); ++q) {
          const auto [lane, row] = layout.rank_row(r, s, q);
          auto taken = ranks[r]->take(lane, row);
          step.hash += row_hash(taken);
          step.rows.push_back(std::move(taken));
        }
    std::sort(step.rows.begin(), step.rows.end());
    out.push_back(std::move(step));
  }
  std::vector<LaneCursor> cursors(order.lanes);
  for (const auto& rank : ranks) {
    for (size_t i = 0; i < rank->lanes(); ++i) cursors[rank->lane(i)] = rank->cursor(rank->lane(i));
    if (figures) rank->figures(*figures);
  }
  return cursors;
}

// Through a checkpoint's JSON and back, as a resumed run gets them.
std::vector<LaneCursor> through_json(const std::vector<LaneCursor>& cursors, const DataOrder& order) {
  return lane_cursors_from_json(json_parse(lane_cursors_to_json(cursors, order.lanes)), order.sources.size());
}

// The four world sizes of the issue at 12 rows a step over 12 lanes.
constexpr uint32_t kLanes = 12;
const Shape kShapes[] = {{1, 6, 2}, {2, 3, 2}, {3, 2, 2}, {4, 3, 1}};

// The whole check for one order: W = 1..4 give the same steps; 4 -> 2 -> 3 resumed gives the
// uninterrupted steps; cursors were taken inside units (and, for text, inside documents).
void check_invariance(const DataOrder& order, uint32_t T, uint64_t steps) {
  REQUIRE(order.lanes == kLanes);
  std::vector<std::vector<StepRows>> by_world;
  for (const Shape& shape : kShapes) {
    CAPTURE(shape.world);
    std::vector<StepRows> steps_of;
    run(order, T, shape, steps, start_cursors(order, lanes_of(0, 1, kLanes)), steps_of);
    REQUIRE(steps_of.size() == steps);
    by_world.push_back(std::move(steps_of));
  }
  for (size_t w = 1; w < by_world.size(); ++w)
    for (uint64_t s = 0; s < steps; ++s) {
      CAPTURE(w);
      CAPTURE(s);
      CHECK(by_world[w][s].hash == by_world[0][s].hash);
      CHECK(by_world[w][s].rows == by_world[0][s].rows);
    }
  // Every step differs from the next (the rows move on).
  for (uint64_t s = 1; s < steps; ++s) CHECK(by_world[0][s].hash != by_world[0][s - 1].hash);

  // Resumed: 4 ranks, then 2, then 3, each from the cursors the run before left.
  const uint64_t a = steps / 3, b = steps / 3, c = steps - a - b;
  std::vector<StepRows> resumed;
  auto cursors = run(order, T, kShapes[3], a, start_cursors(order, lanes_of(0, 1, kLanes)), resumed);
  bool mid_unit = false, mid_document = false;
  for (const auto& cur : cursors) {
    for (const auto& src : cur.sources) mid_unit |= src.item > 0;
    mid_document |= cur.tokens > 0;
  }
  CHECK(mid_unit);
  if (order.content == UnitContent::documents) CHECK(mid_document);
  cursors = run(order, T, kShapes[1], b, through_json(cursors, order), resumed);
  run(order, T, kShapes[2], c, through_json(cursors, order), resumed);
  REQUIRE(resumed.size() == steps);
  for (uint64_t s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(resumed[s] == by_world[0][s]);
  }
}

}  // namespace

TEST_CASE("block shards of text: the same rows every step for W = 1, 2, 3, 4, and across a resume 4 -> 2 -> 3") {
  test_util::TempDir tmp("data_order");
  const Dataset ds = make_dataset(tmp.path, "text2", {.shard_size = 16 << 10, .block_bytes = 1024});
  const DataOrder order = order_of({{ds.source()}}, {.lanes = kLanes, .seed = 1337});
  CHECK(order.sources[0].catalog->format == SourceFormat::shards_v2);
  CHECK(order.sources[0].catalog->files.size() >= 3);
  CHECK(order.sources[0].catalog->units.size() >= 3 * kLanes);
  check_invariance(order, 16, 90);  // about two epochs
}

TEST_CASE("shards of format 1 (text): whole shards when there are enough, document ranges when fewer than lanes") {
  test_util::TempDir tmp("data_order");
  SUBCASE("ranges of documents") {
    const Dataset ds = make_dataset(tmp.path, "text1", {.shard_size = 40 << 10, .block_bytes = 0});
    const DataOrder order = order_of({{ds.source()}}, {.lanes = kLanes, .seed = 5});
    const Catalog& c = *order.sources[0].catalog;
    CHECK(c.format == SourceFormat::shards_v1);
    CHECK(c.files.size() < kLanes);
    CHECK(c.units.size() >= kLanes);
    uint64_t docs = 0;
    for (const Unit& u : c.units) docs += u.documents;
    CHECK(docs == 150);
    CHECK(contains(c.slow_reading_note(), "`pipeline prepare` again makes block shards"));
    check_invariance(order, 16, 60);
  }
  SUBCASE("whole shards") {
    const Dataset ds = make_dataset(tmp.path, "text1w", {.shard_size = 2 << 10, .block_bytes = 0});
    const DataOrder order = order_of({{ds.source()}}, {.lanes = kLanes, .seed = 5});
    const Catalog& c = *order.sources[0].catalog;
    CHECK(c.units.size() == c.files.size());
    CHECK(c.units.size() >= kLanes);
    CHECK(c.slow_reading_note().empty());
    check_invariance(order, 16, 60);
  }
}

TEST_CASE("token shards (both formats) and llm.c shards: the same rows for every W, and across a resume") {
  test_util::TempDir tmp("data_order");
  SUBCASE("block shards of tokens") {
    const Dataset ds = make_dataset(tmp.path, "tok2", {.tokens = true, .shard_size = 8 << 10, .block_bytes = 600});
    const DataOrder order = order_of({{ds.source()}}, {.lanes = kLanes, .seed = 9});
    CHECK(order.content == UnitContent::tokens);
    CHECK(order.sources[0].catalog->units.size() >= 2 * kLanes);
    check_invariance(order, 16, 90);
  }
  SUBCASE("token shards of format 1, cut into document ranges") {
    const Dataset ds = make_dataset(tmp.path, "tok1", {.tokens = true, .shard_size = 40 << 10, .block_bytes = 0});
    const DataOrder order = order_of({{ds.source()}}, {.lanes = kLanes, .seed = 9});
    CHECK(order.sources[0].catalog->files.size() < kLanes);
    check_invariance(order, 16, 60);
  }
  SUBCASE("llm.c shards, in ranges of 300 tokens") {
    const Dataset ds = make_dataset(tmp.path, "llmc", {.llmc = true, .shard_size = 20 << 10});
    const DataOrder order = order_of({{ds.source()}}, {.lanes = kLanes, .seed = 9, .llmc_unit_tokens = 300});
    const Catalog& c = *order.sources[0].catalog;
    CHECK(c.format == SourceFormat::llmc);
    CHECK(c.files.size() >= 2);
    for (const Unit& u : c.units) CHECK(u.items <= 300);
    check_invariance(order, 16, 90);
  }
}

TEST_CASE("a weighted mix of block shards and shards of format 1: the same rows for every W, and across a resume") {
  test_util::TempDir tmp("data_order");
  const Dataset a = make_dataset(tmp.path, "a", {.shard_size = 16 << 10, .block_bytes = 1024});
  const Dataset b = make_dataset(tmp.path, "b", {.shard_size = 40 << 10, .block_bytes = 0, .docs = 100});
  const DataOrder order = order_of({{a.source(), 2.0}, {b.source(), 1.0}}, {.lanes = kLanes, .seed = 77});
  CHECK(order.sources.size() == 2);
  // Both sources are drawn from, about 2:1.
  std::map<size_t, int> picks;
  for (uint64_t j = 0; j < 3000; ++j) ++picks[order.pick(3, j)];
  CHECK(picks[0] > 1800);
  CHECK(picks[1] > 800);
  check_invariance(order, 16, 60);
}

TEST_CASE("the bundled tiny-shakespeare (block shards): the same rows for every W, text and tokens") {
  for (const char* kind : {"text", "tokens"}) {
    CAPTURE(kind);
    const DataOrder order = order_of({{(kBundled / kind).string()}}, {.lanes = kLanes, .seed = 1337});
    CHECK(order.sources[0].catalog->format == SourceFormat::shards_v2);
    CHECK(order.sources[0].catalog->units.size() >= 36);
    check_invariance(order, 64, 6);
  }
}

TEST_CASE("bounded memory: a lane holds one unit at most, and the row buffers stay small over many epochs") {
  test_util::TempDir tmp("data_order");
  const Dataset ds = make_dataset(tmp.path, "mem", {.shard_size = 16 << 10, .block_bytes = 1024, .docs = 60});
  const DataOrder order = order_of({{ds.source()}}, {.lanes = 4, .seed = 2});
  const Catalog& c = *order.sources[0].catalog;
  uint64_t largest = 0;  // the largest unit's payload
  for (const Unit& u : c.units) largest = std::max(largest, shard_bytes::payload_bytes(true, u.documents, u.text_bytes));
  const uint64_t epoch_tokens = 60 * 200;  // well over what an epoch holds
  std::vector<StepRows> steps;
  Figures f;
  const uint32_t T = 32;
  const uint64_t step_count = 20 * epoch_tokens / (4 * T);  // twenty epochs and more
  const auto cursors = run(order, T, {2, 2, 1}, step_count, start_cursors(order, lanes_of(0, 1, 4)), steps, &f);
  CHECK(cursors[0].sources[0].unit > 10 * order.sources[0].plan.lane_units_per_epoch(0));  // many epochs
  MESSAGE("largest unit " << largest << " B; a lane's unit at most " << f.unit_high_water << " B; a rank's lanes "
                          << f.lanes_memory << " B; row buffer high water " << f.row_buffer_high_water << " tokens");
  CHECK(f.unit_high_water <= largest);
  CHECK(f.lanes_memory <= 2 * largest + 400 * 1024);  // two lanes a rank, and the opener's zstd context
  // A row's worth, one document's tokens and the reads ahead of one document each.
  CHECK(f.row_buffer_high_water <= T + 3 * 400);
}

TEST_CASE("a resumed lane reads its cursor's unit again, and no unit before it") {
  test_util::TempDir tmp("data_order");
  const Dataset ds = make_dataset(tmp.path, "resume", {.shard_size = 16 << 10, .block_bytes = 1024});
  auto store = std::make_shared<CountingStore>();
  const DataOrder order = order_of({{ds.source()}}, {.lanes = kLanes, .seed = 3}, store);
  std::vector<StepRows> steps;
  const auto cursors = run(order, 16, kShapes[3], 25, start_cursors(order, lanes_of(0, 1, kLanes)), steps);
  // A run of one step from the cursors: each lane opens its cursor's unit, and the next one only
  // when the rest of that holds less than a row.
  const uint64_t before = store->opens.load();
  run(order, 16, kShapes[0], 1, cursors, steps);
  CHECK(store->opens.load() - before <= 2 * kLanes);
  // The lanes opened first what the cursors name (the first piece of each lane must continue its
  // cursor: LaneRows refuses any other).
}

TEST_CASE("errors: too few units for the lanes, a world that does not divide them, a changed file, a bad cursor") {
  test_util::TempDir tmp("data_order");
  const Dataset ds = make_dataset(tmp.path, "err", {.shard_size = 64 << 10, .block_bytes = 4096, .docs = 60});
  const Catalog c = [&] {
    io::LocalStore store;
    return build_catalog(store, ds.source());
  }();
  const uint64_t m = c.units.size();
  REQUIRE(m >= 4);

  std::string e = error_of([&] { open_data_order({{ds.source()}}, {.lanes = static_cast<uint32_t>(m + 1)}); });
  INFO(e);
  CHECK(contains(e, ds.source() + " (block shards): " + std::to_string(m) + " units for " + std::to_string(m + 1) + " lanes"));
  CHECK(contains(e, "[data] lanes to at most " + std::to_string(m)));

  const DataOrder order = open_data_order({{ds.source()}}, {.lanes = 4, .seed = 1});
  CHECK(contains(error_of([&] { lanes_of(0, 3, order.lanes); }), "a world of 3 ranks does not divide the run's 4 lanes"));
  CHECK(contains(error_of([&] { TokenLanes(order, start_cursors(order, {0})); }), "token lanes read one source of tokens"));
  CHECK(contains(error_of([&] { DocumentLanes(order, {LaneCursor::start(0, 2)}); }), "2 sources, the data order has 1"));
  CHECK(contains(error_of([&] { DocumentLanes(order, {LaneCursor::start(4, 1)}); }), "lane 4 of 4 lanes"));
  CHECK(contains(error_of([&] { DocumentLanes(order, {LaneCursor::start(1, 1), LaneCursor::start(1, 1)}); }),
                 "lane 1 given twice among 4 lanes"));

  SUBCASE("a cursor past the end of its unit") {
    LaneCursor bad = LaneCursor::start(1, 1);
    bad.sources[0].item = 100000;
    e = error_of([&] { DocumentLanes(order, {bad}); });
    CHECK(contains(e, "lane 1's cursor is at item 100000 of its unit 0"));
    CHECK(contains(e, "the cursor is not this data's"));
  }
  SUBCASE("a file that changes under the run") {
    DocumentLanes lanes(order, start_cursors(order, {0, 1, 2, 3}));
    std::string_view doc;
    LanePlace place;
    REQUIRE(lanes.next(0, doc, place));
    const fs::path shard = c.files.back().name;
    struct stat st{};
    REQUIRE(::stat(shard.c_str(), &st) == 0);
    test_util::write_file(shard, test_util::read_file(shard));  // the same bytes, written again
    e = error_of([&] {
      for (size_t i = 0; i < 4; ++i)
        for (int k = 0; k < 200; ++k) lanes.next(i, doc, place);
    });
    CHECK(contains(e, shard.string() + ": the file changed after the run listed it"));
    io::LocalStore store;
    CHECK(contains(error_of([&] { check_unchanged(store, c); }), shard.string() + ": the file changed since"));
  }
}

TEST_CASE("catalogues: each source kind's units, and the errors of a source that is not what it says") {
  test_util::TempDir tmp("data_order");
  io::LocalStore store;
  const Dataset text = make_dataset(tmp.path, "cat", {.shard_size = 32 << 10, .block_bytes = 2048});
  const Catalog c = build_catalog(store, text.source());
  CHECK(c.content == UnitContent::documents);
  uint64_t docs = 0;
  uint64_t offset = 0, file = 0;
  for (const Unit& u : c.units) {  // canonical order: files by path, units by offset
    if (u.file != file) offset = 0;
    CHECK(u.offset > offset);
    offset = u.offset;
    file = u.file;
    docs += u.documents;
  }
  CHECK(docs == 150);
  CHECK(c.items() == docs);
  for (size_t f = 1; f < c.files.size(); ++f) CHECK(c.files[f - 1].name < c.files[f].name);
  CHECK(contains(c.describe(c.units[1]), "train_00000.text.zst block 1 (bytes "));
  // The manifest alone names it too.
  CHECK(build_catalog(store, (text.dir / "manifest.json").string()).units.size() == c.units.size());
  // Every unit decodes to what the catalogue says.
  UnitOpener opener(store, std::make_shared<const Catalog>(c));
  uint64_t read = 0;
  for (uint64_t u = 0; u < c.units.size(); ++u) {
    auto unit = opener.documents(u);
    std::string_view d;
    uint64_t item = 0, n = 0;
    while (unit->next(d, item)) CHECK(item == n++);
    CHECK(n == c.units[u].documents);
    read += n;
  }
  CHECK(read == docs);
  CHECK(contains(error_of([&] { opener.tokens(0); }), "holds documents (block shards), not tokens"));

  SUBCASE("no split") {
    CHECK(contains(error_of([&] { build_catalog(store, text.source(), {.split = "test"}); }), "no split \"test\""));
  }
  SUBCASE("a shard of another size than the manifest's") {
    const fs::path shard = text.dir / "train_00000.text.zst";
    fs::resize_file(shard, fs::file_size(shard) - 3);
    CHECK(contains(error_of([&] { build_catalog(store, text.source()); }), "train_00000.text.zst: size mismatch"));
  }
  SUBCASE("a manifest whose block count is not the shard's") {
    std::string m = test_util::read_file(text.dir / "manifest.json");
    const size_t at = m.find("\"blocks\": ") + 10;
    m.insert(at, "1");
    test_util::write_file(text.dir / "manifest.json", m);
    CHECK(contains(error_of([&] { build_catalog(store, text.source()); }), "blocks, "));
  }
  SUBCASE("a sha256 that does not match, with verification on") {
    std::string m = test_util::read_file(text.dir / "manifest.json");
    const size_t at = m.find("\"sha256\": \"") + 11;
    m[at] = m[at] == '0' ? '1' : '0';
    test_util::write_file(text.dir / "manifest.json", m);
    CHECK(contains(error_of([&] { build_catalog(store, text.source(), {.verify = VerifyMode::on_open}); }),
                   "sha256 mismatch"));
    CHECK(build_catalog(store, text.source()).units.size() == c.units.size());  // off: sizes only
  }
  SUBCASE("a corrupt block is an error naming the file, the block and its bytes") {
    const Unit& u = c.units[2];
    std::string bytes = test_util::read_file(c.files[u.file].name);
    bytes[u.offset + u.bytes / 2] ^= 0x5a;
    test_util::write_file(c.files[u.file].name, bytes);
    const Catalog again = build_catalog(store, text.source());
    UnitOpener fresh(store, std::make_shared<const Catalog>(again));
    const std::string e = error_of([&] { fresh.documents(2); });
    INFO(e);
    CHECK(contains(e, c.files[u.file].name + ": block " + std::to_string(u.place) + " (bytes " +
                          std::to_string(u.offset) + ".." + std::to_string(u.offset + u.bytes) + ")"));
  }
  SUBCASE("llm.c: a header that disagrees with the file's size") {
    const Dataset l = make_dataset(tmp.path, "catl", {.llmc = true});
    const Catalog lc = build_catalog(store, l.source(), {.llmc_unit_tokens = 1000});
    CHECK(lc.format == SourceFormat::llmc);
    CHECK(lc.items() > 1000);
    CHECK(lc.units.size() == (lc.items() + 999) / 1000);
    CHECK(contains(error_of([&] { build_catalog(store, l.source(), {.split = "val"}); }),
                   "no llm.c shards of split \"val\" (found: train)"));
    const fs::path f = lc.files[0].name;
    std::ofstream(f, std::ios::binary | std::ios::app) << "xx";
    CHECK(contains(error_of([&] { build_catalog(store, l.source()); }), "trailing bytes"));
  }
  SUBCASE("a directory that is no dataset") {
    fs::create_directories(tmp / "plain");
    test_util::write_file(tmp / "plain" / "notes.txt", "hello");
    const std::string e = error_of([&] { build_catalog(store, (tmp / "plain").string()); });
    INFO(e);
    CHECK(contains(e, "not a dataset"));
    CHECK(contains(error_of([&] { build_catalog(store, (tmp / "nowhere").string()); }), "no such file or directory"));
  }
}

// ---- Parquet (test_data_order_parquet) -----------------------------------------------------------

namespace {

const fs::path& pq_dir() { return parquet_files::dir("test_data_order"); }

std::string parquet_doc(int i) { return parquet_files::doc(i); }

}  // namespace

TEST_CASE("parquet: row groups are the units; the same rows for every W, and across a resume") {
  const std::string lanes = (pq_dir() / "lanes").string();
  const DataOrder order = order_of({{lanes}}, {.lanes = kLanes, .seed = 21});
  const Catalog& c = *order.sources[0].catalog;
  CHECK(c.format == SourceFormat::parquet);
  REQUIRE(c.files.size() == 2);
  CHECK(c.units.size() == 16 + 6);  // the empty row group is no unit
  CHECK(c.items() == 640);
  check_invariance(order, 16, 90);
}

TEST_CASE("parquet: a unit reads its row group's documents, nulls passed over, and skips to a row") {
  io::LocalStore store;
  const auto c = std::make_shared<const Catalog>(build_catalog(store, (pq_dir() / "lanes").string()));
  UnitOpener opener(store, c);
  int next = 0;  // documents 0..639 in catalogue order, every 11th of the first 400 null
  for (uint64_t u = 0; u < c->units.size(); ++u) {
    auto unit = opener.documents(u);
    std::string_view d;
    uint64_t item = 0;
    while (unit->next(d, item)) {
      while (next < 400 && next % 11 == 5) ++next;
      CHECK(item == static_cast<uint64_t>(next < 400 ? next % 25 : (next - 400) % 40));  // its row
      CHECK(d == parquet_doc(next));
      ++next;
    }
    CHECK(unit->memory() < 64 * 1024);  // a batch of rows, not the row group
  }
  CHECK(next == 640);
  // Skipped to row 6 of row group 3 of a.parquet: the next document is row 6's (document 81);
  // then row 7 is null (document 82), and row 8 comes.
  auto unit = opener.documents(3);
  unit->skip(6);
  std::string_view d;
  uint64_t item = 0;
  REQUIRE(unit->next(d, item));
  CHECK(item == 6);
  CHECK(d == parquet_doc(81));
  REQUIRE(unit->next(d, item));
  CHECK(item == 8);
  CHECK(d == parquet_doc(83));
  CHECK(contains(error_of([&] { opener.documents(4)->skip(26); }), "a.parquet row group 4: cannot pass over 26 rows"));
}

TEST_CASE("parquet: a unit's byte range is its column chunk's, as pyarrow reports it; errors name the file") {
  io::LocalStore store;
  const Catalog c = build_catalog(store, (pq_dir() / "checksums.parquet").string());
  REQUIRE(c.units.size() == 3);
  std::ifstream where(pq_dir() / "checksums.parquet.rg1");
  uint64_t offset = 0, bytes = 0;
  where >> offset >> bytes;
  CHECK(c.units[1].offset == offset);
  CHECK(c.units[1].bytes == bytes);
  CHECK(c.describe(c.units[1]) == (pq_dir() / "checksums.parquet").string() + " row group 1");
  const std::string content = (pq_dir() / "content.parquet").string();
  CHECK(contains(error_of([&] { build_catalog(store, content); }), content + ": no column \"text\""));
  CHECK(build_catalog(store, content, {.column = "content"}).items() == 10);
  // A glob, and a hub snapshot's data/.
  CHECK(build_catalog(store, (pq_dir() / "lanes" / "*.parquet").string()).files.size() == 2);
  CHECK(build_catalog(store, (pq_dir() / "hub").string()).items() == 100);
}

TEST_CASE("parquet: mixed with block shards by weight, the same rows for every W, and across a resume") {
  test_util::TempDir tmp("data_order");
  const Dataset text = make_dataset(tmp.path, "text", {.shard_size = 16 << 10, .block_bytes = 1024});
  const DataOrder order = order_of({{text.source(), 1.0}, {(pq_dir() / "lanes").string(), 1.0}},
                                   {.lanes = kLanes, .seed = 8});
  check_invariance(order, 16, 60);
}
