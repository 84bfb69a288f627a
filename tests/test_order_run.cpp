// The run layer of the data order (issue 38) in one process (label torch): the tiny model on the
// bundled tiny-shakespeare, fp32, one intra-op thread.
//   - The lanes graph (read_tokens -> pack -> h2d -> train) trains on exactly the rows the data
//     layer cuts from the lanes (datasets/lanes/: TokenLanes, LaneRows, RowLayout), bit for bit, and
//     each step's "windows" is the sum of those rows' hashes.
//   - The documents order's "windows" hash its overlapping rows (the window's B rows).
//   - A checkpoint from before lanes (no "order" in its metadata, none in config.toml) resumes in
//     the documents order and goes on exactly; asking it for another order is refused.
//   - Lane cursors in checkpoints: every rank's lanes gathered, handed to the ranks of a resume on
//     any number that divides K; every refusal (K and the ranks, K and the step's rows, a missing
//     or doubled lane, a step of other rows, another order) names the numbers.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <span>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "base/json.h"
#include "datasets/lanes/data_order.h"
#include "datasets/lanes/lane_rows.h"
#include "datasets/lanes/row_hash.h"
#include "datasets/lanes/token_lanes.h"
#include "datasets/plan/data_plan.h"
#include "datasets/sources/dataset_reader.h"
#include "model/checkpoint/checkpoint.h"
#include "runner/data_parallel.h"
#include "runner/lane_setup.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

using namespace train_harness;
using test_util::contains;
using test_util::error_of;

namespace {

struct Threads {
  Threads() { at::set_num_threads(1); }  // bitwise reproducibility and a fair share of 2 cores
} threads_once;

std::string hex(uint64_t h) { return stages::windows_hex(h); }

// (B, T+1) int64 rows -> x = rows[:, :T], y = rows[:, 1:].
std::pair<torch::Tensor, torch::Tensor> inputs_of(const torch::Tensor& rows) {
  const int64_t T = rows.size(1) - 1;
  return {rows.narrow(1, 0, T).contiguous(), rows.narrow(1, 1, T).contiguous()};
}

}  // namespace

TEST_CASE("the lanes graph trains on exactly the rows the data layer cuts from the lanes, bit for bit") {
  // tiny_config: B = 2, T = 32, grad_accum 1, one process: 2 rows a step, K = 2 lanes (auto).
  auto root = temp_dir("lane_rows");
  auto graph = run(tiny_config(root / "g", kTokenInput, kData + "tokens"), root / "g");
  REQUIRE(graph.losses.size() == 8);
  const auto windows = read_windows(root / "g");

  // The same rows, from the data layer alone: the lanes of the run's seed (7), unit by unit.
  const uint32_t K = 2, T = 32;
  auto order = datasets::open_data_order({{kData + "tokens"}}, {.lanes = K, .seed = 7, .split = "train"});
  const auto starts = datasets::start_cursors(order, datasets::lanes_of(0, 1, K));
  datasets::TokenLanes lanes(order, starts);
  datasets::LaneRows cut(T, order.content, starts);
  const datasets::RowLayout layout(K, 1, 2);
  std::vector<uint16_t> piece(100), row(T + 1);
  const auto reference = hand_trained_losses([&](int64_t s) {
    auto rows = torch::empty({2, T + 1}, torch::kInt64);  // (B, T+1)
    uint64_t hash = 0;
    for (uint64_t q = 0; q < 2; ++q) {
      const auto [lane, n] = layout.rank_row(0, static_cast<uint64_t>(s), q);
      const size_t i = cut.index_of(lane);
      REQUIRE(cut.rows_taken(i) == n);
      while (cut.rows_ready(i) == 0) {
        datasets::LanePlace place;
        const size_t got = lanes.read(i, piece, place);
        REQUIRE(got > 0);
        cut.push(i, std::span<const uint16_t>(piece).first(got), place);
      }
      cut.take_row(i, row);
      hash += datasets::row_hash(row);
      for (uint32_t t = 0; t <= T; ++t) rows[static_cast<int64_t>(q)][t] = static_cast<int64_t>(row[t]);
    }
    CHECK(windows.at(s + 1) == hex(hash));
    return inputs_of(rows);
  });
  for (int64_t s = 0; s < 8; ++s) {
    CAPTURE(s);
    CHECK(graph.losses[s + 1] == reference[static_cast<size_t>(s)]);
  }
  fs::remove_all(root);
}

TEST_CASE("the documents order's windows hash the B overlapping rows of each step's window") {
  auto root = temp_dir("doc_windows");
  auto r = run(tiny_config(root / "d", kTokenInput, kData + "tokens"), root / "d", {"data.order=\"documents\""});
  REQUIRE(r.losses.size() == 8);
  const auto windows = read_windows(root / "d");
  datasets::TokenDatasetReader reader;
  reader.open(kData + "tokens", "train");
  std::vector<uint16_t> stream(8 * 64 + 1);
  REQUIRE(reader.read(stream) == stream.size());
  for (size_t s = 0; s < 8; ++s) {
    uint64_t hash = 0;
    for (size_t b = 0; b < 2; ++b) hash += datasets::row_hash(std::span<const uint16_t>(stream).subspan(s * 64 + b * 32, 33));
    CHECK(windows.at(static_cast<int64_t>(s) + 1) == hex(hash));
  }
  fs::remove_all(root);
}

TEST_CASE("a checkpoint from before lanes resumes in the documents order and goes on exactly") {
  auto root = temp_dir("old_ckpt");
  const std::vector<std::string> documents = {"data.order=\"documents\""};
  auto full = run(tiny_config(root / "full", kTextInput), root / "full", documents);
  auto part = run(tiny_config(root / "part", kTextInput), root / "part", documents);
  REQUIRE(full.losses.size() == 8);
  // Make the part run's step-4 checkpoint and config.toml what runs before lanes wrote: no
  // "order", no "data_step" in the metadata, no order or lanes among the [data] keys.
  fs::remove(root / "part" / "checkpoints" / "step_00000008.ckpt");
  fs::remove(root / "part" / "metrics.jsonl");
  const auto ckpt = root / "part" / "checkpoints" / "step_00000004.ckpt";
  auto state = model::read_checkpoint(ckpt.string());
  for (const std::string cut : {",\"data_step\":4", ",\"order\":\"documents\""}) {
    const auto at = state.metadata.find(cut);
    REQUIRE(at != std::string::npos);
    state.metadata.erase(at, cut.size());
  }
  model::write_checkpoint(ckpt.string(), state);
  std::string config = test_util::read_file(root / "part" / "config.toml"), old;
  std::istringstream lines(config);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("order = ", 0) != 0 && line.rfind("lanes = ", 0) != 0) old += line + "\n";
  REQUIRE(old.size() < config.size());
  test_util::write_file(root / "part" / "config.toml", old);

  // Another order is refused, naming the checkpoint's.
  auto e = error_of([&] { run("", root / "part", {"data.order=\"lanes\""}, root / "part"); });
  CHECK(contains(e, "step_00000004.ckpt was written in the documents order, and --set data.order asks for \"lanes\""));
  // Without a word, it goes on in the documents order, exactly.
  auto resumed = run("", root / "part", {}, root / "part");
  REQUIRE(resumed.losses.size() == 4);
  for (int64_t s = 5; s <= 8; ++s) CHECK(resumed.losses[s] == full.losses[s]);
  CHECK(read_windows(root / "part") == [&] {
    auto w = read_windows(root / "full");
    for (int64_t s = 1; s <= 4; ++s) w.erase(s);
    return w;
  }());
  const auto meta = json_parse(model::read_checkpoint(stages::latest_checkpoint(root / "part").string()).metadata);
  CHECK(meta.find("order")->text == "documents");
  CHECK(meta.number("data_step") == 8);
  fs::remove_all(root);
}

namespace {

// A checkpoint's metadata as `world` ranks of the lanes order write it: K lanes, each rank's own
// (but lane `leave_out`'s).
std::string lanes_metadata(uint32_t K, uint32_t world, uint64_t rows, int64_t grad_accum, uint32_t leave_out = UINT32_MAX) {
  auto cursor_of = [&](uint32_t rank) {
    stages::DataCursor c;
    c.lane_order = true;
    for (uint32_t l : datasets::lanes_of(rank, world, K)) {
      if (l == leave_out) continue;
      auto lc = datasets::LaneCursor::start(l, 1);
      lc.sources[0] = {l + 1, 10 * l};  // something to recognise it by
      c.lanes.push_back(lc);
    }
    return c.to_json();
  };
  std::string meta = "{\"step\":3,\"data_step\":3,\"order\":\"lanes\",\"lanes\":" + std::to_string(K) +
                     ",\"rows\":" + std::to_string(rows) + ",\"cursor\":" + cursor_of(0) +
                     ",\"grad_accum\":" + std::to_string(grad_accum);
  if (world > 1) {
    meta += ",\"world_size\":" + std::to_string(world) + ",\"cursors\":[";
    for (uint32_t r = 0; r < world; ++r) meta += (r ? "," : "") + cursor_of(r);
    meta += "]";
  }
  return meta + "}";
}

}  // namespace

TEST_CASE("lane cursors in a checkpoint: every rank's lanes, handed to any number of ranks that divides K") {
  // 2 ranks x 3 lanes of K = 6, a step of 12 rows.
  const std::string two = lanes_metadata(6, 2, 12, 3);
  for (int world : {1, 2, 3, 6}) {
    for (int rank = 0; rank < world; ++rank) {
      const auto start = stages::checkpoint_cursor(two, rank, world, "ck");
      REQUIRE(start.lane_order);
      const auto want = datasets::lanes_of(static_cast<uint32_t>(rank), static_cast<uint32_t>(world), 6);
      REQUIRE(start.lanes.size() == want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        CHECK(start.lanes[i].lane == want[i]);
        CHECK(start.lanes[i].sources[0].unit == want[i] + 1);
        CHECK(start.lanes[i].sources[0].item == 10 * want[i]);
      }
    }
  }
  auto e = error_of([&] { stages::checkpoint_cursor(two, 0, 4, "ck"); });
  CHECK(contains(e, "ck reads its data through 6 lanes, which 4 ranks cannot share (rank r serves lanes r, r + W, ...): "
                    "resume it on 1, 2, 3, 6 ranks"));
  // The checkpoint's order, K, rows and data step.
  const auto held = stages::checkpoint_order(two, "ck");
  CHECK(held.order == "lanes");
  CHECK(held.lanes == 6);
  CHECK(held.rows == 12);
  CHECK(held.data_step == 3);
  const auto old = stages::checkpoint_order("{\"step\":5,\"cursor\":{}}", "ck");
  CHECK(old.order == "documents");
  CHECK(old.data_step == 5);
  // A lane missing, a lane twice, a lane past K, a cursor that is not one.
  CHECK(contains(error_of([&] { stages::checkpoint_cursor(lanes_metadata(6, 2, 12, 3, 5), 0, 3, "ck"); }),
                 "ck: checkpoint metadata holds no cursor of lane 5 of its 6 lanes"));
  std::string twice = two;
  twice.replace(twice.rfind("\"lane=5"), std::strlen("\"lane=5"), "\"lane=3");
  CHECK(contains(error_of([&] { stages::checkpoint_cursor(twice, 0, 1, "ck"); }), "lane 3's cursor given twice"));
  std::string past = two;
  past.replace(past.rfind("\"lane=5"), std::strlen("\"lane=5"), "\"lane=9");
  CHECK(contains(error_of([&] { stages::checkpoint_cursor(past, 0, 1, "ck"); }), "a cursor of lane 9 in a run of 6 lanes"));
  std::string bad = two;
  bad.replace(bad.rfind("draws="), 6, "drawz=");  // in "cursors", which a checkpoint of 2 ranks is read from
  CHECK(contains(error_of([&] { stages::checkpoint_cursor(bad, 0, 1, "ck"); }), "ck: lane cursor \"lane=5 drawz=0"));
}

TEST_CASE("the lanes order's settings: K against the step's rows and the ranks, a resume's order and rows") {
  stages::RunConfig cfg;
  cfg.training.batch_size = 2;
  cfg.training.grad_accum = 3;
  // 2 x 3 x 2 ranks = 12 rows a step; auto: K = 12.
  auto s = stages::lane_session(cfg, 1, 2, {});
  CHECK(s->lanes == 12);
  CHECK(s->step_rows == 12);
  CHECK(s->mine == std::vector<uint32_t>{1, 3, 5, 7, 9, 11});
  CHECK(s->demand->size() == 6);
  cfg.data.lanes = 5;
  CHECK(contains(error_of([&] { stages::lane_session(cfg, 0, 2, {}); }),
                 "[data] lanes = 5 does not divide the 12 rows of a step (batch_size 2 x grad_accum 3 x 2 ranks): a step "
                 "takes the same number of rows from every lane; set lanes to 1, 2, 3, 4, 6 or 12 (auto: 12)"));
  cfg.data.lanes = 4;
  cfg.training.grad_accum = 2;  // 2 x 2 x 3 ranks = 12 rows, which 4 lanes divide
  CHECK(contains(error_of([&] { stages::lane_session(cfg, 0, 3, {}); }),
                 "4 lanes cannot be shared by 3 ranks (rank r serves lanes r, r + W, ...): run on 1, 2 or 4 ranks"));
  // A resume keeps the checkpoint's order and K, and its rows a step.
  stages::RunRequest req;
  stages::RunConfig resumed;
  resumed.training.batch_size = 1;
  resumed.training.grad_accum = 6;
  stages::CheckpointOrder held{"lanes", 6, 12, 3};
  stages::apply_checkpoint_order(held, req, resumed, 2, "ck");
  CHECK(resumed.data.order == "lanes");
  CHECK(resumed.data.lanes == 6);
  resumed.training.batch_size = 2;
  CHECK(contains(error_of([&] { stages::apply_checkpoint_order(held, req, resumed, 2, "ck"); }),
                 "ck trains 12 rows a step over its 6 lanes, and this run's step would be 24 (batch_size 2 x "
                 "grad_accum 6 x 2 ranks)"));
  req.overrides = {"data.lanes=4"};
  resumed.data.lanes = 4;
  CHECK(contains(error_of([&] { stages::apply_checkpoint_order(held, req, resumed, 2, "ck"); }),
                 "ck was written in the lanes order with 6 lanes, and --set data.lanes asks for 4"));
}

TEST_CASE("a run's lanes that do not fit its step, and last_target in the lanes order, are refused before training") {
  auto root = temp_dir("lane_errors");
  // tiny_config: 2 rows a step.
  auto e = error_of([&] { run(tiny_config(root / "a", kTextInput), root / "a", {"data.lanes=3"}); });
  CHECK(contains(e, "[data] lanes = 3 does not divide the 2 rows of a step"));
  e = error_of([&] {
    run(tiny_config(root / "b", kTokenInput + "[stages.rec]\ntype = \"record_batches\"\ninput = \"pack\"\nlast_target = true\n",
                    kData + "tokens"),
        root / "b", {"stages.h2d.input=\"rec\""});
  });
  CHECK(contains(e, "last_target = true records a token stream, which only [data] order = \"documents\" trains on"));
  // Fewer units than lanes: the data layer's sentence, before training.
  e = error_of([&] { run(tiny_config(root / "c", kTextInput), root / "c", {"data.lanes=512", "training.batch_size=512"}); });
  CHECK(contains(e, "units for 512 lanes"));
  fs::remove_all(root);
}
