// Built-in stage types: `delay` and `spin` (pass-through stages that cost a configured time
// per item, to reproduce the benchmarks and see how a pipeline reacts to a slow stage), and
// synthetic `test_*` stages (an integer source and sinks) for tests, benchmarks and demos.
// `delay` and `test_sink` are timed stages: their wait holds the item on the engine's timer,
// not a thread, so eight delay workers cost no CPU and occupy no core.
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>

#include "graph/stage.h"

namespace pipeline::graph {

void register_builtin_type(StageType t);  // stage.cpp

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::nanoseconds to_ns(double ms) { return std::chrono::nanoseconds(static_cast<int64_t>(ms * 1e6)); }

class Delay : public Stage {
 public:
  explicit Delay(const StageContext& ctx)
      : ms_(ctx.options.get_float("ms")), jitter_(ctx.options.get_float("jitter_ms")), seed_(ctx.options.get_int("seed")) {}
  void process(Item in, Emitter& out) override {
    double ms = ms_;
    if (jitter_ > 0) {
      // Deterministic per item (seeded by its sequence number), so runs are reproducible.
      std::mt19937_64 rng(static_cast<uint64_t>(seed_) * 0x9E3779B97F4A7C15ull + in.seq());
      ms += std::uniform_real_distribution<double>(0, jitter_)(rng);
    }
    if (ms > 0) out.hold_for(to_ns(ms));
    out.emit_item(std::move(in));
  }

 private:
  double ms_, jitter_;
  int64_t seed_;
};

class Spin : public Stage {
 public:
  explicit Spin(const StageContext& ctx) : ms_(ctx.options.get_float("ms")) {}
  void process(Item in, Emitter& out) override {
    auto until = Clock::now() + to_ns(ms_);
    volatile uint64_t x = 0;
    while (Clock::now() < until)
      for (int i = 0; i < 64; ++i) x = x + static_cast<uint64_t>(i);
    out.emit_item(std::move(in));
  }

 private:
  double ms_;
};

class TestSource : public Stage {
 public:
  explicit TestSource(const StageContext& ctx)
      : next_(ctx.options.get_int("start")), end_(next_ + ctx.options.get_int("count")), ms_(ctx.options.get_float("ms")) {}
  bool produce(Emitter& out) override {
    if (next_ >= end_) return false;
    if (ms_ > 0) std::this_thread::sleep_for(to_ns(ms_));
    out.emit<int64_t>(next_++);
    return true;
  }

 private:
  int64_t next_, end_;
  double ms_;
};

class TestSink : public Stage {
 public:
  explicit TestSink(const StageContext& ctx) : ms_(ctx.options.get_float("ms")) {}
  void process(Item, Emitter& out) override {
    if (ms_ > 0) out.hold_for(to_ns(ms_));
  }

 private:
  double ms_;
};

// Checks that integers arrive as consecutive values: order restored by the engine.
class TestOrderedSink : public Stage {
 public:
  explicit TestOrderedSink(const StageContext& ctx) : next_(ctx.options.get_int("start")) {}
  void process(Item in, Emitter&) override {
    int64_t v = in.get<int64_t>();
    if (v != next_)
      throw std::runtime_error("out of order: expected " + std::to_string(next_) + ", got " + std::to_string(v) +
                               " (seq " + std::to_string(in.seq()) + ")");
    ++next_;
  }

 private:
  int64_t next_;
};

}  // namespace

void register_builtin_stages() {
  register_builtin_type(StageType{
      .name = "delay",
      .doc = "passes items through after `ms` (+ up to `jitter_ms`) per item: a slow stage that uses no CPU",
      .input = any_port(),
      .output = any_port(),
      .options = config::Schema("delay")
                     .floating("ms", 1.0, "milliseconds each item is held", 0.0, 1e6)
                     .floating("jitter_ms", 0.0, "extra random hold in [0, jitter_ms) per item", 0.0, 1e6)
                     .integer("seed", 0, "jitter seed"),
      .timed = true,
      .factory = make_factory<Delay>()});
  register_builtin_type(StageType{
      .name = "spin",
      .doc = "passes items through, burning CPU for `ms` per item: a slow CPU-bound stage",
      .input = any_port(),
      .output = any_port(),
      .options = config::Schema("spin").floating("ms", 1.0, "milliseconds of CPU burned per item", 0.0, 1e6),
      .factory = make_factory<Spin>()});
  register_builtin_type(StageType{
      .name = "test_source",
      .doc = "synthetic source: the integers start, start+1, ... (count of them)",
      .input = no_port(),
      .output = port<int64_t>("int"),
      .options = config::Schema("test_source")
                     .integer("count", 1000, "how many integers", 0)
                     .integer("start", 0, "first integer")
                     .floating("ms", 0.0, "milliseconds slept before each item (on the arena thread: a slow source)", 0.0, 1e6),
      .max_workers = 1,
      .factory = make_factory<TestSource>()});
  register_builtin_type(StageType{
      .name = "test_sink",
      .doc = "synthetic sink: drops every item, after holding it `ms`",
      .input = any_port(),
      .output = no_port(),
      .options = config::Schema("test_sink").floating("ms", 0.0, "milliseconds each item is held", 0.0, 1e6),
      .timed = true,
      .factory = make_factory<TestSink>()});
  register_builtin_type(StageType{
      .name = "test_ordered_sink",
      .doc = "synthetic sink that needs ordered input and fails unless integers arrive consecutively",
      .input = port<int64_t>("int"),
      .output = no_port(),
      .options = config::Schema("test_ordered_sink").integer("start", 0, "first integer expected"),
      .ordered = true,
      .max_workers = 1,
      .factory = make_factory<TestOrderedSink>()});
}

}  // namespace pipeline::graph
