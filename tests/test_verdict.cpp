// Tests for the bottleneck verdict (graph/observe/verdict.cpp) and autotune (graph/observe/autotune.cpp) on
// graphs of synthetic stages whose bottleneck is known by construction: a slow middle stage,
// source or sink, a wide stage behind a narrow one, jitter, CPU-bound spin stages, an ordered
// consumer behind parallel workers; the steady-state window, hysteresis, and the rule that a
// blocked source is never "the limit". Timings are chosen with wide margins (the slow stage is
// at least twice as slow as the next one), so a loaded machine changes the numbers, not the
// answer.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "graph/observe/autotune.h"
#include "graph/engine.h"
#include "graph/stage.h"
#include "graph/observe/live_view.h"
#include "graph/observe/percent.h"
#include "graph/observe/prometheus.h"
#include "graph/observe/verdict.h"

using namespace pipeline::graph;
using namespace std::chrono_literals;

namespace {

// Runs the graph with a short steady-state window, and returns its final snapshot.
Snapshot run_graph(GraphSpec g, EngineOptions opts = {}) {
  opts.sample_interval = 2ms;
  opts.report_interval = 100ms;
  if (opts.steady_window == EngineOptions{}.steady_window) opts.steady_window = 1500ms;
  Engine e(std::move(g), opts);
  auto fut = std::async(std::launch::async, [&] { e.run(); });
  if (fut.wait_for(60s) != std::future_status::ready) {
    std::fprintf(stderr, "DEADLOCK: engine did not finish within 60 s\n");
    std::_Exit(3);
  }
  fut.get();
  return e.final_snapshot();
}

Verdict judged(const Snapshot& s) {
  Verdict v = s.verdict;
  MESSAGE("[" << v.kind << "] " << v.text << " | " << v.suggestion << " | " << v.span);
  return v;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A snapshot built by hand: one stage per (name, busy, starved, blocked) over a steady window.
StageStats stage(const std::string& name, double busy, double starved, double blocked, bool source = false,
                 bool sink = false) {
  StageStats x;
  x.name = name;
  x.type = "delay";
  x.source = source;
  x.sink = sink;
  x.wall_s = 10;
  x.busy_s = busy * 10;
  x.starved_s = starved * 10;
  x.blocked_s = blocked * 10;
  x.items_in = x.items_out = 1000;
  x.steady = x.whole_run();
  return x;
}

// An empty snapshot of a 10 s run whose steady state is all of it.
Snapshot ten_steady_seconds() {
  Snapshot s;
  s.t_s = 10;
  s.steady_from_s = 0;
  s.steady_to_s = 10;
  return s;
}

// Passes items through, sleeping 20 ms per item for its first 2 s (a warm-up), 0.2 ms after.
class SlowStart : public Stage {
 public:
  explicit SlowStart(const StageContext&) {}
  void process(Item in, Emitter& out) override {
    auto now = std::chrono::steady_clock::now();
    if (!started_) t0_ = now, started_ = true;
    std::this_thread::sleep_for(now - t0_ < 2s ? 20ms : 200us);
    out.emit_item(std::move(in));
  }

 private:
  bool started_ = false;
  std::chrono::steady_clock::time_point t0_;
};
PIPELINE_STAGE(test_slow_start, {.name = "test_slow_start", .doc = "slow for 2 s, then fast",
                                 .input = any_port(), .output = any_port(),
                                 .factory = make_factory<SlowStart>()});

// A stand-in for train: a first second of 20 ms items that report no device time (building the
// model, kernel selection, a graph's capture), then 2 ms items reported whole as GPU time.
class WarmDevice : public Stage {
 public:
  explicit WarmDevice(const StageContext& ctx) : name_(ctx.name) {}
  void process(Item in, Emitter& out) override {
    auto now = std::chrono::steady_clock::now();
    if (!started_) t0_ = now, started_ = true;
    if (now - t0_ < 1s) {
      std::this_thread::sleep_for(20ms);
    } else {
      std::this_thread::sleep_for(2ms);
      out.add_device_busy(name_, std::chrono::steady_clock::now() - now, /*gpu=*/true);
    }
    out.emit_item(std::move(in));
  }

 private:
  std::string name_;
  bool started_ = false;
  std::chrono::steady_clock::time_point t0_;
};
PIPELINE_STAGE(test_warm_device, {.name = "test_warm_device", .doc = "1 s without device time, then all of it",
                                  .input = any_port(), .output = any_port(),
                                  .factory = make_factory<WarmDevice>()});

}  // namespace

TEST_CASE("a slow middle stage is named, with its rate and what comes after it") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{400});
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 5.0);
  g.add("B", "delay", {"A"}, 1, 8).set("ms", 1.5);
  g.add("sink", "test_sink", {"B"}, 1, 8);
  Verdict v = judged(run_graph(std::move(g)));
  CHECK(v.kind == "stage");
  CHECK(v.stage == "A");
  CHECK(has(v.text, "with 1 worker"));
  CHECK(has(v.text, "it can do "));  // capacity in items/s
  CHECK(has(v.text, "the stages after it could take"));
  CHECK(has(v.span, "steady state"));
  CHECK(has(v.suggestion, "more A workers (workers = 2)"));
}

TEST_CASE("a slow source is named as the limit, and only because it is busy") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{300}).set("ms", 6.0);
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 1.0);
  g.add("sink", "test_sink", {"A"}, 1, 8);
  Snapshot s = run_graph(std::move(g));
  Verdict v = judged(s);
  CHECK(v.kind == "source");
  CHECK(v.stage == "src");
  CHECK(has(v.text, "limited by source src: busy"));
  CHECK(s.stage("src")->steady.busy >= 0.8);
}

TEST_CASE("a slow sink is named as the limit") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{300});
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 1.0);
  g.add("sink", "test_sink", {"A"}, 1, 8).set("ms", 6.0);
  Verdict v = judged(run_graph(std::move(g)));
  CHECK(v.kind == "sink");
  CHECK(v.stage == "sink");
  CHECK(has(v.text, "limited by sink sink"));
}

TEST_CASE("a narrow stage in front of a wide one is the limit, not the wide one with more work per item") {
  // A: 4 ms on 1 worker = 250/s. B: 10 ms on 4 workers = 400/s, so B is busy about 62%.
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{500});
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 4.0);
  g.add("B", "delay", {"A"}, 4, 8).set("ms", 10.0);
  g.add("sink", "test_sink", {"B"}, 1, 8);
  Snapshot s = run_graph(std::move(g));
  Verdict v = judged(s);
  CHECK(v.kind == "stage");
  CHECK(v.stage == "A");
  CHECK(s.stage("B")->steady.busy < s.stage("A")->steady.busy);
}

TEST_CASE("a stage with jitter is named by its mean, not by a lucky moment") {
  // A holds 1 ms + up to 9 ms (5.5 ms on average); B a steady 2 ms.
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{350});
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 1.0).set("jitter_ms", 9.0).set("seed", int64_t{3});
  g.add("B", "delay", {"A"}, 1, 8).set("ms", 2.0);
  g.add("sink", "test_sink", {"B"}, 1, 8);
  Verdict v = judged(run_graph(std::move(g)));
  CHECK(v.kind == "stage");
  CHECK(v.stage == "A");
}

TEST_CASE("CPU-bound: spin stages on every core of the arena are reported as the cores being used up") {
  // One arena thread, two spin stages with three workers each: more workers cannot help.
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{250});
  g.add("S1", "spin", {"src"}, 3, 8).set("ms", 2.0);
  g.add("S2", "spin", {"S1"}, 3, 8).set("ms", 4.0);
  g.add("sink", "test_sink", {"S2"}, 1, 8);
  Snapshot s = run_graph(std::move(g), {.threads = 1});
  Verdict v = judged(s);
  CHECK(s.cores == 1);
  CHECK(v.kind == "cpu");
  CHECK(has(v.text, "CPU-bound: "));
  CHECK(has(v.text, "of 1 core busy"));
  CHECK(has(v.text, "S2 spends the most CPU per item"));
  CHECK(has(v.suggestion, "will not help"));
  CHECK(s.stage("S2")->steady.cpu_ms_per_item > s.stage("S1")->steady.cpu_ms_per_item);
}

TEST_CASE("sleeping stages on every worker are not CPU-bound") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{300});
  g.add("A", "delay", {"src"}, 2, 8).set("ms", 10.0);
  g.add("sink", "test_sink", {"A"}, 1, 8);
  Verdict v = judged(run_graph(std::move(g), {.threads = 1}));
  CHECK(v.kind == "stage");
  CHECK(v.stage == "A");
}

TEST_CASE("an ordered stage behind parallel workers: waiting for the turn of a slow item is order wait, not blocked") {
  // A's items take 1..21 ms at random on 4 workers; the ordered sink is instant but takes them
  // in order, so finished items wait for a slow earlier one and fill its small input queue.
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{500});
  g.add("A", "delay", {"src"}, 4, 8).set("ms", 1.0).set("jitter_ms", 20.0).set("seed", int64_t{5});
  g.add("sink", "test_ordered_sink", {"A"}, 1, 2);
  Snapshot s = run_graph(std::move(g));
  Verdict v = judged(s);
  const StageSpan& a = s.stage("A")->steady;
  MESSAGE("A busy " << a.busy << " order wait " << a.order_wait << " blocked " << a.blocked);
  CHECK(a.order_wait > 0.1);
  CHECK(a.blocked < 0.05);
  CHECK(v.stage == "A");
  CHECK((v.kind == "order" || v.kind == "stage"));
  if (v.kind == "order") CHECK(has(v.suggestion, "larger input queue for sink"));
}

TEST_CASE("a short run is judged over the whole run, and says so") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{40});
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 6.0);
  g.add("sink", "test_sink", {"A"}, 1, 8);
  Verdict v = judged(run_graph(std::move(g)));
  CHECK(v.span == "whole run");
  CHECK(v.stage == "A");
}

TEST_CASE("the steady-state window leaves out a slow start") {
  // B is slow (20 ms per item) for its first 2 s, a warm-up, then fast; A is a steady 4 ms.
  // Over the whole run no stage looks saturated; over the steady state A is the limit.
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{600});
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 4.0);
  g.add("B", "test_slow_start", {"A"}, 1, 8);
  g.add("sink", "test_sink", {"B"}, 1, 8);
  Snapshot s = run_graph(std::move(g), {.steady_window = 1500ms});
  Verdict v = judged(s);
  CHECK(has(v.span, "steady state, 1."));
  CHECK(s.steady_from_s > 1.9);
  CHECK(v.stage == "A");
  CHECK(s.stage("B")->whole_run().busy > s.stage("B")->steady.busy + 0.2);
  Snapshot whole = s;
  whole.steady_from_s = -1;
  Verdict w = analyze(whole);
  MESSAGE("whole run: [" << w.kind << "] " << w.text);
  CHECK(w.span == "whole run");
  CHECK_FALSE((w.kind == "stage" && w.stage == "A"));
}

TEST_CASE("a blocked source is never the limit; the table and the verdict agree") {
  // The input side as the issue saw it: read blocked 88%, tokenize busy 64% waiting for order.
  Snapshot s = ten_steady_seconds();
  s.stages.push_back(stage("read", 0.12, 0.0, 0.88, true));
  s.stages.push_back(stage("tokenize", 0.64, 0.0, 0.0));
  s.stages.back().order_wait_s = 3.6;
  s.stages.back().steady = s.stages.back().whole_run();
  s.stages.push_back(stage("pack", 0.30, 0.70, 0.0));
  s.stages.push_back(stage("sink", 0.05, 0.95, 0.0, false, true));
  Verdict v = analyze(s);
  MESSAGE(v.text);
  CHECK(v.kind != "source");
  CHECK(v.stage != "read");
  CHECK(v.kind == "order");
  CHECK(v.stage == "tokenize");

  // Both cores busy with the CPU stages: the verdict says CPU-bound whatever the busiest is.
  s.cores = 2;
  for (auto& x : s.stages) {
    x.cpu_s = x.busy_s * 2.5;  // tokenize's 1.6 cores, read's 0.3, ...
    x.steady = x.whole_run();
  }
  v = analyze(s);
  MESSAGE(v.text);
  CHECK(v.kind == "cpu");
  CHECK(has(v.text, "of 2 cores busy"));
}

TEST_CASE("the consumer named as waiting on the bottleneck is one that takes its items, not a filtered one") {
  // train feeds log (every step) and eval (no step carries eval work): eval is starved 100% but
  // says nothing about train's pace; log, starved 60%, does.
  Snapshot s = ten_steady_seconds();
  s.stages.push_back(stage("src", 0.1, 0.0, 0.9, true));
  s.stages.push_back(stage("train", 0.99, 0.01, 0.0));
  s.stages.push_back(stage("eval", 0.0, 1.0, 0.0, false, true));
  s.stages.back().items_in = s.stages.back().items_out = 0;
  s.stages.back().steady = s.stages.back().whole_run();
  s.stages.push_back(stage("log", 0.4, 0.6, 0.0, false, true));
  for (const auto& [consumer, producer] :
       std::vector<std::pair<std::string, std::string>>{{"train", "src"}, {"eval", "train"}, {"log", "train"}}) {
    QueueStats q;
    q.consumer = consumer;
    q.producers = {producer};
    q.capacity = 4;
    s.queues.push_back(q);
  }
  Verdict v = analyze(s);
  MESSAGE(v.text);
  CHECK(v.stage == "train");
  CHECK(has(v.text, "log waited for input 60%"));
  CHECK_FALSE(has(v.text, "eval waited"));
}

TEST_CASE("the live verdict does not flicker: a new verdict shows only after it has held") {
  Snapshot a = ten_steady_seconds();
  a.stages.push_back(stage("src", 0.1, 0, 0.9, true));
  a.stages.push_back(stage("X", 0.95, 0.05, 0));
  a.stages.push_back(stage("Y", 0.85, 0.15, 0, false, true));
  Snapshot b = a;
  b.stages[1] = stage("X", 0.84, 0.16, 0);
  b.stages[2] = stage("Y", 0.90, 0.10, 0, false, true);
  REQUIRE(analyze(a).stage == "X");
  REQUIRE(analyze(b).stage == "Y");
  VerdictTracker t(3);
  bool changed = false;
  CHECK(t.update(a, changed).stage == "X");
  CHECK_FALSE(changed);
  // Alternating snapshots: Y never holds for three reports in a row, so X stays.
  for (int i = 0; i < 6; ++i) {
    CHECK(t.update(i % 2 ? a : b, changed).stage == "X");
    CHECK_FALSE(changed);
  }
  // Y holds: it takes over on the third report.
  CHECK(t.update(b, changed).stage == "X");
  CHECK(t.update(b, changed).stage == "X");
  CHECK_FALSE(changed);
  CHECK(t.update(b, changed).stage == "Y");
  CHECK(changed);
}

namespace {

// src -> tok -> train -> log, by hand: train's thread busy `host`, waiting for input `starved`,
// its device busy `device` of the run (GPU events when `gpu`, else the host clock), its input
// queue empty `empty` of the time; tok busy `tok_busy`.
Snapshot device_run(double host, double starved, double device, bool gpu, double empty, double tok_busy = 0.3) {
  Snapshot s = ten_steady_seconds();
  s.stages.push_back(stage("src", 0.1, 0.0, 0.9, true));
  s.stages.push_back(stage("tok", tok_busy, 1.0 - tok_busy, 0.0));
  s.stages.push_back(stage("train", host, starved, 1.0 - host - starved));
  s.stages.back().own_thread = true;
  s.stages.back().device_busy_s = device * 10;
  s.stages.back().device_busy_gpu = gpu;
  s.stages.back().steady = s.stages.back().whole_run();
  s.stages.push_back(stage("log", 0.1, 0.9, 0.0, false, true));
  for (const auto& [consumer, producer] :
       std::vector<std::pair<std::string, std::string>>{{"tok", "src"}, {"train", "tok"}, {"log", "train"}}) {
    QueueStats q;
    q.consumer = consumer;
    q.producers = {producer};
    q.capacity = 4;
    q.empty = q.steady_empty = consumer == "train" ? empty : 0.1;
    s.queues.push_back(q);
  }
  return s;
}

}  // namespace

TEST_CASE("the verdict on a device stage: GPU-bound, by the GPU's time, not its launching thread's") {
  // The thread launches and waits on its full output (log): busy 30%; the GPU is busy 97%.
  Verdict v = analyze(device_run(0.3, 0.02, 0.97, true, 0.0));
  MESSAGE(v.text << " | " << v.suggestion);
  CHECK(v.kind == "device");
  CHECK(v.stage == "train");
  CHECK(has(v.text, "train: GPU busy 97% in forward, backward and step (device events)"));
  CHECK(has(v.suggestion, "the GPU is the limit"));
  // Without the device time, the host rules would have seen no saturated stage.
  Snapshot plain = device_run(0.3, 0.02, 0.97, true, 0.0);
  plain.stages[2].device_busy_s = 0;
  plain.stages[2].steady.device_busy = 0;
  CHECK(analyze(plain).kind == "none");
}

TEST_CASE("the engine's steady state carries the device time: a slow start does not hide a busy GPU") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{1100});
  g.add("train", "test_warm_device", {"src"}, 1, 4);
  g.add("sink", "test_sink", {"train"}, 1, 8);
  Snapshot s = run_graph(std::move(g));
  Verdict v = judged(s);
  const StageStats* t = s.stage("train");
  REQUIRE(t);
  MESSAGE("device share: steady " << t->steady.device_busy << ", whole run " << t->whole_run().device_busy);
  CHECK(t->steady.device_busy > 0.8);
  CHECK(t->whole_run().device_busy < t->steady.device_busy - 0.1);  // the first second counted as idle
  CHECK(v.kind == "device");
  CHECK(v.stage == "train");
  CHECK(has(v.text, "train: GPU busy"));
}

TEST_CASE("the verdict on a device stage judges the steady state's device time, not the start-up's") {
  // Seen on an H200: 150 steps of gpt2 with CUDA graphs, the GPU busy 97% once training ran, but
  // the model's construction, cuDNN's first steps and the capture made the whole run's share 70%,
  // under `saturated`: the host rules then called train "busy 100% with 1 worker".
  Snapshot s = device_run(1.0, 0.0, 0.70, true, 0.0);
  s.stages[2].steady.device_busy = 0.97;
  Verdict v = analyze(s);
  MESSAGE(v.text);
  CHECK(v.kind == "device");
  CHECK(has(v.text, "train: GPU busy 97%"));
  // And the other way: a run whose steady state starves the GPU is not GPU-bound because its
  // start was (an input side that slowed down later).
  Snapshot late = device_run(0.2, 0.75, 0.90, true, 0.9, 0.97);
  late.stages[2].steady.device_busy = 0.18;
  Verdict l = analyze(late);
  MESSAGE(l.text);
  CHECK(l.kind == "stage");
  CHECK(has(l.text, "train waits for input: GPU busy 18%"));
  // No steady window yet: the whole run is all there is.
  Snapshot early = device_run(0.3, 0.02, 0.95, true, 0.0);
  early.steady_from_s = early.steady_to_s = -1;
  early.stages[2].steady = StageSpan{};
  CHECK(analyze(early).kind == "device");
}

TEST_CASE("the verdict on a device stage: launch-bound when the thread is busy and the GPU idles") {
  Verdict v = analyze(device_run(0.95, 0.03, 0.40, true, 0.05));
  MESSAGE(v.text << " | " << v.suggestion);
  CHECK(v.kind == "launch");
  CHECK(v.stage == "train");
  CHECK(has(v.text, "launch-bound: its host thread busy 95% while the GPU is busy 40%"));
  CHECK(has(v.text, "the GPU idles 60%"));
  CHECK(has(v.suggestion, "batch_size"));
  CHECK(has(v.suggestion, "cuda_graph = true"));
}

TEST_CASE("the verdict on a device stage: waiting for input names the input side's bottleneck") {
  // tok saturated upstream: the verdict names it (its kind and stage), and says train waits.
  Verdict v = analyze(device_run(0.2, 0.75, 0.18, true, 0.9, 0.97));
  MESSAGE(v.text << " | " << v.suggestion);
  CHECK(v.kind == "stage");
  CHECK(v.stage == "tok");
  CHECK(has(v.text, "train waits for input: GPU busy 18% (device events), its thread waiting for input 75%, its input queue empty 90%"));
  CHECK(has(v.text, "the input side's limit: tok: busy 97%"));
  CHECK(has(v.suggestion, "more tok workers"));

  // Nothing saturated upstream either: the verdict is train's, waiting for input.
  v = analyze(device_run(0.2, 0.75, 0.18, true, 0.9, 0.5));
  MESSAGE(v.text << " | " << v.suggestion);
  CHECK(v.kind == "input");
  CHECK(v.stage == "train");
  CHECK(has(v.suggestion, "in front of train"));
}

TEST_CASE("the verdict on a device stage on the CPU: the host clock stands in, and no launch-bound") {
  Verdict v = analyze(device_run(0.98, 0.01, 0.93, false, 0.0));
  MESSAGE(v.text << " | " << v.suggestion);
  CHECK(v.kind == "device");
  CHECK(has(v.text, "train: compute busy 93% in forward, backward and step (host clock: a CPU run)"));
  CHECK(has(v.suggestion, "[run] threads"));
  // Busy thread, idle "device" cannot happen with the host clock (the thread is the device):
  // never called launch-bound.
  CHECK(analyze(device_run(0.95, 0.03, 0.40, false, 0.05)).kind != "launch");
  // A device stage that waits on its output (a slow sink) is left to the host rules.
  Snapshot blocked = device_run(0.2, 0.05, 0.18, true, 0.0);
  blocked.stages[3] = stage("log", 0.99, 0.01, 0.0, false, true);
  Verdict b = analyze(blocked);
  CHECK(b.stage == "log");
  CHECK(b.kind == "sink");
}

TEST_CASE("device_busy_gpu survives the JSON round trip") {
  Snapshot s = device_run(0.3, 0.02, 0.97, true, 0.0);
  Snapshot back = snapshot_from_json(to_json(s));
  REQUIRE(back.stage("train"));
  CHECK(back.stage("train")->device_busy_gpu);
  CHECK_FALSE(back.stage("tok")->device_busy_gpu);
  CHECK(analyze(back).kind == "device");
}

// ---- Device waits: a stage asleep on the device is not busy, and the verdict names the stage
// doing the device work, not the one waiting for it.

namespace {

using SteadyClock = std::chrono::steady_clock;

// One item's device work: when it completes, and how long the device spent on it.
struct FakeDeviceStep {
  SteadyClock::time_point done;
  std::chrono::nanoseconds device;
};

// A stand-in for train on a GPU, without one: each item costs `host_ms` of host work to "launch",
// and a "device" runs the items one after another, `device_ms` each. Before item N the thread
// sleeps until item N-2 is done (train's run-ahead) and reports the sleep as device wait.
class FakeGpuStep : public Stage {
 public:
  explicit FakeGpuStep(const StageContext& ctx)
      : host_(to_ns(ctx.options.get_float("host_ms"))), device_(to_ns(ctx.options.get_float("device_ms"))) {}
  void process(Item, Emitter& out) override {
    if (pending_.size() >= 2) {
      const auto t0 = SteadyClock::now();
      std::this_thread::sleep_until(pending_.front());
      pending_.erase(pending_.begin());
      out.add_device_wait(SteadyClock::now() - t0);
    }
    std::this_thread::sleep_for(host_);
    free_at_ = std::max(free_at_, SteadyClock::now()) + device_;
    pending_.push_back(free_at_);
    out.emit(FakeDeviceStep{free_at_, device_});
  }
  static std::chrono::nanoseconds to_ns(double ms) { return std::chrono::nanoseconds(static_cast<int64_t>(ms * 1e6)); }

 private:
  std::chrono::nanoseconds host_, device_;
  SteadyClock::time_point free_at_{};
  std::vector<SteadyClock::time_point> pending_;
};
PIPELINE_STAGE(test_fake_gpu_step,
               {.name = "test_fake_gpu_step", .doc = "train on a pretend GPU: host work, then device work run ahead by 2",
                .input = port<int64_t>("int"), .output = port<FakeDeviceStep>("test_device_step"),
                .options = pipeline::config::Schema("test_fake_gpu_step")
                               .floating("host_ms", 1.0, "host work per item", 0.0, 1e6)
                               .floating("device_ms", 10.0, "device work per item", 0.0, 1e6),
                .own_thread = true, .factory = make_factory<FakeGpuStep>()});

// A stand-in for log: sleeps until each step's device work is done (device wait), then reports
// `timed` of that work as the device stage's GPU time (device events that time only a part).
class FakeStepLog : public Stage {
 public:
  explicit FakeStepLog(const StageContext& ctx)
      : device_stage_(ctx.options.get_string("device_stage")), timed_(ctx.options.get_float("timed")) {}
  void process(Item in, Emitter& out) override {
    const auto& step = in.get<FakeDeviceStep>();
    const auto t0 = SteadyClock::now();
    std::this_thread::sleep_until(step.done);
    out.add_device_wait(SteadyClock::now() - t0);
    if (timed_ > 0)
      out.add_device_busy(device_stage_, std::chrono::nanoseconds(static_cast<int64_t>(timed_ * step.device.count())));
  }

 private:
  std::string device_stage_;
  double timed_;
};
PIPELINE_STAGE(test_fake_step_log,
               {.name = "test_fake_step_log", .doc = "log on a pretend GPU: waits for each step's device work",
                .input = port<FakeDeviceStep>("test_device_step"), .output = no_port(),
                .options = pipeline::config::Schema("test_fake_step_log")
                               .string("device_stage", "gpu", "the stage whose device time this reports")
                               .floating("timed", 1.0, "share of the device work reported as device time", 0.0, 1.0),
                .own_thread = true, .factory = make_factory<FakeStepLog>()});

// src -> gpu (host 1 ms, device 10 ms per item) -> log, for about 3.5 s, as run_graph runs it;
// `live`: the live view's lines (line mode, every report) and the terminal table of the final report.
Snapshot run_fake_gpu(double timed, std::string* live = nullptr) {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{330});
  g.add("gpu", "test_fake_gpu_step", {"src"}, 1, 4);
  g.add("log", "test_fake_step_log", {"gpu"}, 1, 16).set("timed", timed);
  Engine e(std::move(g), {.sample_interval = 2ms, .report_interval = 100ms, .steady_window = 1500ms});
  std::ostringstream lines;
  LiveView view(e, lines, {.mode = LiveViewOptions::Mode::line, .line_interval_s = 0});
  auto fut = std::async(std::launch::async, [&] { e.run(); });
  if (fut.wait_for(60s) != std::future_status::ready) {
    std::fprintf(stderr, "DEADLOCK: engine did not finish within 60 s\n");
    std::_Exit(3);
  }
  fut.get();
  Snapshot s = e.final_snapshot();
  if (live) *live = lines.str() + view.render(s, /*tty=*/true);
  return s;
}

double share_sum(const StageSpan& w) { return w.busy + w.device_wait + w.starved + w.blocked + w.order_wait + w.ready; }

}  // namespace

TEST_CASE("a stage asleep on the device: device wait is a share of its own, not busy time") {
  std::string live;
  Snapshot s = run_fake_gpu(1.0, &live);
  Verdict v = judged(s);
  REQUIRE(s.has_steady());
  for (const char* name : {"gpu", "log"}) {
    const StageStats& x = *s.stage(name);
    MESSAGE(name << ": busy " << x.steady.busy << " device wait " << x.steady.device_wait << " starved "
                 << x.steady.starved << " blocked " << x.steady.blocked << "; whole run busy " << x.busy()
                 << " device wait " << x.device_wait());
    CHECK(x.device_wait_s > 0);
    CHECK(x.steady.busy < 0.4);          // host work: about 1 ms in 10 for gpu, next to nothing for log
    CHECK(x.steady.device_wait > 0.5);   // the rest of its time asleep on the device
    CHECK(x.busy() < 0.5);
    CHECK(share_sum(x.steady) == doctest::Approx(1.0).epsilon(0.02));
    CHECK(share_sum(x.whole_run()) == doctest::Approx(1.0).epsilon(0.02));
    // What it could take counts the wait, which holds its thread as surely as work does.
    CHECK(x.steady.capacity_per_s < 3 * x.steady.in_per_s);
  }
  const StageStats& src = *s.stage("src");
  CHECK(src.device_wait_s == 0);
  // The device (timed whole) is saturated: rule 6 names gpu, with its thread's split.
  CHECK(v.kind == "device");
  CHECK(v.stage == "gpu");
  CHECK(has(v.text, "gpu: GPU busy"));
  CHECK(has(v.text, "waiting for the device"));

  // The live view's lines and table, and the summary table, show the wait beside the busy share.
  MESSAGE(live);
  // A line: "... log 100/s 0% +100% device wait (q 0.8/16); ...".
  CHECK(std::regex_search(live, std::regex(R"( log [0-9]+/s [0-9]+% \+[0-9]+% device wait )")));
  CHECK(has(live, "dev wait"));         // the terminal table's column
  std::ostringstream table;
  print_summary(table, s, v);
  MESSAGE(table.str());
  CHECK(has(table.str(), "dev wait"));
  const std::string log_row = table.str().substr(table.str().find("\nlog "));
  CHECK(has(log_row.substr(0, log_row.find('\n', 1)), pct(s.stage("log")->steady.device_wait)));

  // stats.jsonl carries it, and reads back the same.
  Snapshot back = snapshot_from_json(to_json(s));
  CHECK(back.stage("log")->device_wait_s == doctest::Approx(s.stage("log")->device_wait_s).epsilon(1e-4));
  CHECK(back.stage("log")->busy_s == doctest::Approx(s.stage("log")->busy_s).epsilon(1e-4));
  CHECK(back.stage("log")->steady.device_wait == doctest::Approx(s.stage("log")->steady.device_wait).epsilon(1e-4));
}

TEST_CASE("a stage asleep on the device is not named for being busy: the stage doing the device work is") {
  // The device events time half of each step's device work: the device share reads about 50%,
  // under `saturated`, and log sleeps nearly all its time waiting for steps. Counted as busy, the
  // wait made log "the limit" (a sink busy 99%); the device's work is.
  Snapshot s = run_fake_gpu(0.5);
  Verdict v = judged(s);
  CHECK(s.stage("gpu")->steady.device_busy < 0.8);
  CHECK(s.stage("log")->steady.busy < 0.5);
  CHECK(v.kind == "device");
  CHECK(v.stage == "gpu");
  CHECK(has(v.text, "gpu: the device's work is the limit: "));
  CHECK(has(v.text, "device wait"));
  CHECK_FALSE(has(v.text, "limited by sink"));
}

namespace {

// A stage of a hand-built snapshot that also sleeps on the device `wait` of its time.
StageStats waiting_stage(const std::string& name, double busy, double wait, double starved, double blocked,
                         bool sink = false) {
  StageStats x = stage(name, busy, starved, blocked, false, sink);
  x.own_thread = true;
  x.device_wait_s = wait * 10;
  x.steady = x.whole_run();
  return x;
}

// device_run's graph with `train` and `log` in place of its own, and eval after train too: train's
// device busy `device` (GPU events); train's and tok's input queues full 90% of the time.
Snapshot waiting_run(const StageStats& train, const StageStats& log, const StageStats& eval, double device) {
  Snapshot s = device_run(0.0, 0.0, device, device > 0, 0.0);
  const StageStats measured = s.stages[2];
  s.stages[2] = train;
  s.stages[2].device_busy_s = measured.device_busy_s;
  s.stages[2].device_busy_gpu = measured.device_busy_gpu;
  s.stages[2].steady = s.stages[2].whole_run();
  s.stages[3] = log;
  s.stages.push_back(eval);
  s.queues.push_back(s.queues.back());
  s.queues.back().consumer = "eval";
  for (auto& q : s.queues) q.full = q.steady_full = q.consumer == "train" || q.consumer == "tok" ? 0.9 : 0.1;
  return s;
}

}  // namespace

TEST_CASE("the device-wait rule by hand: who waits, and whose device work it waits for") {
  // log sleeps 95% of its time on train's steps; train's thread works 20% and sleeps 75% (run-ahead);
  // the device events see 60% (the rest of the device's work is untimed).
  const StageStats train = waiting_stage("train", 0.2, 0.75, 0.02, 0.03);
  const StageStats log = waiting_stage("log", 0.02, 0.95, 0.03, 0.0, true);
  const StageStats eval = waiting_stage("eval", 0.0, 0.0, 1.0, 0.0, true);
  Verdict v = analyze(waiting_run(train, log, eval, 0.6));
  MESSAGE(v.text << " | " << v.suggestion);
  CHECK(v.kind == "device");
  CHECK(v.stage == "train");
  CHECK(has(v.text, "train: the device's work is the limit: log waits for it, busy 2% + device wait 95% with 1 worker"));
  CHECK(has(v.text, "train's thread busy 20% + device wait 75%"));
  CHECK(has(v.text, "GPU busy 60% in forward, backward and step (device events"));

  // The shares of format 1 (busy included the wait) would have named log, busy 97%: the rule the
  // device-wait split replaces.
  StageStats old_log = stage("log", 0.97, 0.03, 0.0, false, true);
  old_log.own_thread = true;
  CHECK(analyze(waiting_run(train, old_log, eval, 0.6)).stage == "log");

  // No stage's device time measured: the waiting stage itself, asleep on the device.
  v = analyze(waiting_run(waiting_stage("train", 0.2, 0.3, 0.02, 0.48), log, eval, 0.0));
  MESSAGE(v.text);
  CHECK(v.stage == "log");
  CHECK(v.kind == "sink");
  CHECK(has(v.text, "log: busy 2% + device wait 95% with 1 worker, asleep on the device"));

  // eval sleeps on device work of its own (its forward passes) and train waits on its full queue:
  // eval is named, not train, whose device is mostly idle.
  const StageStats blocked = waiting_stage("train", 0.1, 0.05, 0.02, 0.83);
  const StageStats slow_eval = waiting_stage("eval", 0.05, 0.9, 0.05, 0.0, true);
  v = analyze(waiting_run(blocked, waiting_stage("log", 0.02, 0.1, 0.88, 0.0, true), slow_eval, 0.15));
  MESSAGE(v.text);
  CHECK(v.stage == "eval");

  // A stage busy with host work beyond the waiting one's occupancy keeps its verdict.
  Snapshot busy_tok = waiting_run(train, waiting_stage("log", 0.02, 0.82, 0.16, 0.0, true), eval, 0.6);
  busy_tok.stages[1] = stage("tok", 0.97, 0.0, 0.03);
  v = analyze(busy_tok);
  CHECK(v.stage == "tok");
  CHECK(v.kind == "stage");
}

TEST_CASE("stats files of format 1 (busy included the device wait) read back with the wait apart") {
  Snapshot s = ten_steady_seconds();
  s.stages.push_back(waiting_stage("log", 0.1, 0.8, 0.1, 0.0, true));
  std::string json = to_json(s);
  // What the previous version wrote: no stats_format, busy_s the invocations' whole time, no
  // device-wait shares.
  const auto erase = [&](const std::string& key) {
    const auto at = json.find(",\"" + key + "\":");
    REQUIRE(at != std::string::npos);
    json.erase(at, json.find_first_of(",}", at + 1) - at);
  };
  erase("stats_format");
  erase("window_device_wait");
  erase("device_wait");  // the whole run's share (the first after device_wait_s)
  erase("device_wait");  // the steady state's
  const auto replace_value = [&](size_t from, const std::string& key, const std::string& value) {
    const auto at = json.find("\"" + key + "\":", from);
    REQUIRE(at != std::string::npos);
    const auto v = at + key.size() + 3;
    json.replace(v, json.find_first_of(",}", v) - v, value);
  };
  replace_value(0, "busy_s", "9");
  replace_value(json.find("\"steady\":"), "busy", "0.9");
  Snapshot back = snapshot_from_json(json);
  const StageStats& x = *back.stage("log");
  CHECK(x.busy_s == doctest::Approx(1.0));  // 9 s in invocations, 8 s of them asleep on the device
  CHECK(x.device_wait_s == doctest::Approx(8.0));
  CHECK(x.busy() == doctest::Approx(0.1));
  CHECK(x.device_wait() == doctest::Approx(0.8));
  // Its steady state recorded no wait of its own: read as written, the wait inside busy.
  CHECK(x.steady.busy == doctest::Approx(0.9));
  CHECK(x.steady.device_wait == 0);
  // A current file keeps its numbers as written.
  Snapshot now = snapshot_from_json(to_json(s));
  CHECK(now.stage("log")->busy_s == doctest::Approx(1.0));
  CHECK(now.stage("log")->steady.device_wait == doctest::Approx(0.8));
}

// ---- Side stages (StageType::side: the fetch stage): beside the graph, reporting their own work.

namespace {

// Works beside the graph at a fixed share of its 4 workers' time, with figures of its own.
class TestSide : public Stage {
 public:
  explicit TestSide(const StageContext& ctx)
      : share_(ctx.options.get_float("share")), t0_(std::chrono::steady_clock::now()) {}
  SideReport side_report() override {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    SideReport r;
    r.workers = 4;
    r.busy_s = share_ * 4 * t;
    r.items = static_cast<uint64_t>(100 * t);
    r.figures = {{"bytes_per_s", 41.2e6}, {"in_flight", 4}, {"hit_rate", 0.97}, {"cache_bytes", 1.5e9}};
    r.note = "41.2 MB/s from s3://bucket/prefix";
    r.suggestion = "more connections";
    r.knobs = {{"connections", connections_.load()}, {"prefetch", 16}};
    return r;
  }
  void side_tune(const std::string& knob, int value) override {
    if (knob == "connections") connections_ = value;
    tuned_.fetch_add(1);
  }
  static inline std::atomic<int> tuned_{0};

 private:
  std::atomic<int> connections_{4};
  double share_;
  std::chrono::steady_clock::time_point t0_;
};
PIPELINE_STAGE(test_side, {.name = "test_side", .doc = "beside the graph: busy a share of its time",
                           .input = no_port(), .output = no_port(),
                           .options = pipeline::config::Schema().floating("share", 0.95, "busy share", 0.0, 1.0),
                           .max_workers = 1, .side = true, .factory = make_factory<TestSide>()});

}  // namespace

TEST_CASE("a side stage runs beside the graph: it holds no run up, and its figures reach the stats") {
  GraphSpec g;
  g.add("side", "test_side").set("share", 0.3);
  g.add("src", "test_source").set("count", int64_t{300});
  g.add("A", "delay", {"src"}, 1, 8).set("ms", 5.0);
  g.add("sink", "test_sink", {"A"}, 1, 8);
  Engine e(std::move(g), {.sample_interval = 2ms, .report_interval = 100ms, .steady_window = 1500ms});
  std::ostringstream lines;
  LiveView view(e, lines, {.mode = LiveViewOptions::Mode::line, .line_interval_s = 0});
  auto fut = std::async(std::launch::async, [&] { e.run(); });
  REQUIRE(fut.wait_for(60s) == std::future_status::ready);  // it ends: nothing waits for the side stage
  fut.get();
  const Snapshot s = e.final_snapshot();
  const StageStats* side = s.stage("side");
  REQUIRE(side);
  CHECK(side->side);
  CHECK_FALSE(side->source);
  CHECK_FALSE(side->sink);
  CHECK(side->workers == 4);
  CHECK(side->busy() == doctest::Approx(0.3).epsilon(0.15));
  CHECK(side->items_in > 0);
  CHECK(side->figure("bytes_per_s") == doctest::Approx(41.2e6));
  CHECK(s.has_steady());  // a side stage takes no input: the steady state does not wait for it
  const Verdict v = judged(s);
  CHECK(v.stage == "A");  // at 30% it is not the limit
  // The figures survive stats.jsonl, and print in words.
  const Snapshot back = snapshot_from_json(to_json(s));
  REQUIRE(back.stage("side"));
  CHECK(back.stage("side")->side);
  CHECK(back.stage("side")->figure("hit_rate") == doctest::Approx(0.97));
  CHECK(figures_text(*back.stage("side")) == "41.2 MB/s, 4 in flight, hit rate 97%, cache 1.5 GB");
  std::ostringstream table;
  print_summary(table, s, v);
  CHECK(has(table.str(), "side (beside the graph): 41.2 MB/s"));
  CHECK(has(lines.str(), "side"));
  CHECK(has(view.render(s, false), "(41.2 MB/s, 4 in flight, hit rate 97%, cache 1.5 GB)"));
  CHECK(has(view.render(s, true), "41.2 MB/s"));
  CHECK(has(prometheus_text(s), "pipeline_stage_figure{stage=\"side\",rank=\"0\",figure=\"bytes_per_s\"} 41200000"));
}

TEST_CASE("a saturated side stage is the limit, not the reader it holds up: train waits for input, fetch named") {
  // The reader blocked on the network looks busy; the side stage's connections are saturated.
  Snapshot s = device_run(0.2, 0.75, 0.18, true, 0.9, 0.3);
  s.stages[0] = stage("src", 0.99, 0.0, 0.01, true);
  StageStats fetch = stage("fetch", 0.95, 0.05, 0.0);
  fetch.side = true;
  fetch.workers = 8;
  fetch.busy_s = 0.95 * 10 * 8;
  fetch.starved_s = 0.05 * 10 * 8;
  fetch.blocked_s = 0;
  fetch.steady = fetch.whole_run();
  fetch.note = "41.2 MB/s from s3://bucket/prefix";
  fetch.suggestion = "the network is the limit: more connections";
  fetch.figures = {{"bytes_per_s", 41.2e6}};
  s.stages.insert(s.stages.begin(), fetch);
  const Verdict v = analyze(s);
  MESSAGE(v.text << " | " << v.suggestion);
  CHECK(v.kind == "side");
  CHECK(v.stage == "fetch");
  CHECK(has(v.text, "train waits for input"));
  CHECK(has(v.text, "the input side's limit: fetch: 95% of its 8 workers' time at work, 41.2 MB/s from s3://bucket/prefix"));
  CHECK(has(v.suggestion, "more connections"));
  // Not saturated: the reader is named as before.
  s.stages[0].busy_s = 0.4 * 10 * 8;
  s.stages[0].steady = s.stages[0].whole_run();
  CHECK(analyze(s).stage == "src");
}

TEST_CASE("autotune moves a saturated side stage's knobs, and undoes what does not help") {
  TestSide::tuned_ = 0;
  GraphSpec g;
  g.add("side", "test_side", {}, 0).set("share", 0.97);  // workers "auto": tuned
  g.add("src", "test_source").set("count", int64_t{1200}).set("ms", 5.0);
  g.add("sink", "test_sink", {"src"}, 1, 8);
  EngineOptions opts;
  opts.sample_interval = 2ms;
  opts.report_interval = 100ms;
  opts.steady_window = 1000ms;
  Engine e(std::move(g), opts);
  auto fut = std::async(std::launch::async, [&] { e.run(); });
  REQUIRE(fut.wait_for(60s) == std::future_status::ready);
  fut.get();
  std::string log;
  for (const auto& ev : e.events()) log += ev.text + "\n";
  MESSAGE(log);
  CHECK(has(log, "side connections 4 -> 8"));
  CHECK(TestSide::tuned_.load() >= 1);
  // The side stage's work does not feed the sink: more connections cannot raise its rate.
  CHECK(has(log, "undid side connections"));
}
