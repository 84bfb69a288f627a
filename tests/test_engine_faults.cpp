// Errors of the engine's own code (graph/flow_graph.cpp: Runtime::fault): a test-only hook
// (EngineOptions::inject_fault) throws at the nth pass through each place where the engine's
// code runs (node bodies, own threads, the timer). Every such fault must end the run with that
// error, naming the stage and the place, within seconds: never a hang, never a crash.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <set>
#include <string>
#include <vector>

#include "graph/engine.h"
#include "graph/stage.h"

using namespace pipeline;
using namespace pipeline::graph;

namespace {

// The watchdog: a run that has not ended by then hung, and the test program cannot go on.
constexpr int kWatchdogSeconds = 5;

template <class F>
void within_watchdog(F f, const std::string& what) {
  auto fut = std::async(std::launch::async, std::move(f));
  if (fut.wait_for(std::chrono::seconds(kWatchdogSeconds)) != std::future_status::ready) {
    std::fprintf(stderr, "HANG: %s did not end within %d s\n", what.c_str(), kWatchdogSeconds);
    std::fflush(stderr);
    std::_Exit(3);
  }
  fut.get();
}

// An own-thread, order-keeping pass-through (a device stage's place in a graph).
std::atomic<int64_t> g_passed{0};
class ThreadPass : public Stage {
 public:
  explicit ThreadPass(const StageContext&) {}
  void process(Item in, Emitter& out) override {
    g_passed.fetch_add(1);
    out.emit_item(std::move(in));
  }
};
PIPELINE_STAGE(fault_thread_pass, {.name = "fault_thread_pass", .doc = "own-thread ordered pass-through",
                                   .input = port<int64_t>("int"), .output = port<int64_t>("int"),
                                   .own_thread = true, .ordered = true, .factory = make_factory<ThreadPass>()});

constexpr int64_t kPerSource = 300;

// A graph with every kind of engine site: two sources (input_node body, fan-out) merged into a
// parallel CPU stage that feeds an ordered one (renumbering, CPU body, bundles through a
// sequencer), an own-thread stage (async body, its thread, dispatch) and a timed one (the
// timer). Each site passes at least 2 x kPerSource times.
GraphSpec every_site_graph() {
  GraphSpec g;
  g.add("src", "test_source").set("count", kPerSource);
  g.add("src2", "test_source").set("count", kPerSource).set("start", int64_t{100000});
  g.add("par", "spin", {"src", "src2"}, 2).set("ms", 0.0);
  g.add("ord", "fault_thread_pass", {"par"});
  g.add("late", "delay", {"ord"}).set("ms", 0.05);
  g.add("sink", "test_sink", {"late"});
  return g;
}

// The stages whose nodes contain each site in that graph.
std::set<std::string> stages_with(EngineSite site) {
  switch (site) {
    case EngineSite::source:
    case EngineSite::fan_out: return {"src", "src2"};
    case EngineSite::renumber:
    case EngineSite::cpu:
    case EngineSite::sequencer: return {"par"};
    case EngineSite::async: return {"ord", "late", "sink"};
    case EngineSite::dispatch: return {"ord", "late", "sink"};
    case EngineSite::device_thread: return {"ord"};
    case EngineSite::timer: return {"late"};
  }
  return {};
}

std::vector<EngineSite> all_sites() {
  std::vector<EngineSite> out;
  for (int i = 0; i < kEngineSites; ++i) out.push_back(static_cast<EngineSite>(i));
  return out;
}

// Runs the graph with a fault armed; returns the error the run ended with ("" if none).
std::string run_with_fault(FaultInjection fault, std::string* stage = nullptr, std::string* status = nullptr) {
  EngineOptions opts;
  opts.batch = false;  // one item per packet: the passes per site are known
  opts.inject_fault = std::move(fault);
  Engine e(every_site_graph(), opts);
  std::string error;
  within_watchdog(
      [&] {
        try {
          e.run();
        } catch (const StageError& err) {
          error = err.what();
          if (stage) *stage = err.stage();
        }
      },
      std::string("a fault at the ") + site_name(opts.inject_fault.site) + " site, pass " +
          std::to_string(opts.inject_fault.nth));
  if (status) *status = e.final_snapshot().status;
  return error;
}

}  // namespace

TEST_CASE("without a fault the every-site graph runs to the end") {
  g_passed = 0;
  std::string status;
  CHECK(run_with_fault({}, nullptr, &status).empty());
  CHECK(status == "done");
  CHECK(g_passed.load() == 2 * kPerSource);
}

TEST_CASE("a fault at any engine site, at any pass, ends the run with that error, naming stage and place") {
  for (EngineSite site : all_sites()) {
    for (uint64_t nth : {uint64_t{1}, uint64_t{2}, uint64_t{97}, uint64_t{2 * kPerSource - 1}}) {
      CAPTURE(site_name(site));
      CAPTURE(nth);
      std::string stage, status;
      const std::string error = run_with_fault({.site = site, .nth = nth}, &stage, &status);
      CHECK(error.find(std::string("engine, ") + site_name(site) + ": injected fault at pass " + std::to_string(nth)) !=
            std::string::npos);
      CHECK(stages_with(site).count(stage) == 1);
      CHECK(status.rfind("failed: stage '" + stage + "': engine, ", 0) == 0);
    }
  }
}

TEST_CASE("std::bad_alloc out of the engine's own code fails the run too") {
  for (EngineSite site : all_sites()) {
    CAPTURE(site_name(site));
    std::string stage;
    const std::string error = run_with_fault({.site = site, .nth = 3, .bad_alloc = true}, &stage);
    CHECK(error.find(std::string("engine, ") + site_name(site) + ": ") != std::string::npos);
    CHECK(error.find("bad_alloc") != std::string::npos);
  }
}

TEST_CASE("a fault armed for one stage counts only that stage's passes") {
  std::string stage;
  const std::string error =
      run_with_fault({.site = EngineSite::async, .nth = 5, .stage = "sink"}, &stage);
  CHECK(stage == "sink");
  CHECK(error.find("engine, async: injected fault at pass 5") != std::string::npos);
  // A stage that is not in the graph: never armed, the run ends normally.
  std::string status;
  CHECK(run_with_fault({.site = EngineSite::cpu, .nth = 1, .stage = "absent"}, nullptr, &status).empty());
  CHECK(status == "done");
}
