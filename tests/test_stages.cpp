// End-to-end tests of the training graph on the CPU: a tiny GPT-2 trained for a few steps
// through read_shards -> tokenize -> pack -> h2d -> train -> log/eval/checkpoint, exact
// resume, swapping the input side from TOML, and the errors a user meets first.
#include <algorithm>
#include <any>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <torch/torch.h>

#include "base/json.h"
#include "datasets/sources/dataset_reader.h"
#include "graph/engine.h"
#include "graph/observe/stats.h"
#include "runner/resume_records.h"
#include "runner/run_setup.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;

namespace {

using test_util::contains;
using test_util::error_of;

using namespace train_harness;

struct Threads {
  Threads() { at::set_num_threads(1); }  // bitwise reproducibility and a fair share of 2 cores
} threads_once;

}  // namespace

TEST_CASE("a tiny model trains through the whole graph and learns") {
  auto root = temp_dir("e2e");
  auto r = run(tiny_config(root / "run", kTextInput), root / "run", {"training.steps=30", "checkpoint.every=0", "optimizer.lr=1e-2", "optimizer.min_lr=1e-3"});
  REQUIRE(r.losses.size() == 30);
  CHECK(r.last_step == 30);
  double first = std::stod(r.losses.begin()->second), last = std::stod(r.losses.rbegin()->second);
  MESSAGE("tiny model: loss " << first << " -> " << last);
  CHECK(first == doctest::Approx(std::log(50257.0)).epsilon(0.02));
  CHECK(last < first - 1.0);
  CHECK(fs::exists(root / "run" / "config.toml"));
  CHECK(fs::exists(root / "run" / "stats_summary.json"));
  CHECK(fs::exists(r.checkpoint));  // at_end
  CHECK(contains(r.checkpoint, "step_00000030.ckpt"));
  fs::remove_all(root);
}

TEST_CASE("the same seed gives the same losses whatever the tokenize worker count") {
  auto root = temp_dir("det");
  auto a = run(tiny_config(root / "a", kTextInput), root / "a", {"stages.tokenize.workers=1"});
  auto b = run(tiny_config(root / "b", kTextInput), root / "b", {"stages.tokenize.workers=3", "stages.tokenize.capacity=2"});
  REQUIRE(a.losses.size() == 8);
  CHECK(a.losses == b.losses);
  fs::remove_all(root);
}

TEST_CASE("read_tokens in place of read_shards + tokenize gives the same batches (the documents order)") {
  // One stream whatever the format it is stored in. (The lanes order deals units, a text shard's
  // blocks or a token shard's, which hold different documents: each lane's stream differs.)
  auto root = temp_dir("swap");
  auto text = run(tiny_config(root / "t", kTextInput), root / "t", {"data.order=\"documents\""});
  auto tokens = run(tiny_config(root / "k", kTokenInput, kData + "tokens"), root / "k", {"data.order=\"documents\""});
  REQUIRE(text.losses.size() == 8);
  CHECK(text.losses == tokens.losses);
  fs::remove_all(root);
}

TEST_CASE("record_batches with last_target: the file is every input and target trained on") {
  // 8 steps x 2 micro-batches of B*T = 64 tokens, then the last batch's last target: the token
  // stream's first 1025 tokens (read_tokens and pack cut it without gaps or overlaps but the one
  // token each window shares with the next). Without last_target, one token fewer. The
  // documents order: its rows are cut from one stream, which the lanes order's are not.
  auto root = temp_dir("record");
  const std::string input =
      "[stages.read]\ntype = \"read_tokens\"\nchunk_tokens = 100\n"
      "[stages.pack]\ntype = \"pack\"\ninput = \"read\"\ncapacity = 8\n"
      "[stages.rec]\ntype = \"record_batches\"\ninput = \"pack\"\nlast_target = true\n"
      "[stages.h2d]\ntype = \"h2d\"\ninput = \"rec\"\ncapacity = 2\n";
  const std::vector<std::string> sets = {"training.grad_accum=2", "data.order=\"documents\""};
  auto with = run(tiny_config(root / "with", input, kData + "tokens"), root / "with", sets);
  REQUIRE(with.last_step == 8);
  datasets::TokenDatasetReader reader;
  reader.open(kData + "tokens", "train");
  std::vector<uint16_t> stream(8 * 2 * 64 + 1);
  REQUIRE(reader.read(stream) == stream.size());
  const std::string recorded = test_util::read_file(root / "with" / "batches.u16");
  REQUIRE(recorded.size() == 2 * stream.size());
  CHECK(std::memcmp(recorded.data(), stream.data(), recorded.size()) == 0);
  std::string plain = input;
  plain.replace(plain.find("last_target = true\n"), 19, "");
  auto without = run(tiny_config(root / "without", plain, kData + "tokens"), root / "without", sets);
  CHECK(without.losses == with.losses);
  CHECK(test_util::read_file(root / "without" / "batches.u16") == recorded.substr(0, recorded.size() - 2));
  fs::remove_all(root);
}

TEST_CASE("synthetic input replaces the whole input side") {
  auto root = temp_dir("synth");
  const std::string input =
      "[stages.h2d]\ntype = \"synthetic\"\n";  // train's input is named h2d in tiny_config
  auto r = run(tiny_config(root / "s", input), root / "s", {"training.steps=3"});
  CHECK(r.losses.size() == 3);
  fs::remove_all(root);
}

TEST_CASE("resume from a checkpoint continues with the same losses, bit for bit") {
  auto root = temp_dir("resume");
  CHECK(error_of([&] { check_exact_resume(root, kTextInput); }) == "");
  fs::remove_all(root);
}

namespace {

// Every line of a run's metrics.jsonl with a "step", in order: its step, and whether it is an
// evaluation's.
std::vector<std::pair<int64_t, bool>> metric_steps(const fs::path& file) {
  std::vector<std::pair<int64_t, bool>> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto v = json_parse(line);
    if (v.find("step")) out.emplace_back(static_cast<int64_t>(v.number("step")), v.find("val_loss") != nullptr);
  }
  return out;
}

}  // namespace

TEST_CASE("a resume moves the records past its checkpoint out of metrics.jsonl: each step once, none lost") {
  auto root = temp_dir("superseded");
  const std::string input = kTextInput + "[stages.eval]\ntype = \"eval\"\ninput = \"train\"\ncapacity = 4\n";
  // 8 steps, checkpoints at 4 and 8, an evaluation every 3: the run went on past step 4 and died.
  auto first = run(tiny_config(root / "run", input), root / "run", {"eval.every=3", "eval.batches=1", "eval.sample_tokens=0"});
  REQUIRE(first.last_step == 8);
  fs::remove(root / "run" / "checkpoints" / "step_00000008.ckpt");
  std::ofstream(root / "run" / "metrics.jsonl", std::ios::app) << "{\"step\":9,\"loss\":";  // a kill mid-line
  auto resumed = run("", root / "run", {}, root / "run");
  REQUIRE(resumed.last_step == 8);
  const auto steps = metric_steps(root / "run" / "metrics.jsonl");
  std::vector<std::pair<int64_t, bool>> want;
  for (int64_t s = 1; s <= 8; ++s) {
    want.emplace_back(s, false);
    if (s % 3 == 0 || s == 8) want.emplace_back(s, true);
  }
  auto sorted = steps;  // (an evaluation's line comes when it is done, after later steps' maybe)
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == want);
  // What the first run logged past step 4 is kept aside, the cut line included.
  const auto moved = test_util::read_file(root / "run" / "metrics.superseded.jsonl");
  size_t lines = 0;
  for (char c : moved) lines += c == '\n';
  CHECK(lines == 4 + 2 + 1);  // steps 5-8, the evaluations at 6 and 8, the cut line
  CHECK(contains(moved, "{\"step\":9,\"loss\":\n"));
  CHECK(contains(test_util::read_file(root / "run" / "run.log"),
                 "resuming from step 4: 7 records of metrics.jsonl past it (logged before the run stopped, trained "
                 "again now) moved to metrics.superseded.jsonl"));
  fs::remove_all(root);
}

TEST_CASE("superseding records: lines without a step stay, the rest past the step move, appended; no file, nothing") {
  auto root = temp_dir("supersede_unit");
  CHECK(stages::supersede_metrics_after(root, 3) == 0);  // no metrics.jsonl
  CHECK(!fs::exists(root / "metrics.superseded.jsonl"));
  const std::string slurm = R"({"slurm_job_id":"7","slurm_restart_count":0,"start_step":0,"ranks":2})";
  std::ofstream(root / "metrics.jsonl") << slurm << "\n{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n"
                                        << "{\"step\":2,\"val_loss\":2.5}\n{\"step\":3,\"loss\":1}\nnot json\n";
  std::ofstream(root / "metrics.superseded.jsonl") << "{\"step\":9,\"loss\":0}\n";
  CHECK(stages::supersede_metrics_after(root, 5) == 0);  // nothing past step 5: untouched
  CHECK(stages::supersede_metrics_after(root, 1) == 3);
  CHECK(test_util::read_file(root / "metrics.jsonl") == slurm + "\n{\"step\":1,\"loss\":3}\nnot json\n");
  CHECK(test_util::read_file(root / "metrics.superseded.jsonl") ==
        "{\"step\":9,\"loss\":0}\n{\"step\":2,\"loss\":2}\n{\"step\":2,\"val_loss\":2.5}\n{\"step\":3,\"loss\":1}\n");
  fs::remove_all(root);
}

TEST_CASE("a stop request ends the run with a checkpoint from which it resumes exactly") {
  auto root = temp_dir("stop");
  auto full = run(tiny_config(root / "full", kTextInput), root / "full", {"training.steps=12", "checkpoint.every=0"});
  REQUIRE(full.losses.size() == 12);

  auto stopped = run(tiny_config(root / "s", kTextInput), root / "s", {"training.steps=12", "checkpoint.every=0"}, {},
                     [](graph::Engine& e, stages::RunContext& ctx) {
                       while (ctx.last_step.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
                       e.stop();
                     });
  REQUIRE(stopped.last_step >= 3);
  REQUIRE(stopped.last_step < 12);
  REQUIRE(!stopped.checkpoint.empty());
  auto resumed = run("", root / "s", {}, root / "s");
  CHECK(resumed.last_step == 12);
  auto all = read_losses(root / "s");
  REQUIRE(all.size() == 12);
  CHECK(all == full.losses);
  fs::remove_all(root);
}

TEST_CASE("a weighted mix of datasets trains and resumes exactly") {
  auto root = temp_dir("mix");
  std::string input = kTextInput;
  const std::string plain = "type = \"read_shards\"\n";
  input.replace(input.find(plain), plain.size(),
                plain + "mix = [\"" + kData + "text=3\", \"" + kData + "tokens/../text=1\"]\n");
  CHECK(error_of([&] { check_exact_resume(root, input); }) == "");

  auto bad = error_of([&] { run(tiny_config(root / "b", input), root / "b", {"stages.read.mix=[\"x=0\"]"}); });
  CHECK(contains(bad, "mix"));
  CHECK(contains(bad, "weight > 0"));
  fs::remove_all(root);
}

// What one training step costs on this machine now (tests run side by side, so it varies):
// the slowest logged step of a short plain run, so that a stage made slower than that by a wide
// margin is the limit whatever train costs.
double train_step_ms() {
  auto root = temp_dir("step_ms");
  auto r = run(tiny_config(root / "s", kTextInput), root / "s", {"training.steps=6", "checkpoint.every=0"});
  std::ifstream in(r.dir / "metrics.jsonl");
  std::string line;
  double worst = 0;
  while (std::getline(in, line)) {
    auto k = line.find("\"ms_per_step\":");
    if (k != std::string::npos) worst = std::max(worst, std::stod(line.substr(k + 14)));
  }
  fs::remove_all(root);
  MESSAGE("train step: up to " << worst << " ms");
  return worst;
}

std::string ms_slower_than_train(double at_least) {
  return std::to_string(std::max(at_least, 5.0 * train_step_ms()));
}

// The training graph with a slow stage inserted: the verdict names it.
graph::Verdict verdict_of(const std::string& input, const std::string& extra, std::vector<std::string> overrides = {}) {
  auto root = temp_dir("verdict");
  overrides.push_back("training.steps=16");
  overrides.push_back("checkpoint.every=0");
  auto r = run(tiny_config(root / "v", input) + extra, root / "v", overrides);
  REQUIRE(r.losses.size() == 16);
  graph::Snapshot s = graph::load_run_snapshot(r.dir);
  MESSAGE("[" << s.verdict.kind << "] " << s.verdict.text << " | " << s.verdict.span);
  fs::remove_all(root);
  return s.verdict;
}

TEST_CASE("the verdict on a training graph names a slow stage before h2d") {
  // pack -> slow -> h2d, slow taking five times a training step. Small queues before it: what is
  // in flight when train is done still passes through slow.
  const std::string input =
      "[stages.read]\ntype = \"read_shards\"\n"
      "[stages.tokenize]\ntype = \"tokenize\"\ninput = \"read\"\ncapacity = 1\n"
      "[stages.pack]\ntype = \"pack\"\ninput = \"tokenize\"\ncapacity = 1\n"
      "[stages.slow]\ntype = \"delay\"\ninput = \"pack\"\ncapacity = 2\nms = " + ms_slower_than_train(60) + "\n"
      "[stages.h2d]\ntype = \"h2d\"\ninput = \"slow\"\ncapacity = 2\n";
  graph::Verdict v = verdict_of(input, "");
  CHECK(v.stage == "slow");
  CHECK(v.kind == "stage");
}

TEST_CASE("the verdict on a training graph names a slow sink on train's output") {
  graph::Verdict v = verdict_of(kTextInput, "[stages.slow_sink]\ntype = \"test_sink\"\ninput = \"train\"\ncapacity = 2\nms = " +
                                                ms_slower_than_train(150) + "\n");
  CHECK(v.stage == "slow_sink");
  CHECK(v.kind == "sink");
}

TEST_CASE("autotune moves workers and capacities without changing a single loss") {
  auto root = temp_dir("autotune");
  auto plain = run(tiny_config(root / "a", kTextInput), root / "a", {"training.steps=12"});
  auto tuned = run(tiny_config(root / "b", kTextInput), root / "b",
                   {"training.steps=12", "run.autotune=true", "stages.tokenize.workers=\"auto\"",
                    "stages.tokenize.capacity=\"auto\"", "stages.pack.capacity=\"auto\""});
  REQUIRE(plain.losses.size() == 12);
  CHECK(plain.losses == tuned.losses);
  fs::remove_all(root);
}

TEST_CASE("clear errors: missing dataset, wrong port, unknown stage type, bad model") {
  auto root = temp_dir("errors");
  auto missing = error_of([&] { run(tiny_config(root / "m", kTextInput, "/nonexistent/dataset"), root / "m"); });
  CHECK(contains(missing, "[data] dataset"));
  CHECK(contains(missing, "/nonexistent/dataset"));

  auto port = error_of([&] {
    run(tiny_config(root / "p", kTextInput), root / "p", {"stages.pack.input=read"});  // documents into pack
  });
  CHECK(contains(port, "pack"));
  CHECK(contains(port, "read"));

  auto type = error_of([&] { run(tiny_config(root / "t", kTextInput), root / "t", {"stages.tokenize.type=tokenise"}); });
  CHECK(contains(type, "tokenise"));

  auto seq = error_of([&] { run(tiny_config(root / "q", kTextInput), root / "q", {"training.seq_len=1000"}); });
  CHECK(contains(seq, "seq_len"));
  CHECK(contains(seq, "block_size"));

  auto preset = error_of([&] { run(tiny_config(root / "r", kTextInput), root / "r", {"model.preset=gpt5"}); });
  CHECK(contains(preset, "gpt5"));

  // A text dataset where token shards are expected names the file and the kind found.
  std::string tok_on_text = kTokenInput;
  auto wrong = error_of([&] { run(tiny_config(root / "w", tok_on_text, kData + "text"), root / "w"); });
  CHECK(contains(wrong, "text"));

  // A run directory that already holds checkpoints is not overwritten.
  run(tiny_config(root / "x", kTextInput), root / "x", {"training.steps=1"});
  auto again = error_of([&] { run(tiny_config(root / "x", kTextInput), root / "x", {"training.steps=1"}); });
  CHECK(contains(again, "--resume"));
  fs::remove_all(root);
}

namespace {

// Whether thread `tid` (0: the calling one) runs lowered as base/idle_thread.h lowers: SCHED_IDLE, or nice +19.
bool lowered(pid_t tid) {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  return sched_getscheduler(tid) == SCHED_IDLE || (errno == 0 && nice == 19);
}

// This process's threads: id and name.
std::vector<std::pair<pid_t, std::string>> threads_of_process() {
  std::vector<std::pair<pid_t, std::string>> out;
  for (const auto& e : fs::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    std::getline(comm, name);
    out.emplace_back(static_cast<pid_t>(std::stoi(e.path().filename().string())), name);
  }
  return out;
}

}  // namespace

TEST_CASE("a CPU run's evaluations compute at idle priority; eval's own thread, which takes the engine's locks, does not") {
  auto root = temp_dir("eval_idle");
  const std::string input = kTokenInput + "[stages.eval]\ntype = \"eval\"\ninput = \"train\"\ncapacity = 4\n";
  auto p = plan(tiny_config(root / "run", input, kData + "tokens"), root / "run",
                {"eval.every=2", "eval.batches=1", "eval.sample_tokens=4"});
  std::mutex mu;
  int lines = 0, computing = 0, computing_lowered = 0;
  bool printer_lowered = false;
  // Eval's results are printed from eval's own thread: the one that hands them on to the engine.
  p.ctx->log->set_printer([&](const std::string& line) {
    if (!line.starts_with("eval")) return;
    std::lock_guard<std::mutex> lock(mu);
    ++lines;
    printer_lowered = printer_lowered || lowered(0);
    for (const auto& [tid, name] : threads_of_process())
      if (name == "eval compute") {
        ++computing;
        computing_lowered += lowered(tid);
      }
  });
  auto r = execute(p);
  REQUIRE(r.last_step == 8);
  CHECK(lines == 4);
  CHECK(!printer_lowered);
  CHECK(computing >= 4);  // the thread the evaluations ran on, alive at each line...
  CHECK(computing_lowered == computing);  // ...and lowered
  // Once the run is over, no thread of this process is lowered: the engine's (TBB's workers, which
  // outlive the run) and every other kept their priority.
  for (const auto& [tid, name] : threads_of_process()) CHECK_MESSAGE(!lowered(tid), "thread " << tid << " (" << name << ")");
  fs::remove_all(root);
}

TEST_CASE("a training stage built outside a training run says where it runs") {
  // No run context handed to the stages (EngineOptions::host empty), or something else in its place.
  for (std::any host : {std::any{}, std::any{42}}) {
    graph::GraphSpec g;
    g.add("gen", "synthetic");
    g.add("sink", "test_sink", {"gen"});
    auto what = error_of([&] { graph::Engine(std::move(g), {.host = host}); });
    CHECK(contains(what, "stage 'gen' is a training stage"));
    CHECK(contains(what, "pipeline run"));
  }
}
