// The spike guard ([training.guard]) on the CPU, fp32:
//   - the detector: a spike and a value that is not finite are skipped, the window and the
//     updates count do not move, the rate follows the updates, a state put back decides the same;
//   - AdamW told to skip changes nothing, bit for bit, even with NaN gradients (fused and plain);
//   - what a checkpoint records of it, and the config's keys;
//   - whole runs, in the lanes order (the default), on a dataset of the bundled text in which the
//     rows of a few late steps are uniform random tokens (a loss near ln V on a model that has
//     learned the text): the guard skips exactly those, and the final weights are bit for bit
//     those of a run whose data leaves them out (the data without those steps' rows, and the same
//     data with skip_steps), every step's rows (their hashes) the same; a streak rolls back to the
//     checkpoint before it, and the rows trained after it, and the data position of the
//     checkpoints after it, are those of a run that skipped the range; a run stopped while the
//     guard holds state resumes from its lane cursors to the same decisions, rows and weights; a
//     NaN loss; a guard that runs out of rollbacks stops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include "base/config.h"
#include "base/json.h"
#include "dist_harness.h"
#include "model/net/optim.h"
#include "model/net/spike_guard.h"
#include "graph/observe/prometheus.h"
#include "graph/observe/stats.h"
#include "runner/run_config.h"
#include "runner/tensorboard_log.h"
#include "runner/train_figures.h"
#include "stages/spike_watch.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;
using namespace train_harness;
using test_util::contains;

namespace {

struct Threads {
  Threads() { at::set_num_threads(1); }  // bitwise reproducibility and a fair share of 2 cores
} threads_once;

torch::Tensor scalar(float x) { return torch::full({}, x); }

model::LrSchedule schedule() { return {.lr_max = 1e-3, .lr_min = 1e-4, .warmup_steps = 3, .total_steps = 40}; }

// A few parameters with a gradient each (NaN ones when asked).
struct Toy {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  std::vector<torch::Tensor> params;
  Toy() {
    torch::manual_seed(3);
    named = {{"w", torch::randn({4, 3}).requires_grad_()}, {"b", torch::randn({3}).requires_grad_()}};
    for (auto& [n, p] : named) params.push_back(p);
  }
  void grads(bool nan) {
    for (auto& p : params) p.mutable_grad() = nan ? torch::full_like(p, NAN) : torch::randn_like(p);
  }
  std::vector<torch::Tensor> copy(const model::AdamW& opt) const {
    std::vector<torch::Tensor> out;
    for (const auto& p : params) out.push_back(p.detach().clone());
    for (const auto& [n, t] : opt.state()) out.push_back(t.clone());
    return out;
  }
};

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("the detector skips a spike and a value that is not finite, and nothing moves when it does") {
  Toy toy;
  model::AdamW opt(toy.named);
  model::SpikeGuard guard({.window = 8, .z = 4, .min_steps = 4}, schedule(), 40, torch::kCPU);
  auto judge = [&](float loss, float norm) {
    auto found = guard.judge(scalar(loss), scalar(norm), opt);
    return model::SpikeVerdict::from(guard.verdict());
  };
  // Steady values: let through, and before min_steps even a large one is not judged.
  const float losses[] = {5.0f, 5.1f, 4.9f, 9.0f, 5.05f, 4.95f, 5.02f};
  for (int i = 0; i < 7; ++i) {
    auto v = judge(losses[i], 1.0f + 0.01f * static_cast<float>(i));
    CHECK_FALSE(v.skipped);
    CHECK(v.updates == i + 1);
    CHECK(v.lr == doctest::Approx(static_cast<float>(schedule().at(i))));
    CHECK(static_cast<float>(v.lr) == static_cast<float>(schedule().at(i)));  // the table holds the host's float
  }
  // A spike in the loss: skipped, z reported, the updates count stays, and so does the rate.
  auto spike = judge(30.0f, 1.03f);
  CHECK(spike.skipped);
  CHECK(spike.loss_z > 4);
  CHECK(spike.updates == 7);
  CHECK(spike.streak == 1);
  CHECK(spike.skips == 1);
  CHECK(static_cast<float>(spike.lr) == static_cast<float>(schedule().at(7)));
  // A spike in the grad norm alone, then NaN and inf: skipped; the streak grows.
  auto by_norm = judge(5.0f, 50.0f);
  CHECK(by_norm.skipped);
  CHECK(by_norm.norm_z > 4);
  CHECK(judge(NAN, 1.0f).skipped);
  auto inf = judge(5.0f, INFINITY);
  CHECK(inf.skipped);
  CHECK(inf.streak == 4);
  CHECK(inf.skips == 4);
  // The window did not take them: the next ordinary value has the z-score it had before them.
  model::SpikeGuard twin({.window = 8, .z = 4, .min_steps = 4}, schedule(), 40, torch::kCPU);
  model::AdamW twin_opt(toy.named);
  for (int i = 0; i < 7; ++i) twin.judge(scalar(losses[i]), scalar(1.0f + 0.01f * static_cast<float>(i)), twin_opt);
  auto after = judge(5.2f, 1.02f);
  twin.judge(scalar(5.2f), scalar(1.02f), twin_opt);
  auto twin_v = model::SpikeVerdict::from(twin.verdict());
  CHECK_FALSE(after.skipped);
  CHECK(after.loss_z == twin_v.loss_z);
  CHECK(after.norm_z == twin_v.norm_z);
  CHECK(after.streak == 0);
  CHECK(after.updates == 8);
}

TEST_CASE("a state put back on the device decides as the detector it came from, bit for bit") {
  Toy toy;
  model::AdamW opt(toy.named);
  const model::SpikeGuardOptions o{.window = 5, .z = 3, .min_steps = 3};
  model::SpikeGuard guard(o, schedule(), 40, torch::kCPU);
  model::SpikeGuardState mirror;  // what the host keeps from the verdicts (stages/spike_watch.h)
  torch::manual_seed(11);
  auto values = torch::rand({40, 2}) * 0.5 + 4;
  values[17][0] = 40;  // one spike on the way
  auto feed = [&](model::SpikeGuard& g, model::AdamW& a, int i) {
    g.judge(values[i][0].clone(), values[i][1].clone(), a);
    return model::SpikeVerdict::from(g.verdict());
  };
  for (int i = 0; i < 23; ++i) {
    auto v = feed(guard, opt, i);
    mirror.updates = v.updates;
    mirror.streak = v.streak;
    mirror.skips = v.skips;
    if (!v.skipped) mirror.accept(v.loss, v.norm, o.window);
  }
  CHECK(mirror.count == 22);
  CHECK(mirror.loss.size() == 5);
  model::AdamW opt2(toy.named);
  model::SpikeGuard resumed(o, schedule(), 40, torch::kCPU);
  resumed.load(mirror);
  for (int i = 23; i < 40; ++i) {
    auto a = feed(guard, opt, i), b = feed(resumed, opt2, i);
    CHECK(a.loss_z == b.loss_z);
    CHECK(a.norm_z == b.norm_z);
    CHECK(a.skipped == b.skipped);
    CHECK(a.updates == b.updates);
    CHECK(a.lr == b.lr);
  }
  // Another window size keeps the newest values that fit, and counts only them while short.
  model::SpikeGuard wider({.window = 9, .z = 3, .min_steps = 3}, schedule(), 40, torch::kCPU);
  CHECK_NOTHROW(wider.load(mirror));
  model::SpikeGuardState bad = mirror;
  bad.norm.pop_back();
  CHECK_THROWS_WITH_AS(resumed.load(bad), doctest::Contains("5 loss and 4 norm values"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(model::SpikeGuard({.window = 1}, schedule(), 40, torch::kCPU), doctest::Contains("window must be >= 2"),
                       std::invalid_argument);
}

TEST_CASE("AdamW told to skip changes nothing, bit for bit, even with NaN gradients (fused and plain)") {
  for (bool fused : {true, false}) {
    CAPTURE(fused);
    Toy toy;
    model::AdamW opt(toy.named, {.lr = 1e-2, .fused = fused});
    toy.grads(false);
    opt.step(torch::zeros({}));  // a step taken: moments and counts move
    auto before = toy.copy(opt);
    toy.grads(true);
    opt.step(torch::ones({}));
    CHECK(same(toy.copy(opt), before));
    toy.grads(false);
    opt.step(torch::ones({}));
    CHECK(same(toy.copy(opt), before));
    // found_inf = 0 is the step without it, bit for bit.
    Toy other;
    model::AdamW plain(other.named, {.lr = 1e-2, .fused = fused});
    torch::manual_seed(5);
    toy.grads(false);
    torch::manual_seed(5);
    other.grads(false);
    opt.step(torch::zeros({}));
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < other.params.size(); ++i) other.params[i].copy_(toy.params[i].detach());
    // (plain starts from other moments; compare one step of each from equal states instead)
  }
  Toy a, b;
  model::AdamW oa(a.named), ob(b.named);
  for (int i = 0; i < 3; ++i) {
    torch::manual_seed(20 + i);
    a.grads(false);
    torch::manual_seed(20 + i);
    b.grads(false);
    oa.step();
    ob.step(torch::zeros({}));
  }
  CHECK(same(a.copy(oa), b.copy(ob)));
  CHECK_THROWS_WITH_AS(oa.step(torch::zeros({2})), doctest::Contains("found_inf must be one float32"), c10::Error);
}

TEST_CASE("a checkpoint's guard record: written and read back, old checkpoints, and bad ones named") {
  stages::GuardRecord r;
  r.detector.loss = {4.5f, 4.25f, 1.0f / 3.0f};
  r.detector.norm = {0.75f, 1e-7f, 3.0f};
  r.detector.count = 12;
  r.detector.updates = 40;
  r.detector.streak = 2;
  r.detector.skips = 5;
  r.streak_first = 44;
  r.rollbacks = 1;
  r.rolled_back = {{21, 30}};
  auto back = stages::GuardRecord::from_metadata(json_parse("{\"step\":45,\"guard\":" + r.to_json() + "}"), 45, "c.ckpt");
  CHECK(back.detector.loss == r.detector.loss);  // exact: nine digits give a float back
  CHECK(back.detector.norm == r.detector.norm);
  CHECK(back.detector.count == 12);
  CHECK(back.detector.updates == 40);
  CHECK(back.detector.streak == 2);
  CHECK(back.detector.skips == 5);
  CHECK(back.streak_first == 44);
  CHECK(back.rollbacks == 1);
  REQUIRE(back.rolled_back.size() == 1);
  CHECK(back.rolled_back[0].first == 21);
  CHECK(back.rolled_back[0].last == 30);
  auto old = stages::GuardRecord::from_metadata(json_parse("{\"step\":45}"), 45, "c.ckpt");
  CHECK(old.detector.updates == 45);
  CHECK(old.detector.count == 0);
  auto error = [](const std::string& guard) {
    return test_util::error_of(
        [&] { stages::GuardRecord::from_metadata(json_parse("{\"guard\":" + guard + "}"), 10, "run/c.ckpt"); });
  };
  CHECK(contains(error("{\"updates\":-1}"), "run/c.ckpt: checkpoint metadata \"guard\": \"updates\" must be a non-negative integer, got -1"));
  CHECK(contains(error("{\"updates\":11}"), "does not add up"));
  CHECK(contains(error("{\"count\":1,\"loss\":[1,2],\"norm\":[1,2]}"), "does not add up"));
  CHECK(contains(error("{\"rolled_back\":[[1]]}"), "[first, last] pairs"));
  CHECK(contains(error("[]"), "\"guard\" must be an object"));
}

TEST_CASE("the watch reads verdicts as they come, sees a streak, and a rollback records its range") {
  stages::GuardSection g;
  g.enabled = true;
  g.window = 4;
  g.max_skips = 2;
  g.rollback_skip = 10;
  g.skip_steps = {{5, 6}};
  stages::SpikeWatch w(g, stages::GuardRecord{});
  auto verdict = [](bool skipped, float loss, int64_t updates, int64_t streak, int64_t skips) {
    auto t = torch::zeros({model::SpikeVerdict::kFields}, torch::kDouble);
    t[0] = skipped ? 1.0 : 0.0;
    t[1] = loss;
    t[2] = 1.0;
    t[5] = static_cast<double>(updates);
    t[6] = static_cast<double>(streak);
    t[7] = static_cast<double>(skips);
    return t;
  };
  w.issued(1, verdict(false, 5, 1, 0, 0), nullptr);
  w.issued(2, verdict(true, 9, 1, 1, 1), nullptr);
  w.read(1);  // leaves the newest
  CHECK(w.unread() == 1);
  CHECK(w.updates_known() == 1);
  CHECK(w.record().detector.count == 1);
  w.issued(3, verdict(true, 9, 1, 2, 2), nullptr);
  w.read(0);
  REQUIRE(w.trip());
  CHECK(w.trip()->first == 2);
  CHECK(w.trip()->last == 3);
  CHECK(w.record().detector.count == 1);  // skipped steps never enter the window
  CHECK(w.skips_data(5));
  CHECK(w.skips_data(6));
  CHECK_FALSE(w.skips_data(7));
  CHECK_FALSE(w.abandoned(2));
  stages::GuardRecord at0;  // the checkpoint of step 0
  auto range = w.rolled_back(0, at0, 4);
  CHECK(range.first == 1);
  CHECK(range.last == 10);  // rollback_skip steps of data from the checkpoint
  CHECK_FALSE(w.trip());
  CHECK(w.record().rollbacks == 1);
  CHECK(w.record().detector.skips == 2);  // events stay counted
  CHECK(w.updates_known() == 0);
  CHECK(w.abandoned(3));
  CHECK(w.skips_data(9));
  auto joined = w.skipped_range(7);  // skip_steps 5-6 and the rollback's 1-10 touch: one range
  CHECK(joined.first == 1);
  CHECK(joined.last == 10);
}

TEST_CASE("[training.guard]: its keys, --set, and bad skip_steps named") {
  auto resolve = [](const std::string& guard, std::vector<std::string> sets = {}) {
    auto doc = config::Document::parse("[data]\ndataset = \"" + kData + "text\"\n" + guard, "g.toml", std::move(sets));
    return stages::resolve_run_config(doc, PIPELINE_SOURCE_DIR);
  };
  auto defaults = resolve("");
  CHECK_FALSE(defaults.training.guard.enabled);  // off unless asked for (docs/robustness.md)
  CHECK(defaults.training.guard.z == 10.0);
  CHECK(defaults.training.guard.min_steps == 50);
  CHECK(resolve("[training.guard]\nwindow = 30\n").training.guard.min_steps == 30);  // judged once full
  // Past the 2^24 updates its table covers, a run resolves with the guard off (an error when it is
  // asked for, below).
  CHECK_FALSE(resolve("[training]\nsteps = 100000000\n").training.guard.enabled);
  auto on = resolve("[training.guard]\nenabled = true\nz = 4.5\nskip_steps = [\"7\", \"20-25\"]\n", {"training.guard.window=30"});
  CHECK(on.training.guard.enabled);
  CHECK(on.training.guard.z == 4.5);
  CHECK(on.training.guard.window == 30);
  REQUIRE(on.training.guard.skip_steps.size() == 2);
  CHECK(on.training.guard.skip_steps[0].first == 7);
  CHECK(on.training.guard.skip_steps[0].last == 7);
  CHECK(on.training.guard.skip_steps[1].first == 20);
  CHECK(on.training.guard.skip_steps[1].last == 25);
  auto error = [&](const std::string& guard) { return test_util::error_of([&] { resolve(guard); }); };
  CHECK(contains(error("[training.guard]\nskip_steps = [\"9-3\"]\n"),
                 "g.toml:4: [training.guard] skip_steps: expected \"N\" or \"FROM-TO\" with 1 <= FROM <= TO, got \"9-3\""));
  CHECK(contains(error("[training.guard]\nskip_steps = [\"0\"]\n"), "got \"0\""));
  CHECK(contains(error("[training.guard]\nmin_steps = 50\nwindow = 10\n"), "min_steps: must not exceed window (10), got 50"));
  CHECK(contains(error("[training.guard]\nzz = 3\n"), "unknown key 'zz'"));
  CHECK(contains(error("[training]\nsteps = 100000000\n[training.guard]\nenabled = true\n"),
                 "[training.guard] enabled: the guard's learning-rate table covers at most 16777216 steps, and "
                 "[training] steps = 100000000"));
}

// ---- whole runs ---------------------------------------------------------------------------------

namespace {

// The lanes order (the default), K = B lanes: a step takes one row of every lane, and data step s
// is row s of each, rows of the kind given for s alone (dist_harness::write_lane_docs).
constexpr int kB = 8, kT = 32;  // the batch (tiny_config's T)
using dist_harness::Doc;
using dist_harness::LaneDocs;

LaneDocs write_docs(const fs::path& dir, const std::vector<Doc>& steps) {
  return dist_harness::write_lane_docs(dir, steps, kB, kT);
}

// The kinds of `n` data steps: text, but `bad` (1-based) of kind `kind`; with `omit`, the bad ones
// left out (the data of a run that never sees them: the rows of every other step as they were).
std::vector<Doc> docs_with(int n, const std::set<int>& bad, Doc kind, bool omit = false) {
  std::vector<Doc> out;
  for (int step = 1; step <= n; ++step) {
    if (!bad.count(step))
      out.push_back(Doc::text);
    else if (!omit)
      out.push_back(kind);
  }
  return out;
}

constexpr int kSteps = 100;  // updates

// The tiny model, read_tokens on `data`, the guard's test settings (a shorter window than the
// default's: the loss still falls fast this early), loop off so that the data is read once. On
// this data the text's z-scores stay below 5 (with the guard never firing: measured), a random
// step's loss is far above the text's.
std::string guard_config(const fs::path& run, const fs::path& data, const std::string& extra = "") {
  return tiny_config(run, kTokenInput, data.string()) +
         "[training.guard]\nenabled = true\nwindow = 32\nmin_steps = 16\nz = 8.0\nmax_skips = 3\nrollback_skip = 10\n"
         "max_rollbacks = 2\n" +
         extra;
}

std::vector<std::string> run_sets(int checkpoint_every = 10) {
  return {"training.steps=" + std::to_string(kSteps),
          "training.batch_size=" + std::to_string(kB),
          "optimizer.lr=1e-3",
          "optimizer.min_lr=1e-4",
          "optimizer.warmup_steps=5",
          "checkpoint.every=" + std::to_string(checkpoint_every),
          "checkpoint.keep=100",
          "data.loop=false",
          "stages.read.chunk_tokens=" + std::to_string(kB * kT)};
}

RunResult train(const fs::path& root, const std::string& name, const LaneDocs& data, std::vector<std::string> sets,
                const std::string& extra = "") {
  auto dir = root / name;
  sets.push_back(data.unit_set());
  return run(guard_config(dir, data.dir, extra), dir, std::move(sets));
}

// metrics.jsonl: the steps marked skipped, and the event lines.
std::set<int64_t> skipped_steps(const fs::path& dir) {
  std::set<int64_t> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (contains(line, "\"skipped\":1")) out.insert(static_cast<int64_t>(json_parse(line).number("step")));
  return out;
}

std::vector<JsonValue> events(const fs::path& dir) {
  std::vector<JsonValue> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (contains(line, "\"event\":\"guard_")) out.push_back(json_parse(line));
  return out;
}

double max_z(const fs::path& dir, int64_t below_step) {
  double worst = -1e9;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (!contains(line, "\"loss_z\"")) continue;
    auto v = json_parse(line);
    if (v.number("step") < static_cast<double>(below_step)) worst = std::max({worst, v.number("loss_z"), v.number("norm_z")});
  }
  return worst;
}

model::CheckpointState final_state(const RunResult& r) { return dist_harness::final_checkpoint(r.dir); }

// Where a checkpoint's data goes on: its data step and its lanes' cursors.
std::string data_position(const fs::path& ckpt) {
  const auto meta = json_parse(model::read_checkpoint(ckpt.string()).metadata);
  std::string out = "data_step " + std::to_string(static_cast<int64_t>(meta.number("data_step")));
  const JsonValue* cursor = meta.find("cursor");
  const JsonValue* lanes = cursor ? cursor->find("lanes") : nullptr;
  if (!lanes) return out + "; no lane cursors";
  for (const auto& l : lanes->items) out += "; " + l.text;
  return out;
}

}  // namespace

TEST_CASE("bad data late in the run: the guard skips exactly those windows; the weights are those of a run without them") {
  auto root = temp_dir("guard_spike");
  const std::set<int> bad = {81, 82, 95};  // isolated: fewer than max_skips in a row
  auto bad_data = write_docs(root / "bad", docs_with(kSteps + 3, bad, Doc::random));
  auto clean_data = write_docs(root / "clean", docs_with(kSteps + 3, bad, Doc::random, /*omit=*/true));

  auto guarded = train(root, "guarded", bad_data, run_sets());
  INFO(test_util::read_file(guarded.dir / "run.log"));
  CHECK(skipped_steps(guarded.dir) == std::set<int64_t>{81, 82, 95});
  CHECK(guarded.last_step == kSteps + 3);  // data steps: 100 updates and 3 skipped
  CHECK(max_z(guarded.dir, 81) < 5.0);     // the text stayed clear of the threshold
  auto log = test_util::read_file(guarded.dir / "run.log");
  CHECK(contains(log, "guard: step 81 skipped: loss 1"));  // ~12: near ln V = 10.8, and past it
  CHECK(contains(log, "1 in a row (3 roll back)"));
  CHECK(contains(log, "guard: 3 skipped, 0 rolled back"));
  // The loss on the random windows: near ln V, far above the text's.
  auto v81 = std::stod(guarded.losses.at(81));
  CHECK(v81 > 9.5);
  CHECK(v81 < 14.0);
  CHECK(std::stod(guarded.losses.at(80)) < 7.5);

  // The same data with the guard off and those steps listed in skip_steps, and the data without
  // those steps' rows at all: the same weights, bit for bit. (In the lanes order a lane's rows come
  // from its units, so the data without them leaves each step's row out of every lane's unit:
  // write_lane_docs with those steps omitted; dropping documents from one stream would shift rows
  // between lanes.)
  auto listed = train(root, "listed", bad_data, run_sets(), "skip_steps = [\"81-82\", \"95\"]\n");
  CHECK(skipped_steps(listed.dir).empty());
  auto listed_off = train(root, "listed_off", bad_data, [] {
    auto s = run_sets();
    s.push_back("training.guard.enabled=false");
    return s;
  }(), "skip_steps = [\"81-82\", \"95\"]\n");
  auto clean = train(root, "clean", clean_data, run_sets());
  CHECK(skipped_steps(clean.dir).empty());
  CHECK(clean.last_step == kSteps);
  const auto g = final_state(guarded), l = final_state(listed), lo = final_state(listed_off), c = final_state(clean);
  CHECK(dist_harness::same_weights(g, c));
  CHECK(dist_harness::same_weights(g, l));
  CHECK(dist_harness::same_weights(g, lo));
  // And the optimizer's state: moments and step counts (100 each), the rate at the schedule's end.
  REQUIRE(g.optimizer.size() == c.optimizer.size());
  for (size_t i = 0; i < g.optimizer.size(); ++i) {
    CAPTURE(g.optimizer[i].first);
    CHECK(torch::equal(g.optimizer[i].second, c.optimizer[i].second));
  }
  // The guarded run's step k is the clean run's step k - (skips before it): the same rows (their
  // hashes, "windows" in metrics.jsonl) and the same loss; the listed runs train the guarded run's
  // rows at its steps but 81, 82 and 95, which they read and leave.
  CHECK(guarded.losses.at(90) == clean.losses.at(88));
  CHECK(guarded.losses.at(103) == clean.losses.at(100));
  const auto gw = read_windows(guarded.dir), cw = read_windows(clean.dir), lw = read_windows(listed.dir);
  CHECK(cw.size() == kSteps);
  CHECK(lw.size() == kSteps);
  CHECK(gw.size() == kSteps + 3);
  for (const auto& [step, w] : cw) {
    const int64_t k = step + (step > 80 ? 2 : 0) + (step > 92 ? 1 : 0);
    CAPTURE(step);
    CHECK(gw.at(k) == w);
    CHECK(lw.at(k) == w);
  }
  CHECK(contains(test_util::read_file(listed.dir / "run.log"), "data steps 81-82 are read but not trained on ([training.guard] skip_steps)"));
}

TEST_CASE("a streak rolls back to the checkpoint before it; a run stopped while the guard holds state resumes to the same") {
  auto root = temp_dir("guard_rollback");
  // Text, then five steps of random rows from step 75, checkpoints every 4 steps: steps 73 and 74
  // train (and are undone), 75..77 are skipped, the third skip in a row rolls back to the
  // checkpoint of step 72, and data steps 73..82 (rollback_skip 10 from it) are never trained on.
  const std::set<int> bad = {75, 76, 77, 78, 79};
  auto data = write_docs(root / "bad", docs_with(kSteps + 20, bad, Doc::random));
  auto full = train(root, "full", data, run_sets(4));
  INFO(test_util::read_file(full.dir / "run.log"));
  CHECK(skipped_steps(full.dir) == std::set<int64_t>{75, 76, 77});
  auto ev = events(full.dir);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].string("event") == "guard_rollback");
  CHECK(ev[0].number("to_step") == 72);  // the newest checkpoint before the streak
  CHECK(ev[0].string("streak") == "75-77");
  CHECK(ev[0].string("skipped_steps") == "73-82");
  CHECK(ev[0].number("updates") == 72);
  auto log = test_util::read_file(full.dir / "run.log");
  CHECK(contains(log, "rolling back to the checkpoint of step 72"));
  CHECK(contains(log, "updates 74 -> 72"));
  CHECK(contains(log, "data steps 78-82 are read but not trained on (a rollback's skipped data)"));
  // 72 updates kept, 73..82 never trained on, then 28 more: step 110 takes the 100th update.
  CHECK(full.last_step == 110);

  // Where it shows besides run.log: `pipeline stats`, TensorBoard's scalars (from the metrics
  // lines), the figures of the live page and /metrics.
  auto stats = test_util::shell(std::string(PIPELINE_EXE) + " stats " + full.dir.string());
  CHECK(contains(stats.out, "spike guard (metrics.jsonl): 3 steps skipped (75, 76, 77)"));
  CHECK(contains(stats.out, "rollback 1: back to step 72 after steps 75-77 were skipped; data steps 73-82 skipped"));
  stages::RunContext bare;  // no log: the figures take the lines given them
  stages::TrainFigures figures(bare);
  std::ifstream lines(full.dir / "metrics.jsonl");
  std::set<std::string> tags;
  for (std::string line; std::getline(lines, line);) {
    figures.take(line);
    int64_t step = 0;
    std::vector<std::pair<std::string, double>> scalars;
    if (stages::metric_scalars(line, step, scalars))
      for (const auto& [tag, x] : scalars) tags.insert(tag);
  }
  for (const char* tag : {"train/loss_z", "train/norm_z", "train/guard_skips", "train/guard_rollbacks", "train/skipped",
                          "train/updates"})
    CHECK_MESSAGE(tags.count(tag) == 1, tag);
  graph::Snapshot snap;
  figures.annotate(snap);
  CHECK(snap.train_figure("guard_skips") == 3);
  CHECK(snap.train_figure("guard_rollbacks") == 1);
  CHECK(contains(graph::prometheus_text(snap), "pipeline_train_guard_rollbacks_total{rank=\"0\"} 1"));

  // What it amounts to: the data of steps 73..82 left out. The rollback restored the weights, the
  // optimizer and the detector, not the data: the data steps go on and those of the range are
  // dropped by their number (Batch::data_step), so the rows trained after it are those of an
  // uninterrupted run that skipped the range (every step's hash), and the data position of a
  // checkpoint after it (the data step, every lane's cursor) is that run's.
  auto listed = train(root, "listed", data, run_sets(4), "skip_steps = [\"73-82\"]\n");
  CHECK(skipped_steps(listed.dir).empty());
  CHECK(dist_harness::same_weights(final_state(full), final_state(listed)));
  const auto fw = read_windows(full.dir), lw = read_windows(listed.dir);
  CHECK(lw.size() == 100);
  CHECK(fw.size() == 105);  // and 73..77, trained (73, 74) or skipped before the rollback
  for (const auto& [step, w] : lw) {
    CAPTURE(step);
    CHECK(fw.at(step) == w);
  }
  const auto ckpt = [](const RunResult& r, int step) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d.ckpt", step);
    return r.dir / "checkpoints" / name;
  };
  CHECK(contains(data_position(ckpt(full, 88)), "data_step 88; lane=0 "));
  CHECK(data_position(ckpt(full, 88)) == data_position(ckpt(listed, 88)));

  // The checkpoint of step 76 was taken while the guard held a streak of 2: resumed from it, the
  // run decides the same (the third skip, the rollback to 72) and ends with the same weights;
  // so does the checkpoint of step 88, after the rollback.
  auto ckpt76 = model::read_checkpoint((full.dir / "checkpoints" / "step_00000076.ckpt").string());
  auto rec76 = stages::GuardRecord::from_metadata(json_parse(ckpt76.metadata), 76, "76");
  CHECK(rec76.detector.streak == 2);
  CHECK(rec76.streak_first == 75);
  CHECK(rec76.detector.updates == 74);
  auto rec88 = stages::GuardRecord::from_metadata(
      json_parse(model::read_checkpoint((full.dir / "checkpoints" / "step_00000088.ckpt").string()).metadata), 88, "88");
  CHECK(rec88.rollbacks == 1);
  REQUIRE(rec88.rolled_back.size() == 1);
  CHECK(rec88.rolled_back[0].first == 73);
  CHECK(rec88.rolled_back[0].last == 82);
  CHECK(rec88.detector.updates == 78);
  for (int from : {76, 88}) {
    CAPTURE(from);
    auto part = root / ("part" + std::to_string(from));
    fs::create_directories(part / "checkpoints");
    for (const auto& e : fs::directory_iterator(full.dir / "checkpoints")) {
      long long step = 0;
      std::sscanf(e.path().filename().c_str(), "step_%lld", &step);
      if (step <= from) fs::copy_file(e.path(), part / "checkpoints" / e.path().filename());
    }
    fs::copy_file(full.dir / "config.toml", part / "config.toml");
    auto resumed = run("", part, {}, part);
    INFO(test_util::read_file(part / "run.log"));
    CHECK(resumed.last_step == 110);
    CHECK(dist_harness::same_weights(final_state(full), final_state(resumed)));
    for (const auto& [step, w] : read_windows(part)) {  // from the checkpoint's lane cursors
      CAPTURE(step);
      CHECK(fw.at(step) == w);
    }
    if (from == 76) {
      CHECK(skipped_steps(part) == std::set<int64_t>{77});
      REQUIRE(events(part).size() == 1);
      CHECK(events(part)[0].number("to_step") == 72);
    } else {
      CHECK(events(part).empty());
    }
  }
}

TEST_CASE("a NaN loss is skipped; a guard out of rollbacks stops the run with a checkpoint and the steps named") {
  auto root = temp_dir("guard_nan");
  // One step whose every target is padding: the loss is 0/0.
  auto data = write_docs(root / "nan", docs_with(kSteps + 1, {50}, Doc::nan));
  auto nan = train(root, "nan", data, run_sets());
  INFO(test_util::read_file(nan.dir / "run.log"));
  CHECK(nan.losses.at(50) == "null");  // metrics.jsonl stays JSON
  CHECK(skipped_steps(nan.dir) == std::set<int64_t>{50});
  CHECK(contains(test_util::read_file(nan.dir / "run.log"), "(not finite); 1 in a row"));
  auto listed = train(root, "listed", data, run_sets(), "skip_steps = [\"50\"]\n");
  CHECK(dist_harness::same_weights(final_state(nan), final_state(listed)));
  const auto nw = read_windows(nan.dir);
  for (const auto& [step, w] : read_windows(listed.dir)) {
    CAPTURE(step);
    CHECK(nw.at(step) == w);
  }
  // The weights stayed finite: the NaN never reached them or the moments.
  for (const auto& [name, t] : final_state(nan).model) CHECK(torch::isfinite(t).all().item<bool>());

  // NaN steps that go on: every rollback lands in more of them, and after max_rollbacks = 2 the
  // guard stops the run. Checkpoints every 10; the streak 41..43 rolls back to 40 (skipping
  // 41..50), then 51..53 to 40 again (skipping to 60), then 61..63: stop.
  std::set<int> many;
  for (int s = 41; s <= 80; ++s) many.insert(s);
  auto stuck_data = write_docs(root / "stuck", docs_with(kSteps + 40, many, Doc::nan));
  auto stuck = train(root, "stuck", stuck_data, run_sets());
  auto log = test_util::read_file(stuck.dir / "run.log");
  INFO(log);
  auto ev = events(stuck.dir);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0].string("event") == "guard_rollback");
  CHECK(ev[0].string("skipped_steps") == "41-50");
  CHECK(ev[1].string("event") == "guard_rollback");
  CHECK(ev[1].number("to_step") == 40);
  CHECK(ev[1].string("skipped_steps") == "41-53");
  CHECK(ev[2].string("event") == "guard_stop");
  CHECK(contains(log, "guard: steps 54-56 were skipped in a row"));
  CHECK(contains(log, "after 2 rollbacks (data steps skipped: 41-50, 41-53), the most [training.guard] max_rollbacks = 2 allows"));
  CHECK(contains(log, "The run stops"));
  CHECK(stuck.last_step == 56);
  // It ends with a checkpoint, whose weights are those from before the NaN (40 updates).
  auto last = final_state(stuck);
  CHECK(last.step == 56);
  CHECK(stages::GuardRecord::from_metadata(json_parse(last.metadata), 56, "last").detector.updates == 40);
  CHECK(dist_harness::same_weights(last, model::read_checkpoint((stuck.dir / "checkpoints" / "step_00000040.ckpt").string())));
}
