// Tests for the engine (graph/): bounds, order, overlap, bottleneck verdict, failure, stop,
// own-thread stages, fan-out, run-directory files and config errors, with synthetic stages.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <regex>
#include <sstream>
#include <thread>

#include "base/config.h"
#include "graph/engine.h"
#include "base/json.h"
#include "graph/observe/live_view.h"
#include "graph/stage.h"
#include "test_util.h"

using namespace pipeline;
using namespace pipeline::graph;
using namespace std::chrono_literals;

namespace {

// Runs f on another thread; a deadlock fails the whole test binary instead of hanging CTest.
template <class F>
void with_timeout(F f, int seconds = 20) {
  auto fut = std::async(std::launch::async, std::move(f));
  if (fut.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "DEADLOCK: engine did not finish within %d s\n", seconds);
    std::fflush(stderr);
    std::_Exit(3);
  }
  fut.get();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A payload that counts live instances: memory bounded by the queues' capacities.
struct Tracked {
  static inline std::atomic<int> live{0}, peak{0};
  int64_t v = 0;
  explicit Tracked(int64_t x) : v(x) { up(); }
  Tracked(const Tracked& o) : v(o.v) { up(); }
  Tracked(Tracked&& o) noexcept : v(o.v) { up(); }
  ~Tracked() { live.fetch_sub(1); }
  static void up() {
    int n = live.fetch_add(1) + 1;
    int p = peak.load();
    while (n > p && !peak.compare_exchange_weak(p, n)) {
    }
  }
};

class TrackedSource : public Stage {
 public:
  explicit TrackedSource(const StageContext& ctx) : n_(ctx.options.get_int("count")) {}
  bool produce(Emitter& out) override {
    if (i_ >= n_) return false;
    out.emit(Tracked(i_++));
    return true;
  }

 private:
  int64_t n_, i_ = 0;
};
PIPELINE_STAGE(test_tracked_source, {.name = "test_tracked_source", .doc = "source of Tracked payloads",
                                     .input = no_port(), .output = port<Tracked>("tracked"),
                                     .options = config::Schema().integer("count", 100, "items"),
                                     .factory = make_factory<TrackedSource>()});

// Fails on the item whose value is `at`.
class Fail : public Stage {
 public:
  explicit Fail(const StageContext& ctx) : at_(ctx.options.get_int("at")) {}
  void process(Item in, Emitter& out) override {
    if (in.get<int64_t>() == at_) throw std::runtime_error("boom at " + std::to_string(at_));
    out.emit_item(std::move(in));
  }

 private:
  int64_t at_;
};
PIPELINE_STAGE(test_fail, {.name = "test_fail", .doc = "throws on one item", .input = port<int64_t>("int"),
                           .output = port<int64_t>("int"), .options = config::Schema().integer("at", 10, "value"),
                           .factory = make_factory<Fail>()});

// 1 -> 3: v becomes 3v, 3v+1, 3v+2 (so ordered output is still consecutive integers).
class Expand : public Stage {
 public:
  explicit Expand(const StageContext&) {}
  void process(Item in, Emitter& out) override {
    int64_t v = in.get<int64_t>();
    for (int k = 0; k < 3; ++k) {
      if ((v + k) % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));  // scramble timing
      out.emit<int64_t>(3 * v + k);
    }
  }
};
PIPELINE_STAGE(test_expand, {.name = "test_expand", .doc = "1 -> 3 items", .input = port<int64_t>("int"),
                             .output = port<int64_t>("int"), .factory = make_factory<Expand>()});

// Sums groups of `n` integers, flushing the partial group at end of stream (like pack).
class Group : public Stage {
 public:
  explicit Group(const StageContext& ctx) : n_(ctx.options.get_int("n")) {}
  void process(Item in, Emitter& out) override {
    sum_ += in.get<int64_t>();
    if (++k_ == n_) flush(out);
  }
  void finalize(Emitter& out) override {
    if (k_) flush(out);
  }

 private:
  void flush(Emitter& out) {
    out.emit<int64_t>(sum_);
    sum_ = k_ = 0;
  }
  int64_t n_, sum_ = 0, k_ = 0;
};
PIPELINE_STAGE(test_group, {.name = "test_group", .doc = "sums groups", .input = port<int64_t>("int"),
                            .output = port<int64_t>("int"), .options = config::Schema().integer("n", 4, "group"),
                            .max_workers = 1, .factory = make_factory<Group>()});

// Collects every integer it sees (thread-safe), for assertions.
struct Collected {
  std::mutex mu;
  std::vector<int64_t> values;
  std::set<std::thread::id> threads;
  std::thread::id init_thread, final_thread;
};
std::map<std::string, std::shared_ptr<Collected>>& collectors() {
  static std::map<std::string, std::shared_ptr<Collected>> m;
  return m;
}
class Collect : public Stage {
 public:
  explicit Collect(const StageContext& ctx) : c_(collectors()[ctx.name] = std::make_shared<Collected>()) {}
  void initialize() override { c_->init_thread = std::this_thread::get_id(); }
  void process(Item in, Emitter&) override {
    std::lock_guard lock(c_->mu);
    c_->values.push_back(in.get<int64_t>());
    c_->threads.insert(std::this_thread::get_id());
  }
  void finalize(Emitter&) override { c_->final_thread = std::this_thread::get_id(); }

 private:
  std::shared_ptr<Collected> c_;
};
PIPELINE_STAGE(test_collect, {.name = "test_collect", .doc = "collects integers", .input = port<int64_t>("int"),
                              .output = no_port(), .factory = make_factory<Collect>()});
PIPELINE_STAGE(test_device_collect, {.name = "test_device_collect", .doc = "collects on its own thread",
                                     .input = port<int64_t>("int"), .output = no_port(), .own_thread = true,
                                     .factory = make_factory<Collect>()});

class StringSink : public Stage {
 public:
  explicit StringSink(const StageContext&) {}
};
PIPELINE_STAGE(test_string_sink, {.name = "test_string_sink", .doc = "takes text", .input = port<std::string>("text"),
                                  .output = no_port(), .factory = make_factory<StringSink>()});

GraphSpec chain(int64_t count, std::vector<double> delays_ms, int workers = 1, int capacity = 4) {
  GraphSpec g;
  g.add("src", "test_source").set("count", count);
  std::string prev = "src";
  for (size_t i = 0; i < delays_ms.size(); ++i) {
    std::string name = "s" + std::to_string(i + 1);
    g.add(name, "delay", {prev}, workers, capacity).set("ms", delays_ms[i]);
    prev = name;
  }
  g.add("sink", "test_sink", {prev}, 1, capacity);
  return g;
}

std::string config_error(const std::string& toml) {
  try {
    auto doc = config::Document::parse(toml, "t.toml");
    Engine e(GraphSpec::from_config(doc));
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("a chain drains at end of input and counts every item") {
  Engine e(chain(500, {0.0, 0.0}), {.stats = true});
  with_timeout([&] { e.run(); });
  Snapshot s = e.snapshot();
  REQUIRE(s.stages.size() == 4);
  CHECK(s.stage("src")->items_out == 500);
  CHECK(s.stage("s1")->items_in == 500);
  CHECK(s.stage("s2")->items_out == 500);
  CHECK(s.stage("sink")->items_in == 500);
}

TEST_CASE("no queue exceeds its capacity; a slow consumer stalls its producers; memory stays bounded") {
  Tracked::peak = 0;
  GraphSpec g;
  g.add("src", "test_tracked_source").set("count", int64_t{300});
  g.add("fast", "delay", {"src"}, 4, 3).set("ms", 0.0);
  g.add("slow", "test_sink", {"fast"}, 1, 2).set("ms", 1.0);
  g.add("tap", "delay", {"src"}, 1, 5).set("ms", 0.0);  // fan-out: src feeds two queues
  g.add("tap_sink", "test_sink", {"tap"}, 1, 1);
  Engine e(std::move(g), {.sample_interval = 1ms});
  with_timeout([&] { e.run(); });
  Snapshot s = e.snapshot();
  for (const auto& q : s.queues) {
    INFO("queue of " << q.consumer);
    CHECK(q.high_water <= q.capacity);
    CHECK(q.max_sampled <= q.capacity);
    CHECK(q.high_water >= 1);
  }
  CHECK(s.queue_of("slow")->high_water == 2);                       // it did fill up
  CHECK(s.stage("fast")->blocked() > 0.3);                          // and its producer waited
  CHECK(s.stage("slow")->items_in == 300);                          // nothing dropped
  CHECK(s.stage("tap_sink")->items_in == 300);                      // every consumer gets every item
  // Payloads alive at once: queues (3 + 2 + 5 + 1) + one per worker (1 + 4 + 1 + 1 + 1) + the
  // item being emitted; far below the 300 produced.
  CHECK(Tracked::peak.load() <= 11 + 8 + 2);
  CHECK(Tracked::live.load() == 0);
}

TEST_CASE("order is restored before an ordered stage whatever the worker counts") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{300});
  g.add("jitter", "delay", {"src"}, 8, 4).set("ms", 0.0).set("jitter_ms", 2.0);
  g.add("expand", "test_expand", {"jitter"}, 3, 4);
  g.add("check", "test_ordered_sink", {"expand"}, 1, 4);  // throws on the first out-of-order item
  Engine e(std::move(g));
  with_timeout([&] { e.run(); });
  CHECK(e.snapshot().stage("check")->items_in == 900);
}

TEST_CASE("a stage may emit at end of stream (finalize) and emits are sequenced") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{10});
  g.add("group", "test_group", {"src"}).set("n", int64_t{4});
  g.add("out", "test_collect", {"group"});
  Engine e(std::move(g));
  with_timeout([&] { e.run(); });
  auto c = collectors()["out"];
  CHECK(c->values == std::vector<int64_t>{0 + 1 + 2 + 3, 4 + 5 + 6 + 7, 8 + 9});
}

TEST_CASE("an own-thread stage runs initialize, process and finalize on one dedicated thread") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{50});
  g.add("dev", "test_device_collect", {"src"}, 1, 2);
  Engine e(std::move(g));
  with_timeout([&] { e.run(); });
  auto c = collectors()["dev"];
  CHECK(c->values.size() == 50);
  REQUIRE(c->threads.size() == 1);
  CHECK(*c->threads.begin() == c->init_thread);
  CHECK(c->final_thread == c->init_thread);
  CHECK(c->init_thread != std::this_thread::get_id());
  // workers > 1 is rejected for own-thread stages
  GraphSpec bad;
  bad.add("src", "test_source");
  bad.add("dev", "test_device_collect", {"src"}, 2);
  CHECK_THROWS_WITH_AS(Engine(std::move(bad)), doctest::Contains("at most 1 (it owns a thread)"), config::ConfigError);
}

TEST_CASE("three stages overlap: time per item is about max(a, b, c), not a + b + c") {
  const int n = 60;
  Engine e(chain(n, {4.0, 8.0, 4.0}, 1, 4));
  auto t0 = std::chrono::steady_clock::now();
  with_timeout([&] { e.run(); });
  double wall = seconds_since(t0);
  double per_item_ms = 1000 * wall / n;
  Snapshot s = e.snapshot();
  double busy = s.stage("s1")->busy_s + s.stage("s2")->busy_s + s.stage("s3")->busy_s;
  MESSAGE("overlap: " << per_item_ms << " ms/item (max 8, sum 16); stages busy " << busy / wall << "x the wall time");
  CHECK(per_item_ms >= 7.5);  // cannot beat the slowest stage
  // The property itself, robust to a loaded machine (where every sleep oversleeps): the three
  // stages were busy at the same time. Serial execution gives at most 1x; ideal overlap 2x.
  CHECK(busy / wall > 1.4);
}

TEST_CASE("the verdict names the slow stage, and moves when it gets more workers") {
  auto verdict = [](int a_workers) {
    GraphSpec g;
    // B can do 250/s; A 167/s with one worker, 667/s with four. Long enough (1.2 s to 2.4 s) for
    // a steady state on a machine busy with other tests.
    g.add("src", "test_source").set("count", int64_t{300});
    g.add("A", "delay", {"src"}, a_workers, 8).set("ms", 6.0);
    g.add("B", "delay", {"A"}, 1, 8).set("ms", 4.0);
    g.add("sink", "test_sink", {"B"}, 1, 8);
    Engine e(std::move(g), {.sample_interval = 2ms});
    with_timeout([&] { e.run(); });
    return analyze(e.snapshot());
  };
  Verdict v1 = verdict(1);
  MESSAGE(v1.text << " / " << v1.suggestion);
  CHECK(v1.stage == "A");
  CHECK(v1.kind == "stage");
  CHECK(v1.text.find("A: busy") == 0);
  CHECK(v1.text.find("with 1 worker") != std::string::npos);
  CHECK(v1.text.find("B waited for input") != std::string::npos);
  CHECK(v1.suggestion.find("more A workers (workers = 2)") != std::string::npos);
  Verdict v4 = verdict(4);
  MESSAGE(v4.text);
  CHECK(v4.stage == "B");
}

TEST_CASE("an exception in a middle stage stops the graph and names the stage") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{100000});
  g.add("mid", "test_fail", {"src"}, 3, 1).set("at", int64_t{500});
  g.add("slow", "test_sink", {"mid"}, 1, 1).set("ms", 0.05);
  g.add("dev", "test_device_collect", {"src"}, 1, 1);
  Engine e(std::move(g));
  with_timeout([&] {
    try {
      e.run();
      FAIL("run() should have thrown");
    } catch (const StageError& err) {
      CHECK(err.stage() == "mid");
      CHECK(std::string(err.what()).find("stage 'mid': boom at 500") != std::string::npos);
    }
  });
  CHECK(e.snapshot().stage("src")->items_out < 100000);
}

TEST_CASE("stop() ends an endless source and returns; discard stages drop what is queued") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{1} << 40);
  g.add("work", "delay", {"src"}, 2, 4).set("ms", 1.0);
  g.add("sink", "test_sink", {"work"});
  Engine e(std::move(g));
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    e.stop();
  });
  with_timeout([&] { e.run(); }, 10);
  stopper.join();
  Snapshot s = e.snapshot();
  CHECK(s.status == "stopped");
  CHECK(s.stage("sink")->items_in > 10);
  CHECK(s.stage("sink")->items_in == s.stage("src")->items_out);  // in-flight items finished

  // When draining takes longer than stop_grace (100 queued items x 50 ms), the engine aborts.
  GraphSpec g2;
  g2.add("src", "test_source").set("count", int64_t{1} << 40);
  g2.add("slow", "delay", {"src"}, 1, 100).set("ms", 50.0);
  g2.add("sink", "test_sink", {"slow"});
  Engine e2(std::move(g2), {.stop_grace = 200ms});
  std::thread stopper2([&] {
    std::this_thread::sleep_for(100ms);
    e2.stop();
  });
  auto t0 = std::chrono::steady_clock::now();
  with_timeout([&] { e2.run(); }, 10);
  stopper2.join();
  CHECK(seconds_since(t0) < 3.0);  // draining would take 5 s
  CHECK(e2.snapshot().status == "aborted");
}

TEST_CASE("stats files: stats.jsonl, stats_summary.json and a Chrome trace") {
  auto dir = std::filesystem::temp_directory_path() / ("pipeline_test_graph_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    Engine e(chain(200, {1.0, 0.5}, 1, 4), {.report_interval = 50ms, .run_dir = dir, .trace_events_per_worker = 50});
    std::ostringstream live;
    LiveView view(e, live, {.mode = LiveViewOptions::Mode::line, .line_interval_s = 0});
    std::ostringstream sparse;  // a line at most every 1e9 s: the first report and the final one
    LiveView quiet(e, sparse, {.mode = LiveViewOptions::Mode::line, .line_interval_s = 1e9});
    with_timeout([&] { e.run(); });
    CHECK(live.str().find("bottleneck") != std::string::npos);
    auto lines = [](const std::string& t) { return std::count(t.begin(), t.end(), '\n'); };
    CHECK(lines(live.str()) > 2);
    // Reports only: an event (the verdict changing, which a loaded machine can make happen) is a
    // line of its own, "[   t.ts] kind: text", whenever it happens; a report names stages instead.
    auto reports = [](const std::string& t) {
      const std::regex event(R"(^\[ *[0-9.]+s\] [a-z_]+: )");
      std::istringstream in(t);
      int n = 0;
      for (std::string l; std::getline(in, l);) n += !std::regex_search(l, event);
      return n;
    };
    CHECK(reports(sparse.str()) == 2);
    CHECK(sparse.str().find("bottleneck") != std::string::npos);
  }
  for (const char* f : {"stats.jsonl", "stats_summary.json", "trace.json"}) {
    INFO(f);
    CHECK(std::filesystem::exists(dir / f));
  }
  Snapshot s = load_run_snapshot(dir);
  CHECK(s.finished);
  CHECK(s.status == "done");
  CHECK(s.stage("sink")->items_in == 200);
  auto series = load_run_series(dir);
  CHECK(series.size() >= 2);
  std::string svg = occupancy_svg(series);
  CHECK(svg.find("<svg") == 0);
  CHECK(svg.find("polyline") != std::string::npos);
  std::ifstream tin(dir / "trace.json");
  std::stringstream ts;
  ts << tin.rdbuf();
  pipeline::JsonValue trace = pipeline::json_parse(ts.str());
  size_t spans = 0;
  for (const auto& ev : trace.array("traceEvents")) spans += ev.string("ph") == "X";
  CHECK(spans > 0);
  CHECK(spans <= 4 * 50 + 4 * 50);  // capped per worker (busy + blocked share the budget)
  std::filesystem::remove_all(dir);
}

TEST_CASE("graph build errors name the stages and keys") {
  CHECK(config_error("[stages.a]\ntype = \"tset_source\"\n").find("unknown stage type 'tset_source'; known types:") !=
        std::string::npos);
  CHECK(config_error("[stages.a]\ntype = \"tset_source\"\n").find("t.toml:2: [stages.a] type:") != std::string::npos);
  std::string mismatch = config_error(
      "[stages.src]\ntype = \"test_source\"\n[stages.d]\ntype = \"delay\"\ninput = \"src\"\n"
      "[stages.txt]\ntype = \"test_string_sink\"\ninput = \"d\"\n");
  CHECK(mismatch.find("'txt' (type test_string_sink) takes port type 'text'") != std::string::npos);
  CHECK(mismatch.find("its input 'd' (type delay) produces 'int'") != std::string::npos);
  std::string cycle = config_error(
      "[stages.src]\ntype = \"test_source\"\n[stages.a]\ntype = \"delay\"\ninput = [\"src\", \"c\"]\n"
      "[stages.b]\ntype = \"delay\"\ninput = \"a\"\n[stages.c]\ntype = \"delay\"\ninput = \"b\"\n");
  CHECK(cycle.find("cycle:") != std::string::npos);
  CHECK((cycle.find("a -> b -> c -> a") != std::string::npos || cycle.find("b -> c -> a -> b") != std::string::npos ||
         cycle.find("c -> a -> b -> c") != std::string::npos));
  std::string missing = config_error("[stages.src]\ntype = \"test_source\"\n[stages.k]\ntype = \"test_sink\"\ninput = \"scr\"\n");
  CHECK(missing.find("[stages.k] input: no stage named 'scr'") != std::string::npos);
  std::string unknown = config_error("[stages.src]\ntype = \"test_source\"\ncuont = 3\n");
  CHECK(unknown.find("t.toml:3") != std::string::npos);
  CHECK(unknown.find("unknown key 'cuont'") != std::string::npos);
  std::string badtype = config_error("[stages.src]\ntype = \"test_source\"\ncount = \"many\"\n");
  CHECK(badtype.find("count: expected an integer") != std::string::npos);
  std::string workers = config_error(
      "[stages.src]\ntype = \"test_source\"\n[stages.o]\ntype = \"test_ordered_sink\"\ninput = \"src\"\nworkers = 2\n");
  CHECK(workers.find("[stages.o] workers: stage type test_ordered_sink allows at most 1") != std::string::npos);
  // The same errors from code-built specs.
  GraphSpec g;
  g.add("src", "test_source").set("cuont", int64_t{3});
  CHECK_THROWS_WITH_AS(Engine(std::move(g)), doctest::Contains("unknown option 'cuont' for stage type test_source"),
                       config::ConfigError);
  // A valid config builds, and swapping a stage's type is a config change only.
  auto doc = config::Document::parse(
      "[stages.src]\ntype = \"test_source\"\ncount = 20\n[stages.work]\ntype = \"delay\"\ninput = \"src\"\nworkers = 2\n"
      "ms = 0\n[stages.out]\ntype = \"test_ordered_sink\"\ninput = \"work\"\ncapacity = 3\n",
      "ok.toml", {"stages.work.type=spin", "stages.work.workers=3"});
  Engine e(GraphSpec::from_config(doc));
  CHECK(e.stage_names() == std::vector<std::string>{"src", "work", "out"});
  CHECK(e.dot().find("\"work\" -> \"out\" [label=\"int\\ncap 3\"]") != std::string::npos);
  CHECK(e.dot().find("spin  x3") != std::string::npos);
  with_timeout([&] { e.run(); });
  CHECK(e.snapshot().stage("out")->items_in == 20);
}

TEST_CASE("an error about a stage's key names the line or the --set that gave it") {
  const std::string text = "[stages.src]\ntype = \"test_source\"\n[stages.d]\ntype = \"delay\"\ninput = \"src\"\n"
                           "[stages.k]\ntype = \"test_collect\"\ninput = \"d\"\n";
  auto error_with = [&](std::vector<std::string> sets) {
    return test_util::error_of([&] { validate(GraphSpec::from_config(config::Document::parse(text, "t.toml", sets))); });
  };
  CHECK(error_with({"stages.k.input=nope"}).find("--set stages.k.input=nope: [stages.k] input: no stage named 'nope'") == 0);
  CHECK(error_with({"stages.k.workers=0"}).find("--set stages.k.workers=0: [stages.k] workers:") == 0);
  // A stage whose input no longer fits, after a --set changed its producer's type, says which
  // --set did, and how a stage leaves the graph.
  const std::string port = error_with({"stages.d.type=test_tracked_source", "stages.d.input=[]"});
  INFO(port);
  CHECK(port.find("t.toml:8: [stages.k] input: stage 'k' (type test_collect)") == 0);
  CHECK(port.find("(d's type from --set stages.d.type=test_tracked_source)") != std::string::npos);
  CHECK(port.find("leaves the graph with --set stages.k=") != std::string::npos);
}

TEST_CASE("the graph drawn as text: chains go down, a stage with several outputs branches") {
  auto doc = config::Document::parse(
      "[stages.src]\ntype = \"test_source\"\n"
      "[stages.work]\ntype = \"delay\"\ninput = \"src\"\nworkers = 2\ncapacity = 4\n"
      "[stages.out]\ntype = \"test_sink\"\ninput = \"work\"\ncapacity = 16\n"
      "[stages.tail]\ntype = \"test_ordered_sink\"\ninput = \"work\"\n"
      "[stages.both]\ntype = \"test_sink\"\ninput = [\"work\", \"src\"]\nworkers = \"auto\"\n",
      "t.toml");
  CHECK(to_text(GraphSpec::from_config(doc)) ==
        "src (test_source ×1, source)\n"
        "  │ int\n"
        "  ├── cap 4 ──▶ work (below)\n"
        "  └── cap 8 ──▶ both (below)\n"
        "work (delay ×2)  input: src\n"
        "  │ int\n"
        "  ├── cap 16 ──▶ out (test_sink ×1, sink)\n"
        "  ├── cap 8 ───▶ tail (test_ordered_sink ×1, ordered input, sink)\n"
        "  └── cap 8 ───▶ both (below)\n"
        "both (test_sink ×auto, sink)  input: work, src\n");
  // A chain, each stage below the one that feeds it.
  GraphSpec chain;
  chain.add("src", "test_source");
  chain.add("sink", "test_sink", {"src"}, 1, 3);
  CHECK(to_text(chain) == "src (test_source ×1, source)\n  │ int, cap 3\n  ▼\nsink (test_sink ×1, sink)\n");
}

namespace {

// A source whose dry run checks what its factory would open: the option `fail`, and the host.
std::atomic<int> g_dry_built{0}, g_dry_runs{0};
struct DrySource : Stage {
  explicit DrySource(const StageContext&) { g_dry_built.fetch_add(1); }
};
PIPELINE_STAGE(test_dry_source, {.name = "test_dry_source",
                                 .doc = "a source with a dry run (tests)",
                                 .input = no_port(),
                                 .output = port<int64_t>("int"),
                                 .options = config::Schema().boolean("fail", false, "the dry run fails"),
                                 .factory = make_factory<DrySource>(),
                                 .dry_run = [](const StageContext& ctx) {
                                   g_dry_runs.fetch_add(1);
                                   if (!std::any_cast<int>(&ctx.host)) throw std::logic_error("no host");
                                   if (ctx.options.get_bool("fail")) throw std::runtime_error("cannot open it");
                                 }});

}  // namespace

TEST_CASE("a dry run makes each stage's dry run with the host, and builds none") {
  GraphSpec g;
  g.add("src", "test_dry_source");
  g.add("sink", "test_sink", {"src"});
  dry_run(g, std::any(7));
  CHECK(g_dry_runs.load() == 1);
  CHECK(g_dry_built.load() == 0);
  GraphSpec bad;
  bad.add("src", "test_dry_source").set("fail", true);
  bad.add("sink", "test_sink", {"src"});
  CHECK_THROWS_WITH_AS(dry_run(bad, std::any(7)), "stage 'src': building: cannot open it", StageError);
  // The graph is checked first, as validate() does.
  GraphSpec wrong;
  wrong.add("src", "test_dry_source");
  wrong.add("sink", "test_sink", {"nope"});
  CHECK_THROWS_AS(dry_run(wrong, std::any(7)), config::ConfigError);
  CHECK(g_dry_runs.load() == 2);
}

namespace {

// A stage type registered in two halves, as stages/catalog.cpp declares the training stages and
// their files implement them.
struct Halves {
  int64_t v = 0;
};
std::atomic<int64_t> g_halves_seen{0};

class HalvesSource : public Stage {
 public:
  explicit HalvesSource(const StageContext& ctx) : n_(ctx.options.get_int("count")) {}
  bool produce(Emitter& out) override {
    if (i_ >= n_) return false;
    out.emit(Halves{i_++});
    return true;
  }

 private:
  int64_t n_, i_ = 0;
};

class HalvesSink : public Stage {
 public:
  explicit HalvesSink(const StageContext&) {}
  void process(Item in, Emitter&) override { g_halves_seen += in.get<Halves>().v + 1; }
};

}  // namespace

TEST_CASE("a stage type declared apart from its implementation validates, and builds once implemented") {
  // The implementation may come first: static initialisation runs in no fixed order across files.
  register_stage_impl({.name = "test_halves_sink", .input = typeid(Halves), .factory = make_factory<HalvesSink>()});
  register_stage_type({.name = "test_halves_sink", .doc = "takes halves", .input = port("halves"), .output = no_port()});
  register_stage_type({.name = "test_halves_source",
                       .doc = "makes halves",
                       .input = no_port(),
                       .output = port("halves"),
                       .options = config::Schema().integer("count", 3, "items")});
  const StageType* src = find_stage_type("test_halves_source");
  REQUIRE(src != nullptr);
  CHECK(!src->factory);
  CHECK(src->output.name == "halves");
  REQUIRE(find_stage_type("test_halves_sink") != nullptr);
  CHECK(find_stage_type("test_halves_sink")->factory);

  GraphSpec g;
  g.add("src", "test_halves_source").set("count", int64_t{4});
  g.add("sink", "test_halves_sink", {"src"});
  CHECK_NOTHROW(validate(g));  // ports, inputs and options, from the declarations alone
  GraphSpec wrong;
  wrong.add("src", "test_halves_source");
  wrong.add("sink", "test_ordered_sink", {"src"});
  std::string err;
  try {
    validate(wrong);
  } catch (const config::ConfigError& e) {
    err = e.what();
  }
  CHECK(err.find("'sink' (type test_ordered_sink) takes port type 'int', but its input 'src' (type test_halves_source) "
                 "produces 'halves'") != std::string::npos);
  err.clear();
  try {
    Engine e(g);
  } catch (const std::exception& e) {
    err = e.what();
  }
  CHECK(err.find("stage type test_halves_source is declared in this program but its implementation is not linked in") !=
        std::string::npos);

  register_stage_impl({.name = "test_halves_source", .output = typeid(Halves), .factory = make_factory<HalvesSource>()});
  CHECK(find_stage_type("test_halves_source")->output.type == std::type_index(typeid(Halves)));
  Engine e(g);
  with_timeout([&] { e.run(); });
  CHECK(g_halves_seen.load() == 1 + 2 + 3 + 4);

  // Errors are the program's: a second implementation, a port name bound to another C++ type, an
  // implementation whose ports disagree with the declaration.
  CHECK_THROWS_AS(register_stage_impl({.name = "test_halves_sink", .input = typeid(Halves),
                                       .factory = make_factory<HalvesSink>()}),
                  std::logic_error);
  CHECK_THROWS_AS(register_stage_type({.name = "test_halves_int", .doc = "", .input = port<int64_t>("halves"),
                                       .output = no_port(), .factory = make_factory<HalvesSink>()}),
                  std::logic_error);
  register_stage_type({.name = "test_halves_other", .doc = "", .input = port("halves"), .output = no_port()});
  CHECK_THROWS_AS(register_stage_impl({.name = "test_halves_other", .input = typeid(int64_t),
                                       .factory = make_factory<HalvesSink>()}),
                  std::logic_error);
}
