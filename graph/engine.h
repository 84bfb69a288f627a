// The engine: builds a graph of registered stages (graph/stage.h) joined by bounded queues,
// from a TOML config or from code, runs it on oneTBB (plus a dedicated thread per own_thread
// stage), stops it on request, and reports stats (graph/observe/stats.h) and run-directory files.
//
// Typical use (what `pipeline run` does):
//   auto spec = graph::GraphSpec::from_config(doc);          // [stages.*] sections
//   graph::Engine engine(std::move(spec), {.run_dir = dir});  // validates: throws config::ConfigError
//   graph::LiveView view(engine, std::cerr);                  // optional (graph/observe/live_view.h)
//   // on Ctrl-C (from a thread the caller owns): engine.stop(); on a second one: engine.abort()
//   engine.run();                                             // throws graph::StageError
#pragma once

#include <any>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/config.h"
#include "graph/stage.h"
#include "graph/observe/stats.h"

namespace pipeline::graph {

/// One stage of a graph, as the TOML section [stages.NAME] or code describes it.
struct StageSpec {
  std::string name;
  std::string type;
  std::vector<std::string> inputs;  // empty: a source
  int workers = 1;   // concurrency (0: "auto": as many as the arena has, tuned)
  int capacity = 8;  // capacity of each of this stage's input edges (0: "auto", tuned)
  /// Options set from code, checked against the type's schema (defaults filled in, unknown
  /// keys rejected) when the engine is built. Ignored when `resolved` is set.
  std::map<std::string, config::Value> values;
  /// Options already resolved from a config::Document (GraphSpec::from_config).
  std::optional<config::Section> resolved;
  std::string where;  // "gpt2.toml:14" for messages; empty for code-built specs

  StageSpec& set(const std::string& key, config::Value v) {
    values[key] = std::move(v);
    return *this;
  }
};

struct GraphSpec {
  std::vector<StageSpec> stages;
  std::string file;  // config file name for messages

  StageSpec& add(std::string name, std::string type, std::vector<std::string> inputs = {}, int workers = 1,
                 int capacity = 8) {
    StageSpec s;
    s.name = std::move(name);
    s.type = std::move(type);
    s.inputs = std::move(inputs);
    s.workers = workers;
    s.capacity = capacity;
    stages.push_back(std::move(s));
    return stages.back();
  }

  /// Reads every [PREFIX.NAME] section: `type` picks the stage type, whose schema plus the
  /// common keys (type, input, workers, capacity) validate the section. Marks the sections as
  /// known in `doc`. Throws config::ConfigError naming file, line, stage and key.
  static GraphSpec from_config(const config::Document& doc, const std::string& prefix = "stages");
};

/// The first exception thrown by a stage, rethrown from Engine::run().
class StageError : public std::runtime_error {
 public:
  StageError(std::string stage, const std::string& what, std::exception_ptr original)
      : std::runtime_error("stage '" + stage + "': " + what), stage_(std::move(stage)), original_(original) {}
  const std::string& stage() const { return stage_; }
  std::exception_ptr original() const { return original_; }

 private:
  std::string stage_;
  std::exception_ptr original_;
};

/// The places where the engine's own code runs (node bodies and its threads): an error there
/// fails the run naming the stage and the place, and cancels the flow graph so that the run
/// ends even though credits and end-of-stream markers may not have settled.
enum class EngineSite : uint8_t {
  source,         // a source's input_node body (produce() and its outbox)
  fan_out,        // a source's fan-out to its consumers
  renumber,       // the node numbering the merged inputs of an order-keeping stage
  cpu,            // a CPU stage's multifunction body
  async,          // an own-thread or timed stage's async_node body
  dispatch,       // the node after an async_node, sending its outputs to their ports
  sequencer,      // the node after a sequencer, unpacking bundles in input order
  device_thread,  // an own-thread stage's thread
  timer,          // the timer thread completing held invocations
};
constexpr int kEngineSites = 9;
/// "cpu", "fan-out", ... (for messages).
const char* site_name(EngineSite site);

/// Tests only: makes the engine's own code throw at the nth pass through one site, to check that
/// an error of the engine itself fails the run instead of hanging it.
struct FaultInjection {
  EngineSite site = EngineSite::cpu;
  uint64_t nth = 0;        // 0: never
  std::string stage = {};  // only passes for this stage count (empty: every stage's)
  bool bad_alloc = false;  // throw std::bad_alloc instead of a std::runtime_error
};

struct EngineOptions {
  bool stats = true;  // per-item counters, occupancy sampling, observers, files
  std::chrono::milliseconds sample_interval{20};    // queue occupancy sampling period
  std::chrono::milliseconds report_interval{1000};  // observers called and stats.jsonl appended
  std::filesystem::path run_dir = {};               // empty: write no files
  bool trace = true;                                // trace.json in run_dir (needs stats)
  size_t trace_events_per_worker = 20000;           // trace cap: later items are not recorded
  /// After stop(): how long in-flight items may take to drain before the engine aborts
  /// (0: no limit; the drain always ends, and a second stop() aborts at once).
  std::chrono::milliseconds stop_grace{0};
  /// Threads of the task arena the CPU stages share (0: as many as the machine has cores).
  int threads = 0;
  /// The steady-state window the verdict judges: the last this many seconds, once every stage runs.
  std::chrono::milliseconds steady_window{10000};
  /// Let the engine move every CPU stage's workers and every edge's capacity toward the
  /// bottleneck while the graph runs (stages and edges set to "auto" are moved anyway).
  bool autotune = false;
  /// Let sources send several cheap items per message while every stage is cheap (an item
  /// costs well under 20 µs everywhere); capacities still count items.
  bool batch = true;
  /// What the stages of this graph are handed when they are built (StageContext::host), owned by
  /// the engine for its whole life: `pipeline run` puts its run context here. Empty by default.
  std::any host = {};
  /// Tests only (see FaultInjection).
  FaultInjection inject_fault = {};
  /// Adds the caller's own figures (a training run's loss and tokens/s: Snapshot::train) to each
  /// report before it is written to stats.jsonl and handed to the observers. Called on the
  /// monitor thread, and for the final report on the thread that ran the graph; an exception
  /// from it is ignored.
  std::function<void(Snapshot&)> annotate = {};
};

class EngineImpl;

class Engine {
 public:
  /// Validates the spec and builds the graph (stage instances are created here, so a stage's
  /// constructor errors surface now). Throws config::ConfigError on: unknown stage type (lists
  /// the known ones), unknown option, missing input, port type mismatch, cycle, bad workers.
  explicit Engine(GraphSpec spec, EngineOptions opts = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Runs until every stage drained (end of input or stop) or one failed. Call once.
  /// Throws StageError naming the first stage that threw.
  void run();
  /// Asks the sources to stop; queued items finish or are discarded as each stage declares.
  /// Any thread (it sets an atomic). A second call (or abort()) aborts at once.
  void stop();
  void abort();
  bool stop_requested() const;

  /// Current stats (thread-safe; cheap: reads relaxed counters and the sampler's histograms).
  Snapshot snapshot() const;
  /// After run(): the final snapshot, with the final verdict; before, the current stats.
  Snapshot final_snapshot() const;
  /// Verdict changes and autotune decisions so far.
  std::vector<Event> events() const;
  /// Called from the engine's monitor thread every report_interval and once at the end with
  /// the final snapshot. Add before run().
  void add_observer(std::function<void(const Snapshot&)> fn);

  /// The graph in Graphviz DOT (stage types, workers, queue capacities, port types).
  std::string dot() const;
  /// Stage names in topological order.
  std::vector<std::string> stage_names() const;
  /// Each stage's resolved options (for the start-up settings table).
  std::vector<config::Section> stage_options() const;

 private:
  std::unique_ptr<EngineImpl> impl_;
};

/// Validates a spec (types, options, inputs, ports, cycles) without building stage instances:
/// what `pipeline graph` and `pipeline check` need. Throws config::ConfigError.
void validate(const GraphSpec& spec);
/// Validates a spec as validate() does, then makes each stage type's dry run (StageType::dry_run)
/// with `host` as the stages' host: what building the stages would open and check, without
/// building them. Throws config::ConfigError, or StageError naming the stage as building would.
void dry_run(const GraphSpec& spec, const std::any& host);
/// The graph as Graphviz DOT, without building stage instances.
std::string to_dot(const GraphSpec& spec);
/// The graph drawn as text, a stage a line, top to bottom, without building stage instances.
std::string to_text(const GraphSpec& spec);

}  // namespace pipeline::graph
