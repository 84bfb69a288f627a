// Engine benchmarks (graph/): run and report, not timed tests.
//   overlap:  three stages costing a, b, c ms per item (one worker each) should take about
//             max(a, b, c) per item in steady state, not a + b + c.
//   overhead: items/s through a chain of pass-through CPU stages, with stats off, on, and on + trace;
//             the stats cost should be under 2% of throughput. Also with batching off, against
//             the same chain in plain oneTBB with one limiter (the engine's cost per hop), and
//             in plain oneTBB with a bound per edge (a queue and a limiter per hop, as the engine).
//   hops:     the engine's chain with batching and stats off and the plain oneTBB chain, run
//             after run: ns per item per hop and their ratio (to profile, or to see both move),
//             wall-clock and the process's CPU time. --threads 1 runs both in an arena of one
//             thread: the work per hop, without the scheduler's choice of one thread or two.
// usage: bench_graph [overlap|overhead|hops|all] [--items N] [--repeats R] [--stages K] [--threads N]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include "graph/engine.h"

using namespace pipeline;
using namespace pipeline::graph;

namespace {

using Clock = std::chrono::steady_clock;

// Records the arrival time of every item, so steady state can be measured without start-up.
std::vector<Clock::time_point>& arrivals() {
  static std::vector<Clock::time_point> v;
  return v;
}
class ClockSink : public Stage {
 public:
  explicit ClockSink(const StageContext&) {}
  void process(Item, Emitter&) override { arrivals().push_back(Clock::now()); }
};
PIPELINE_STAGE(bench_clock_sink, {.name = "bench_clock_sink", .doc = "records arrival times (bench_graph)",
                                  .input = any_port(), .output = no_port(), .max_workers = 1,
                                  .factory = make_factory<ClockSink>()});

// A pass-through CPU stage that does nothing: what one hop of the flow graph costs.
class Pass : public Stage {
 public:
  explicit Pass(const StageContext&) {}
  void process(Item in, Emitter& out) override { out.emit_item(std::move(in)); }
};
PIPELINE_STAGE(bench_pass, {.name = "bench_pass", .doc = "passes items through, doing nothing (bench_graph)",
                            .input = any_port(), .output = any_port(), .factory = make_factory<Pass>()});

class Drop : public Stage {
 public:
  explicit Drop(const StageContext&) {}
};
PIPELINE_STAGE(bench_drop, {.name = "bench_drop", .doc = "drops every item (bench_graph)", .input = any_port(),
                            .output = no_port(), .factory = make_factory<Drop>()});

double steady_ms_per_item(size_t skip) {
  auto& a = arrivals();
  if (a.size() < skip + 2) return 0;
  return std::chrono::duration<double, std::milli>(a.back() - a[skip]).count() / static_cast<double>(a.size() - 1 - skip);
}

void overlap(int items, const std::string& kind) {
  std::printf("\n== overlap (%s stages, 1 worker each, capacity 4, %d items; steady state after 10 items)\n", kind.c_str(),
              items);
  std::printf("%8s %8s %8s | %10s %10s | %12s %8s\n", "a ms", "b ms", "c ms", "max", "sum", "measured", "/max");
  std::vector<std::vector<double>> cases = {{2, 2, 2}, {1, 4, 2}, {5, 10, 5}, {3, 1, 1}};
  for (const auto& c : cases) {
    GraphSpec g;
    g.add("src", "test_source").set("count", int64_t{items});
    g.add("a", kind, {"src"}, 1, 4).set("ms", c[0]);
    g.add("b", kind, {"a"}, 1, 4).set("ms", c[1]);
    g.add("c", kind, {"b"}, 1, 4).set("ms", c[2]);
    g.add("sink", "bench_clock_sink", {"c"}, 1, 4);
    arrivals().clear();
    arrivals().reserve(items);
    Engine e(std::move(g), {.stats = false});
    e.run();
    double mx = *std::max_element(c.begin(), c.end()), sum = c[0] + c[1] + c[2];
    double m = steady_ms_per_item(10);
    std::printf("%8.1f %8.1f %8.1f | %10.1f %10.1f | %12.3f %8.2f\n", c[0], c[1], c[2], mx, sum, m, m / mx);
  }
}

double chain_rate(int items, int n_stages, bool stats, bool trace, bool batch = true, int threads = 0) {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{items});
  std::string prev = "src";
  for (int i = 0; i < n_stages; ++i) {
    std::string name = "p" + std::to_string(i);
    g.add(name, "bench_pass", {prev}, 1, 64);
    prev = name;
  }
  g.add("sink", "bench_drop", {prev}, 1, 64);
  EngineOptions o;
  o.stats = stats;
  o.batch = batch;
  o.threads = threads;
  auto dir = std::filesystem::temp_directory_path() / "bench_graph_run";
  if (trace) o.run_dir = dir;
  Engine e(std::move(g), o);
  auto t0 = Clock::now();
  e.run();
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  // (No remove_all: in executables linking LibTorch 2.11 it resolves to libtorch.so's copy,
  // which crashes. The files are overwritten by the next run.)
  return items / s;
}

// The plain chains' source: the items 0, 1, ..., items - 1.
auto count_to(int items, int64_t& next) {
  return [items, &next](tbb::flow_control& fc) -> Item {
    if (next >= items) {
      fc.stop();
      return {};
    }
    return Item::make<int64_t>(next++);
  };
}

// The reference for the engine's cost per hop: the same chain as plain oneTBB, with the same
// payload (an Item) and one limiter bounding the whole chain at 64 items, given back by the sink.
double plain_tbb_rate(int items, int n_stages, int threads = 0) {
  if (threads > 0) {
    tbb::task_arena arena(threads);
    return arena.execute([&] { return plain_tbb_rate(items, n_stages); });
  }
  namespace flow = tbb::flow;
  flow::graph g;
  int64_t next = 0;
  flow::input_node<Item> src(g, count_to(items, next));
  flow::limiter_node<Item> limit(g, 64);
  std::vector<std::unique_ptr<flow::function_node<Item, Item>>> pass;
  for (int i = 0; i < n_stages; ++i)
    pass.push_back(std::make_unique<flow::function_node<Item, Item>>(g, flow::serial, [](const Item& it) { return it; }));
  flow::function_node<Item, flow::continue_msg> sink(g, flow::serial, [](const Item&) { return flow::continue_msg(); });
  flow::make_edge(src, limit);
  flow::sender<Item>* prev = &limit;
  for (auto& p : pass) {
    flow::make_edge(*prev, *p);
    prev = p.get();
  }
  flow::make_edge(*prev, sink);
  flow::make_edge(sink, limit.decrementer());
  auto t0 = Clock::now();
  src.activate();
  g.wait_for_all();
  return items / std::chrono::duration<double>(Clock::now() - t0).count();
}

// The same chain as plain oneTBB with the engine's structure and no more: every edge bounded
// at 64 items by a queue_node and a limiter_node in front of its producer (the producer is
// admitted an item only while its output edge has room), the consumer giving the place back
// when it starts the item. What a per-edge bound costs in oneTBB itself, without the engine.
double plain_tbb_bounded_rate(int items, int n_stages) {
  namespace flow = tbb::flow;
  flow::graph g;
  int64_t next = 0;
  flow::input_node<Item> src(g, count_to(items, next));
  // bound[0]: src -> pass 0; bound[k + 1]: pass k -> pass k + 1 (the last: -> sink).
  std::vector<std::unique_ptr<flow::limiter_node<Item>>> bound;
  std::vector<std::unique_ptr<flow::queue_node<Item>>> queue;
  for (int k = 0; k <= n_stages; ++k) {
    bound.push_back(std::make_unique<flow::limiter_node<Item>>(g, 64));
    queue.push_back(std::make_unique<flow::queue_node<Item>>(g));
  }
  std::vector<std::unique_ptr<flow::function_node<Item, Item>>> pass;
  for (int k = 0; k < n_stages; ++k)
    pass.push_back(std::make_unique<flow::function_node<Item, Item>>(g, flow::serial, [&bound, k](const Item& it) {
      bound[static_cast<size_t>(k)]->decrementer().try_put(flow::continue_msg());
      return it;
    }));
  flow::function_node<Item, flow::continue_msg> sink(g, flow::serial, [&](const Item&) {
    bound[static_cast<size_t>(n_stages)]->decrementer().try_put(flow::continue_msg());
    return flow::continue_msg();
  });
  // src -> bound 0 -> queue 0 -> bound 1 -> pass 0 -> queue 1 -> bound 2 -> pass 1 ... -> queue n -> sink
  flow::make_edge(src, *bound[0]);
  flow::make_edge(*bound[0], *queue[0]);
  for (int k = 0; k < n_stages; ++k) {
    flow::make_edge(*queue[static_cast<size_t>(k)], *bound[static_cast<size_t>(k + 1)]);
    flow::make_edge(*bound[static_cast<size_t>(k + 1)], *pass[static_cast<size_t>(k)]);
    flow::make_edge(*pass[static_cast<size_t>(k)], *queue[static_cast<size_t>(k + 1)]);
  }
  flow::make_edge(*queue[static_cast<size_t>(n_stages)], sink);
  auto t0 = Clock::now();
  src.activate();
  g.wait_for_all();
  return items / std::chrono::duration<double>(Clock::now() - t0).count();
}

// The process's CPU time (all threads), in seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void overhead(int items, int repeats, int n_stages) {
  std::printf("\n== overhead: %d items through source -> %d x pass-through -> sink (1 worker each, capacity 64), "
              "median of %d runs, runs interleaved\n",
              items, n_stages, repeats);
  std::vector<double> off, on, tr, unbatched, plain, plain_bounded;
  for (int r = 0; r < repeats; ++r) {
    off.push_back(chain_rate(items, n_stages, false, false));
    on.push_back(chain_rate(items, n_stages, true, false));
    tr.push_back(chain_rate(items, n_stages, true, true));
    unbatched.push_back(chain_rate(items, n_stages, false, false, false));
    plain.push_back(plain_tbb_rate(items, n_stages));
    plain_bounded.push_back(plain_tbb_bounded_rate(items, n_stages));
  }
  double m_off = median(off), m_on = median(on), m_tr = median(tr), m_unb = median(unbatched), m_plain = median(plain),
         m_bounded = median(plain_bounded);
  int hops = n_stages + 1;
  std::printf("%-34s %14s %16s %10s\n", "mode", "items/s", "ns/item/hop", "vs off");
  std::printf("%-34s %14.0f %16.0f %10s\n", "stats off", m_off, 1e9 / m_off / hops, "");
  std::printf("%-34s %14.0f %16.0f %+9.1f%%\n", "stats on", m_on, 1e9 / m_on / hops, 100 * (m_on / m_off - 1));
  std::printf("%-34s %14.0f %16.0f %+9.1f%%\n", "stats on + trace + files", m_tr, 1e9 / m_tr / hops, 100 * (m_tr / m_off - 1));
  std::printf("%-34s %14.0f %16.0f %+9.1f%%\n", "stats off, batching off", m_unb, 1e9 / m_unb / hops, 100 * (m_unb / m_off - 1));
  std::printf("%-34s %14.0f %16.0f %+9.1f%%\n", "plain oneTBB chain, one limiter", m_plain, 1e9 / m_plain / hops,
              100 * (m_plain / m_off - 1));
  std::printf("%-34s %14.0f %16.0f %+9.1f%%\n", "plain oneTBB, a bound per edge", m_bounded, 1e9 / m_bounded / hops,
              100 * (m_bounded / m_off - 1));
  std::printf("engine (batching off) / plain oneTBB, time per item: %.2fx\n", m_plain / m_unb);
  std::printf("engine (batching off) / plain oneTBB with a bound per edge, time per item: %.2fx\n", m_bounded / m_unb);
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = "all";
  int items = 0, repeats = 5, n_stages = 4, threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--items" && i + 1 < argc)
      items = std::atoi(argv[++i]);
    else if (a == "--repeats" && i + 1 < argc)
      repeats = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--stages" && i + 1 < argc)
      n_stages = std::atoi(argv[++i]);
    else if (a == "overlap" || a == "overhead" || a == "hops" || a == "all")
      what = a;
    else {
      std::fprintf(stderr, "usage: bench_graph [overlap|overhead|hops|all] [--items N] [--repeats R] [--stages K] [--threads N]\n");
      return 2;
    }
  }
  std::printf("hardware threads: %u\n", std::thread::hardware_concurrency());
  if (what == "overlap" || what == "all") {
    overlap(items ? items : 150, "delay");
    overlap(items ? items : 150, "spin");
  }
  if (what == "overhead" || what == "all") overhead(items ? items : 200000, repeats, n_stages);
  if (what == "hops")  // the engine's chain, batching and stats off, beside the plain chain
    for (int r = 0, n = items ? items : 200000; r < repeats; ++r) {
      const double per = 1e9 / n / (n_stages + 1);
      double c0 = cpu_seconds();
      double e = 1e9 / chain_rate(n, n_stages, false, false, false, threads) / (n_stages + 1);
      double c1 = cpu_seconds();
      double p = 1e9 / plain_tbb_rate(n, n_stages, threads) / (n_stages + 1);
      double c2 = cpu_seconds();
      double ec = (c1 - c0) * per, pc = (c2 - c1) * per;
      std::printf("engine, batching off: %.0f ns/item/hop (CPU %.0f); plain %.0f (CPU %.0f); ratio %.2f (CPU %.2f)\n", e,
                  ec, p, pc, e / p, ec / pc);
    }
  return 0;
}
