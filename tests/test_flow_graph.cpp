// Tests for the flow-graph engine's mechanics (graph/flow_graph.h, graph/edge.cpp,
// graph/invocation.cpp): threads shared in one arena, timed stages that hold no thread, the
// bound of stages that emit several items per input, routing filters, resource pools,
// batches of cheap items, workers = "auto", the drain after stop(), and the scope of a wind-down.
#include <doctest/doctest.h>

#include <oneapi/tbb/info.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/config.h"
#include "graph/engine.h"
#include "graph/stage.h"

using namespace pipeline;
using namespace pipeline::graph;
using namespace std::chrono_literals;

namespace {

// TSan runs a background thread of its own, started when the program creates its first thread.
#if defined(__SANITIZE_THREAD__)
constexpr int kSanitizerThreads = 1;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kSanitizerThreads = 1;
#else
constexpr int kSanitizerThreads = 0;
#endif
#else
constexpr int kSanitizerThreads = 0;
#endif

template <class F>
void with_timeout(F f, int seconds = 30) {
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

int os_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The threads the reads ran on, and those a CPU stage's bodies ran on (the arena's).
std::mutex g_threads_mu;
std::set<std::thread::id> g_read_threads, g_burn_threads;

// A CPU stage that burns `ms` of CPU per item and records how many of its kind run at once.
std::atomic<int> g_burning{0}, g_burning_max{0};
class Burn : public Stage {
 public:
  explicit Burn(const StageContext& ctx) : ms_(ctx.options.get_float("ms")) {}
  void process(Item in, Emitter& out) override {
    {
      std::lock_guard lock(g_threads_mu);
      g_burn_threads.insert(std::this_thread::get_id());
    }
    int now = g_burning.fetch_add(1) + 1;
    int seen = g_burning_max.load();
    while (now > seen && !g_burning_max.compare_exchange_weak(seen, now)) {
    }
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(ms_ * 1000));
    volatile uint64_t x = 0;
    while (std::chrono::steady_clock::now() < until) x = x + 1;
    g_burning.fetch_sub(1);
    out.emit_item(std::move(in));
  }

 private:
  double ms_;
};
PIPELINE_STAGE(flow_burn, {.name = "flow_burn", .doc = "burns CPU, counting concurrent bodies", .input = any_port(),
                           .output = any_port(), .options = config::Schema().floating("ms", 1.0, "ms per item"),
                           .factory = make_factory<Burn>()});

// 1 -> k: v becomes k*v, k*v+1, ..., k*v+k-1.
class Fan : public Stage {
 public:
  explicit Fan(const StageContext& ctx) : k_(ctx.options.get_int("k")) {}
  void process(Item in, Emitter& out) override {
    int64_t v = in.get<int64_t>();
    for (int64_t i = 0; i < k_; ++i) out.emit<int64_t>(k_ * v + i);
  }

 private:
  int64_t k_;
};
PIPELINE_STAGE(flow_fan, {.name = "flow_fan", .doc = "1 -> k items", .input = port<int64_t>("int"),
                          .output = port<int64_t>("int"), .options = config::Schema().integer("k", 3, "outputs"),
                          .max_workers = 1, .factory = make_factory<Fan>()});

// A source whose reads block (a slow disk): each produce() sleeps `read_ms`, then emits `per_read`
// integers. It owns a thread, as read_shards does.
class SlowReads : public Stage {
 public:
  explicit SlowReads(const StageContext& ctx)
      : reads_(ctx.options.get_int("reads")), per_read_(ctx.options.get_int("per_read")),
        read_ms_(ctx.options.get_float("read_ms")) {}
  bool produce(Emitter& out) override {
    {
      std::lock_guard lock(g_threads_mu);
      g_read_threads.insert(std::this_thread::get_id());
    }
    if (done_ == reads_) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(read_ms_ * 1000)));
    for (int64_t i = 0; i < per_read_; ++i) out.emit<int64_t>(done_ * per_read_ + i);
    ++done_;
    return true;
  }

 private:
  int64_t reads_, per_read_, done_ = 0;
  double read_ms_;
};
PIPELINE_STAGE(flow_slow_reads, {.name = "flow_slow_reads", .doc = "a source whose reads block", .input = no_port(),
                                 .output = port<int64_t>("int"),
                                 .options = config::Schema()
                                                .integer("reads", 10, "reads")
                                                .integer("per_read", 6, "integers per read")
                                                .floating("read_ms", 20.0, "ms each read blocks"),
                                 .own_thread = true, .max_workers = 1, .factory = make_factory<SlowReads>()});

// Collects integers in arrival order.
std::mutex g_mu;
std::vector<int64_t> g_seen;
class Record : public Stage {
 public:
  explicit Record(const StageContext&) {}
  void process(Item in, Emitter&) override {
    std::lock_guard lock(g_mu);
    g_seen.push_back(in.get<int64_t>());
  }
};
PIPELINE_STAGE(flow_record, {.name = "flow_record", .doc = "records integers in order", .input = port<int64_t>("int"),
                             .output = no_port(), .ordered = true, .max_workers = 1, .factory = make_factory<Record>()});

// An own-thread producer of steps: passes integers on as fast as it can, counting them.
std::atomic<int64_t> g_steps{0};
class Steps : public Stage {
 public:
  explicit Steps(const StageContext&) {}
  void process(Item in, Emitter& out) override {
    g_steps.fetch_add(1);
    out.emit_item(std::move(in));
  }
};
PIPELINE_STAGE(flow_steps, {.name = "flow_steps", .doc = "own-thread pass-through, counting", .input = port<int64_t>("int"),
                            .output = port<int64_t>("int"), .own_thread = true, .factory = make_factory<Steps>()});

// A slow consumer that only wants every 10th integer (like eval, which only wants steps that
// carry eval weights). It notes how many steps had passed when it finished its first item.
std::atomic<int64_t> g_steps_at_first_eval{-1};
class SlowEvery10 : public Stage {
 public:
  explicit SlowEvery10(const StageContext&) {}
  void process(Item, Emitter&) override {
    std::this_thread::sleep_for(100ms);
    int64_t expected = -1;
    g_steps_at_first_eval.compare_exchange_strong(expected, g_steps.load());
  }
};
PIPELINE_STAGE(flow_slow_every10, {.name = "flow_slow_every10", .doc = "slow, wants every 10th integer",
                                   .input = port<int64_t>("int"), .output = no_port(), .own_thread = true,
                                   .accepts = [](const Item& it) { return it.get<int64_t>() % 10 == 0; },
                                   .factory = make_factory<SlowEvery10>()});

// A burst of slow evaluations: 100 ms on every 5th step.
std::atomic<int64_t> g_steps_at_first_burst_eval{-1};
class SlowEvery5 : public Stage {
 public:
  explicit SlowEvery5(const StageContext&) {}
  void process(Item, Emitter&) override {
    std::this_thread::sleep_for(100ms);
    int64_t expected = -1;
    g_steps_at_first_burst_eval.compare_exchange_strong(expected, g_steps.load());
  }
};
PIPELINE_STAGE(flow_slow_every5, {.name = "flow_slow_every5", .doc = "slow, wants every 5th integer",
                                  .input = port<int64_t>("int"), .output = no_port(), .own_thread = true,
                                  .accepts = [](const Item& it) { return it.get<int64_t>() % 5 == 0; },
                                  .factory = make_factory<SlowEvery5>()});

// A CPU sink (and an own-thread one) that wants only even integers, straight behind a source.
std::atomic<int64_t> g_even{0};
class CountEven : public Stage {
 public:
  explicit CountEven(const StageContext&) {}
  void process(Item in, Emitter&) override {
    if (in.get<int64_t>() % 2 != 0) throw std::logic_error("an odd item passed the filter");
    g_even.fetch_add(1);
  }
};
PIPELINE_STAGE(flow_even, {.name = "flow_even", .doc = "counts even integers", .input = port<int64_t>("int"),
                           .output = no_port(), .accepts = [](const Item& it) { return it.get<int64_t>() % 2 == 0; },
                           .factory = make_factory<CountEven>()});
PIPELINE_STAGE(flow_even_thread, {.name = "flow_even_thread", .doc = "counts even integers on its thread",
                                  .input = port<int64_t>("int"), .output = no_port(), .own_thread = true,
                                  .accepts = [](const Item& it) { return it.get<int64_t>() % 2 == 0; },
                                  .factory = make_factory<CountEven>()});

// A CPU stage gated by a pool of 2 resources: it takes one per input and sends its index on;
// the own-thread stage downstream gives it back from another thread, later.
std::shared_ptr<ResourcePool> g_pool;
std::atomic<int> g_pool_out{0}, g_pool_out_max{0};
class TakeResource : public Stage {
 public:
  explicit TakeResource(const StageContext&) { g_pool = std::make_shared<ResourcePool>(2); }
  std::shared_ptr<ResourcePool> resource_pool() override { return g_pool; }
  void process(Item, Emitter& out) override {
    int index = g_pool->acquire();  // throws when the engine admitted an input with none free
    int n = g_pool_out.fetch_add(1) + 1;
    int seen = g_pool_out_max.load();
    while (n > seen && !g_pool_out_max.compare_exchange_weak(seen, n)) {
    }
    out.emit<int64_t>(index);
  }
};
PIPELINE_STAGE(flow_take_resource, {.name = "flow_take_resource", .doc = "takes a pooled resource per input",
                                    .input = port<int64_t>("int"), .output = port<int64_t>("int"),
                                    .factory = make_factory<TakeResource>()});
class GiveBackLater : public Stage {
 public:
  explicit GiveBackLater(const StageContext&) {}
  void process(Item in, Emitter&) override {
    int index = static_cast<int>(in.get<int64_t>());
    // Released from a thread that is neither the engine's nor TBB's (as a CUDA callback would).
    std::thread([index] {
      std::this_thread::sleep_for(2ms);
      g_pool_out.fetch_sub(1);
      g_pool->release(index);
    }).detach();
  }
};
PIPELINE_STAGE(flow_give_back_later, {.name = "flow_give_back_later", .doc = "gives the resource back later",
                                      .input = port<int64_t>("int"), .output = no_port(), .own_thread = true,
                                      .factory = make_factory<GiveBackLater>()});

// A sink that has all the input it will use after `after` integers, and winds down then (as
// train does after its last step); it counts the integers it was given. On the arena, or on a
// thread of its own as train is.
std::atomic<int64_t> g_wind_down_taken{0};
class WindDownAfter : public Stage {
 public:
  explicit WindDownAfter(const StageContext& ctx) : after_(ctx.options.get_int("after")) {}
  void process(Item, Emitter& out) override {
    if (g_wind_down_taken.fetch_add(1) + 1 == after_) out.wind_down();
  }

 private:
  int64_t after_;
};
PIPELINE_STAGE(flow_wind_down, {.name = "flow_wind_down", .doc = "winds down after `after` integers",
                                .input = port<int64_t>("int"), .output = no_port(),
                                .options = config::Schema().integer("after", 20, "integers it takes", 1),
                                .max_workers = 1, .factory = make_factory<WindDownAfter>()});
PIPELINE_STAGE(flow_wind_down_thread, {.name = "flow_wind_down_thread", .doc = "winds down after `after` integers, on its thread",
                                       .input = port<int64_t>("int"), .output = no_port(),
                                       .options = config::Schema().integer("after", 20, "integers it takes", 1),
                                       .own_thread = true, .factory = make_factory<WindDownAfter>()});

// A sink that discards what is queued on a stop (as train does), counting what it takes.
std::atomic<int64_t> g_kept{0};
class Keep : public Stage {
 public:
  explicit Keep(const StageContext&) {}
  void process(Item, Emitter&) override { g_kept.fetch_add(1); }
};
PIPELINE_STAGE(flow_keep, {.name = "flow_keep", .doc = "counts integers; discards on stop",
                           .input = port<int64_t>("int"), .output = no_port(), .max_workers = 1,
                           .on_stop = OnStop::discard, .factory = make_factory<Keep>()});

}  // namespace

TEST_CASE("CPU stages share one arena: 4x the cores in workers run on about `cores` threads, and overlap") {
  const int cores = tbb::info::default_concurrency();
  const int w = std::max(1, 4 * cores / 3 + 1);  // three stages: more than 4x the cores in all
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{600});
  g.add("a", "flow_burn", {"src"}, w, 16).set("ms", 0.3);
  g.add("b", "flow_burn", {"a"}, w, 16).set("ms", 0.3);
  g.add("c", "flow_burn", {"b"}, w, 16).set("ms", 0.3);
  g.add("sink", "test_sink", {"c"}, 1, 16);
  Engine e(std::move(g), {.batch = false});
  g_burning_max = 0;
  std::atomic<bool> running{true};
  std::atomic<int> most{0};
  const int before = os_threads();
  std::thread counter([&] {
    while (running) {
      most = std::max(most.load(), os_threads());
      std::this_thread::sleep_for(1ms);
    }
  });
  with_timeout([&] { e.run(); });
  running = false;
  counter.join();
  MESSAGE(3 * w << " workers on " << cores << " cores: at most " << most.load() << " threads (" << before
                << " before the run), " << g_burning_max.load() << " bodies at once");
  CHECK(e.snapshot().stage("sink")->items_in == 600);
  // The run's own threads: the arena's workers (cores - 1 beside the caller), the monitor and the
  // timer, plus this test's with_timeout and counter threads (started after `before` was read),
  // and under TSan its background thread, which it starts with the first thread created.
  CHECK(most.load() <= before + cores + 3 + kSanitizerThreads);
  CHECK(most.load() < before + 3 * w);  // never a thread per worker
  CHECK(g_burning_max.load() >= std::min(2, cores));  // stages ran at the same time
}

TEST_CASE("a source whose reads block reads on its own thread: both arena threads keep the CPU stage busy") {
  // Each read blocks 30 ms and yields 8 items of 10 ms of CPU each (40 ms on two threads): the
  // CPU stage needs both of the arena's threads all the time. A read on an arena thread would
  // leave the stage one thread for 30 ms of every 55 (1.45 bodies at once on average); on the
  // source's own thread, 2.
  GraphSpec g;
  g.add("src", "flow_slow_reads").set("reads", int64_t{18}).set("per_read", int64_t{8}).set("read_ms", 30.0);
  g.add("burn", "flow_burn", {"src"}, 2, 16).set("ms", 10.0);
  g.add("order", "flow_record", {"burn"});
  {
    std::lock_guard lock(g_mu);
    g_seen.clear();
  }
  {
    std::lock_guard lock(g_threads_mu);
    g_read_threads.clear();
    g_burn_threads.clear();
  }
  Engine e(std::move(g), {.threads = 2});
  with_timeout([&] { e.run(); });
  Snapshot s = e.final_snapshot();
  CHECK(s.status == "done");
  {
    std::lock_guard lock(g_mu);
    REQUIRE(g_seen.size() == 144);
    for (size_t i = 0; i < g_seen.size(); ++i) CHECK(g_seen[i] == static_cast<int64_t>(i));  // in order
  }
  // Every read ran on one thread, which never ran the CPU stage: both arena threads (which both
  // ran it) stay free for it, whatever the load.
  {
    std::lock_guard lock(g_threads_mu);
    CHECK(g_read_threads.size() == 1);
    CHECK(g_burn_threads.size() == 2);
    for (const auto& id : g_read_threads) CHECK(g_burn_threads.count(id) == 0);
  }
  // Bodies at once, on average, from the first item to the last (the stage's busy seconds over
  // the time it ran): close to 2 on a quiet machine (a read on an arena thread would allow
  // 1.45). Reported, not asserted: on a machine loaded several times over its cores, the
  // reader's wake-ups and the workers' turns are the machine's.
  const StageStats* burn = s.stage("burn");
  REQUIRE(burn);
  const double first_to_last = s.stage("order")->wall_s;
  MESSAGE("burn: " << burn->busy_s << " s busy over " << first_to_last << " s: " << burn->busy_s / first_to_last
                   << " bodies at once");
  CHECK(burn->items_in == 144);
}

TEST_CASE("a timed stage holds items on a timer, not on threads: 8 delay workers overlap on any arena") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{32});
  g.add("slow", "delay", {"src"}, 8, 8).set("ms", 100.0);
  g.add("sink", "test_sink", {"slow"}, 1, 8);
  Engine e(std::move(g), {.threads = 1});  // one arena thread for everything
  auto t0 = std::chrono::steady_clock::now();
  with_timeout([&] { e.run(); });
  double s = seconds_since(t0);
  MESSAGE("32 items x 100 ms with 8 delay workers on a 1-thread arena: " << s << " s (serial: 3.2 s)");
  CHECK(e.snapshot().stage("sink")->items_in == 32);
  CHECK(s < 1.6);  // 4 rounds of 8 in parallel take 0.4 s; a thread per held item would need 8
}

TEST_CASE("a stage that emits k items per input exceeds its edge's capacity by at most k - 1") {
  for (int64_t k : {1, 3, 7}) {
    GraphSpec g;
    g.add("src", "test_source").set("count", int64_t{200});
    g.add("fan", "flow_fan", {"src"}, 1, 4).set("k", k);
    g.add("slow", "test_sink", {"fan"}, 1, 4).set("ms", 0.2);
    Engine e(std::move(g), {.sample_interval = 1ms});
    with_timeout([&] { e.run(); });
    Snapshot s = e.snapshot();
    const QueueStats* q = s.queue_of("slow");
    REQUIRE(q);
    INFO("k = " << k << ": high water " << q->high_water << " of capacity " << q->capacity);
    CHECK(s.stage("slow")->items_in == 200 * k);
    CHECK(q->high_water <= q->capacity + k - 1);
    CHECK(q->high_water >= q->capacity);  // the slow sink did fill it
  }
}

TEST_CASE("routing: a consumer that wants few items never holds its producer back on the others") {
  g_steps = 0;
  g_steps_at_first_eval = -1;
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{200});
  g.add("train", "flow_steps", {"src"}, 1, 4);
  g.add("log", "test_sink", {"train"}, 1, 4);
  g.add("eval", "flow_slow_every10", {"train"}, 1, 2);  // 100 ms on every 10th step, queue of 2
  Engine e(std::move(g));
  with_timeout([&] { e.run(); });
  Snapshot s = e.snapshot();
  CHECK(s.stage("log")->items_in == 200);
  CHECK(s.stage("eval")->items_in == 20);
  // While eval spent 100 ms on step 0, train went on until eval's queue held two eval steps
  // (10 and 20) and a third waited in train: about 30 steps, not the 3 a queue of every step allows.
  MESSAGE("steps done when eval finished its first: " << g_steps_at_first_eval.load());
  CHECK(g_steps_at_first_eval.load() >= 20);
}

TEST_CASE("routing: a step that carries no eval work never waits on eval's edge, only the next one that does") {
  // Eval takes every 5th step (100 ms each) through a queue of 2. While it works on step 0, steps
  // 5 and 10 fill its queue; the steps between go on at full speed, and so do 11 to 14, which
  // carry no eval work. Step 15 is the first to need a place: train waits there, and only there.
  // (Were eval's credit taken when a step is admitted, train would stop at step 11.)
  g_steps = 0;
  g_steps_at_first_burst_eval = -1;
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{100});
  g.add("train", "flow_steps", {"src"}, 1, 4);
  g.add("log", "test_sink", {"train"}, 1, 256);
  g.add("eval", "flow_slow_every5", {"train"}, 1, 2);
  Engine e(std::move(g));
  with_timeout([&] { e.run(); });
  Snapshot s = e.snapshot();
  CHECK(s.status == "done");
  CHECK(s.stage("log")->items_in == 100);
  CHECK(s.stage("eval")->items_in == 20);
  MESSAGE("steps done when eval finished its first: " << g_steps_at_first_burst_eval.load());
  CHECK(g_steps_at_first_burst_eval.load() >= 15);
  CHECK(g_steps_at_first_burst_eval.load() <= 16);  // and the bound held: step 15 waited for a place
  for (const QueueStats& q : s.queues)
    if (q.consumer == "eval") CHECK(q.high_water <= 2);
  // The wait for a place is blocked time, not busy time.
  CHECK(s.stage("train")->blocked_s > 0.5);
  CHECK(s.stage("train")->busy_s < 0.5);
}

TEST_CASE("routing: a filter right behind a source, alone or beside a consumer of everything") {
  for (const char* type : {"flow_even", "flow_even_thread"}) {
    for (bool beside : {false, true}) {
      for (bool batch : {true, false}) {
        INFO(type << (beside ? " beside a sink" : " alone") << (batch ? ", batches" : ""));
        g_even = 0;
        GraphSpec g;
        g.add("src", "test_source").set("count", int64_t{300});
        g.add("even", type, {"src"}, 1, 3);
        if (beside) g.add("all", "test_sink", {"src"}, 1, 3);
        Engine e(std::move(g), {.batch = batch});
        with_timeout([&] { e.run(); });
        CHECK(g_even.load() == 150);
        Snapshot s = e.snapshot();
        CHECK(s.stage("even")->items_in == 150);
        CHECK(s.queue_of("even")->high_water <= 3);
        if (beside) CHECK(s.stage("all")->items_in == 300);
      }
    }
  }
}

TEST_CASE("a resource pool gates its stage: never more out than the pool holds, releases from any thread") {
  g_pool_out = 0;
  g_pool_out_max = 0;
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{300});
  g.add("take", "flow_take_resource", {"src"}, 3, 8);
  g.add("give", "flow_give_back_later", {"take"}, 1, 8);
  Engine e(std::move(g));
  with_timeout([&] { e.run(); });
  CHECK(e.snapshot().stage("give")->items_in == 300);
  CHECK(g_pool_out_max.load() <= 2);
  CHECK(g_pool_out_max.load() >= 1);
  for (int i = 0; i < 200 && g_pool->free_count() < 2; ++i) std::this_thread::sleep_for(5ms);
  CHECK(g_pool->free_count() == 2);
}

TEST_CASE("batches of cheap items keep order and count, with and without batching") {
  for (bool batch : {true, false}) {
    {
      std::lock_guard lock(g_mu);
      g_seen.clear();
    }
    GraphSpec g;
    g.add("src", "test_source").set("count", int64_t{20000});
    g.add("fan", "flow_fan", {"src"}, 1, 64).set("k", int64_t{2});
    g.add("pass", "delay", {"fan"}, 3, 64).set("ms", 0.0);  // parallel, so order is restored after it
    g.add("rec", "flow_record", {"pass"}, 1, 64);
    Engine e(std::move(g), {.batch = batch});
    with_timeout([&] { e.run(); });
    std::lock_guard lock(g_mu);
    INFO("batch = " << batch);
    REQUIRE(g_seen.size() == 40000);
    bool in_order = true;
    for (size_t i = 0; i < g_seen.size(); ++i) in_order &= g_seen[i] == static_cast<int64_t>(i);
    CHECK(in_order);
    // The documented bounds: the source's batches fit the credits (a couple of items of slack
    // for limiter messages that cross); fan emits 2 items per input item, so up to 2 x 32 for
    // one batch of 32 (capacity + 63); the parallel delay stage takes single items.
    Snapshot s = e.snapshot();
    CHECK(s.queue_of("fan")->high_water <= 64 + 2);
    CHECK(s.queue_of("pass")->high_water <= 64 + 63);
    CHECK(s.queue_of("rec")->high_water <= 64);
  }
}

TEST_CASE("workers = \"auto\" takes the arena's size (capped by the type), from TOML and from code") {
  auto doc = config::Document::parse(
      "[stages.src]\ntype = \"test_source\"\ncount = 50\n[stages.work]\ntype = \"spin\"\ninput = \"src\"\n"
      "workers = \"auto\"\nms = 0\n[stages.out]\ntype = \"test_ordered_sink\"\ninput = \"work\"\nworkers = \"auto\"\n",
      "auto.toml");
  Engine e(GraphSpec::from_config(doc), {.threads = 3});
  with_timeout([&] { e.run(); });
  Snapshot s = e.snapshot();
  CHECK(s.stage("work")->workers == 3);
  CHECK(s.stage("out")->workers == 1);  // test_ordered_sink allows one
  CHECK(s.stage("out")->items_in == 50);
  CHECK(e.dot().find("spin  xauto") != std::string::npos);
  // A bad value names the key and what is accepted.
  try {
    auto bad = config::Document::parse("[stages.src]\ntype = \"test_source\"\nworkers = \"many\"\n", "bad.toml");
    Engine b(GraphSpec::from_config(bad));
    FAIL("no error");
  } catch (const config::ConfigError& err) {
    CHECK(std::string(err.what()).find("bad.toml:3: [stages.src] workers: expected an integer or \"auto\"") !=
          std::string::npos);
  }
}

TEST_CASE("options set from code get the same checks as TOML, choices included") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{-5});
  CHECK_THROWS_WITH_AS(Engine(std::move(g)), doctest::Contains("count: expected a value >= 0, got -5"),
                       config::ConfigError);
  GraphSpec g2;
  g2.add("src", "test_source").set("count", std::string("ten"));
  CHECK_THROWS_WITH_AS(Engine(std::move(g2)), doctest::Contains("count: expected an integer, got \"ten\""),
                       config::ConfigError);
}

TEST_CASE("stop() drains whatever is in flight, however long it takes (no grace limit by default)") {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{1} << 40);
  g.add("slow", "delay", {"src"}, 1, 12).set("ms", 40.0);
  g.add("sink", "test_sink", {"slow"});
  Engine e(std::move(g));
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    e.stop();
  });
  with_timeout([&] { e.run(); });
  stopper.join();
  Snapshot s = e.snapshot();
  CHECK(s.status == "stopped");
  CHECK(s.stage("sink")->items_in == s.stage("src")->items_out);  // nothing dropped
  CHECK(s.stage("sink")->items_in >= 10);  // the queued items outlived the stop by well over 100 ms
}

TEST_CASE("wind_down reaches only the caller's upstream: its source stops, an independent chain delivers every item") {
  // Two chains in one graph: an endless source -> delay -> a sink that winds down after 20
  // integers, and a 400-integer source -> a slower delay -> a sink that discards on a stop. The
  // second chain is still busy when the first sink winds down; nothing of it may be dropped.
  for (const char* sink : {"flow_wind_down", "flow_wind_down_thread"}) {
    CAPTURE(sink);
    g_wind_down_taken = 0;
    g_kept = 0;
    GraphSpec g;
    g.add("endless", "test_source").set("count", int64_t{1} << 40);
    g.add("fast", "delay", {"endless"}, 2, 4).set("ms", 0.1);
    g.add("enough", sink, {"fast"}, 1, 4).set("after", int64_t{20});
    g.add("src", "test_source").set("count", int64_t{400});
    g.add("slow", "delay", {"src"}, 1, 4).set("ms", 1.0);
    g.add("keep", "flow_keep", {"slow"}, 1, 4);
    Engine e(std::move(g));
    with_timeout([&] { e.run(); });  // the endless source stopped, or this would not return
    Snapshot s = e.snapshot();
    CHECK(s.status == "done");
    CHECK(g_wind_down_taken.load() == 20);  // what reached it after it wound down was dropped
    CHECK(s.stage("enough")->items_in - s.stage("enough")->discarded == 20);
    CHECK(s.stage("endless")->items_out < 10000);
    CHECK(g_kept.load() == 400);  // the other chain: every item, none discarded
    CHECK(s.stage("keep")->discarded == 0);
    CHECK(s.stage("slow")->discarded == 0);
    CHECK(s.stage("src")->items_out == 400);
  }
}
