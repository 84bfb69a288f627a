// Shared by the input-side benchmarks (bench_input, bench_autotune): stages that count the
// text and the batches going by, and the run of the real input side
//   read_shards -> meter -> [spin] -> tokenize -> pack -> sink
// on a prepared dataset, looping over it, until the caller ends it. Header-only: each
// benchmark is one executable.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "graph/engine.h"
#include "runner/run_setup.h"
#include "stages/types.h"

namespace bench_meter {

using namespace pipeline;

/// What has gone by so far (relaxed counters: read them from any thread).
struct Counters {
  std::atomic<uint64_t> bytes{0}, documents{0}, batches{0}, tokens{0};
  void reset() { bytes = documents = batches = tokens = 0; }
};
inline Counters g_counters;

inline double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Counts the text (between read_shards and tokenize: one chunk per message).
class TextMeter : public graph::Stage {
 public:
  explicit TextMeter(const graph::StageContext&) {}
  void process(graph::Item in, graph::Emitter& out) override {
    const auto& c = in.get<stages::TextChunk>();
    g_counters.bytes.fetch_add(c.text.size(), std::memory_order_relaxed);
    g_counters.documents.fetch_add(c.documents(), std::memory_order_relaxed);
    out.emit_item(std::move(in));
  }
};
PIPELINE_STAGE(bench_text_meter, {.name = "bench_text_meter", .doc = "counts text bytes (benchmarks)",
                                  .input = graph::port<stages::TextChunk>("documents"),
                                  .output = graph::port<stages::TextChunk>("documents"), .max_workers = 1,
                                  .factory = graph::make_factory<TextMeter>()});

// Counts batches and their tokens.
class BatchMeter : public graph::Stage {
 public:
  explicit BatchMeter(const graph::StageContext&) {}
  void process(graph::Item in, graph::Emitter&) override {
    const auto& b = in.get<stages::Batch>();
    g_counters.batches.fetch_add(1, std::memory_order_relaxed);
    g_counters.tokens.fetch_add(static_cast<uint64_t>(b.B * b.T), std::memory_order_relaxed);
  }
};
PIPELINE_STAGE(bench_batch_meter, {.name = "bench_batch_meter", .doc = "counts batches (benchmarks)",
                                   .input = graph::port<stages::Batch>("batch"), .output = graph::no_port(),
                                   .max_workers = 1, .factory = graph::make_factory<BatchMeter>()});

/// One input-side graph. Workers and capacities: 0 means "auto".
struct InputSide {
  std::string dataset;
  int64_t batch = 16, seq = 1024;
  std::string chunk_bytes = "auto";
  double spin_ms = 0;  // > 0: a spin stage of this many ms per chunk before tokenize
  int spin_workers = 1, tokenize_workers = 0;
  int capacity = 64;   // of every edge (0: auto)
  int pack_buffers = 0;  // [stages.pack] buffers (0: the stage's default)
  bool autotune = false, stats = false;
  std::vector<std::string> sets;  // more "section.key=value" settings (e.g. data.order="documents")
};

/// What a run leaves: its final stats and events (with stats on).
struct RunResult {
  graph::Snapshot final;
  std::vector<graph::Event> events;
};

/// Runs the input side; `during(engine)` runs on the calling thread while the graph runs and
/// returns when the measurement is over; the graph then drains and stops. Rethrows a stage's
/// error.
inline RunResult run_input_side(const InputSide& in, const std::function<void(graph::Engine&)>& during) {
  stages::RunRequest req;
  req.config = "gpt2.toml";
  req.source_dir = PIPELINE_SOURCE_DIR;
  req.create_run_dir = false;
  req.overrides = {"training.batch_size=" + std::to_string(in.batch), "training.seq_len=" + std::to_string(in.seq),
                   "data.dataset=\"" + in.dataset + "\"", "data.loop=true", "logging.live=\"off\""};
  req.overrides.insert(req.overrides.end(), in.sets.begin(), in.sets.end());
  auto plan = stages::plan_run(req);
  graph::GraphSpec g;
  g.add("read", "read_shards")
      .set("chunk_bytes", in.chunk_bytes == "auto" ? config::Value{std::string("auto")}
                                                   : config::Value{int64_t{std::atoll(in.chunk_bytes.c_str())}});
  g.add("meter", "bench_text_meter", {"read"}, 1, in.capacity);
  std::string before_tokenize = "meter";
  if (in.spin_ms > 0) {
    g.add("spin", "spin", {"meter"}, in.spin_workers, in.capacity).set("ms", in.spin_ms);
    before_tokenize = "spin";
  }
  g.add("tokenize", "tokenize", {before_tokenize}, in.tokenize_workers, in.capacity);
  auto& pack = g.add("pack", "pack", {"tokenize"}, 1, in.capacity);
  if (in.pack_buffers > 0) pack.set("buffers", int64_t{in.pack_buffers});
  g.add("sink", "bench_batch_meter", {"pack"}, 1, in.capacity);
  g_counters.reset();
  graph::EngineOptions opts;
  opts.stats = in.stats || in.autotune;
  opts.trace = false;
  opts.autotune = in.autotune;
  opts.host = plan.ctx;
  RunResult r;
  {
    graph::Engine e(std::move(g), opts);
    std::exception_ptr failed;
    std::thread runner([&] {
      try {
        e.run();
      } catch (...) {
        failed = std::current_exception();
      }
    });
    during(e);
    e.stop();  // the source stops; what is in flight drains (no stage here discards on a stop)
    runner.join();
    if (failed) std::rethrow_exception(failed);
    if (opts.stats) r.final = e.final_snapshot(), r.events = e.events();
  }
  return r;
}

}  // namespace bench_meter
