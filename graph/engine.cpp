// The engine: a graph of stages (graph/stage.h) run as a oneTBB flow graph.
//
// DESIGN NOTE
//
// Stages are flow-graph nodes and items are messages (graph/runtime.h: Packet). A source is an
// input_node: it produces only when the edge behind it accepts (pull); a source that reads
// files produces on a thread of its own, its input_node making tickets that ask that thread
// for the next message through an async_node (graph/source_thread.h). A CPU stage is a
// multifunction_node (it emits zero, one or many items per input) fed by its admission, where
// its inputs queue. A stage that owns a thread (device work: h2d, train, log, eval, checkpoint) is an
// async_node: the body hands the input to the stage's dedicated thread through a moodycamel
// queue and returns; the thread answers through the gateway (graph/device_thread.h). A timed
// stage (delay) is an async_node completed by a timer instead of a sleeping thread
// (graph/timer.h). Producers and consumers are joined with make_edge.
//
// Every edge is bounded by its credits, an atomic count of free places, and every stage has
// one admission in front of its node: a receiver whose FIFO queue holds the stage's inputs. An
// input goes on to the node only once a worker slot, a place on each of the stage's output
// edges and, for a stage with a ResourcePool (pinned buffers), a resource have been taken for
// it (a source: a limiter_node gate, one packet at a time); the consumer gives the place back when
// it takes the item (graph/edge.cpp, which also states the bound for stages that emit several
// items per input). So the producer is admitted an input only when each of its output edges has
// room, and its concurrency and bounds can move while the graph runs. Back-pressure is
// credits: a full edge leaves its producer's input waiting in the producer's admission,
// no TBB task blocks, and the CPU stages share one task_arena sized to the machine, whatever
// their worker counts.
//
// Order: a parallel stage whose output reaches an ordered stage emits one bundle per input,
// keyed on the input's sequence number; a sequencer_node releases the bundles in input order
// and a serial dispatch node unpacks them. Every edge numbers what it carries 0, 1, 2, ..., so
// batches reach train in the same order whatever the worker counts.
//
// End of stream is a message too: a source sends it after its last item; a stage that has it
// from every input finalizes (after its other invocations) and sends its own. wait_for_all()
// returns when every stage has passed it on. stop() only sets a flag (a signal handler may call
// it): sources end, queued items finish or are discarded as each stage declares (a stage whose
// every output leads only to discarding stages discards too), and the drain always completes.
// A stage that has all the input it will use (train after its last step) winds down
// (Emitter::wind_down): it and the stages upstream of it whose outputs lead only to it (or to
// other stages that wound down) drop what is in flight towards it, and the sources among them
// stop producing, while the rest of the graph goes on; that run still ends as "done". A second
// stop(), or a drain longer than stop_grace (when one is set), aborts: stage code is no longer
// called, but the markers still flow, so the run ends. The first exception a stage
// throws aborts the run the same way and is rethrown by run() naming the stage. An exception
// out of the engine's own code (a node body, an own thread, the timer) cannot count on the
// markers: Runtime::fault records it, naming stage and place, and cancels the flow graph, and
// the threads that hold the graph open (own-thread stages, reading sources, the timer) let go.
//
// No TBB worker blocks: files are read on a source's thread, device work on a stage's thread,
// delays on the timer; no lock of ours is held while an input is put to a node; and no two threads write
// one cache line (docs/engine.md, Conventions).
//
// The graph that pipelines/gpt2.toml builds (admissions in brackets, with what each one takes:
// [w N] a worker slot of N, a number a place on that output edge, [pool N] one of pack's
// pinned buffers; a source takes one packet at a time once every edge has a place, and its
// fan-out takes the places; train's filtered edges to eval and checkpoint take theirs when a
// step goes there):
//
//   read_shards    input_node ─[1 packet, 64]─▶ async_node ═▶ reader thread ═▶ fan-out ─┐
//                  (tickets: the reads and zstd happen on the reader thread)           │
//   tokenize ×2    queue ─[w 2, 64]─▶ multifunction ─▶ sequencer ─▶ dispatch ───────┐  ◀┘
//   pack           queue ─[w 1, 2, pool 8]─▶ multifunction ───────────────────────┐  ◀┘
//   h2d            queue ─[w 1, 3]─▶ async_node ═▶ h2d thread ═▶ dispatch ──────┐  ◀┘
//   train          queue ─[w 1, 256]─▶ async_node ═▶ train thread ═▶ dispatch ─┬▶ log queue ─[w 1]─▶ async_node ═▶ log thread
//                                                (steps with eval weights) ├▶ eval queue ─[w 1]─▶ async_node ═▶ eval thread
//                                                (steps with a snapshot)   └▶ checkpoint queue ─[w 1]─▶ async_node ═▶ checkpoint thread
//
// (`pipeline graph gpt2.toml` draws the stage-level graph as Graphviz DOT.)
//
// The parts: graph_spec.cpp validates the spec, flow_graph.cpp builds and runs the flow graph
// (every node body), invocation.cpp is what a stage's node does with an input, edge.cpp the
// credits, device_thread.cpp, source_thread.cpp and timer.cpp the work that leaves the arena,
// and observe/monitor.cpp the stats (busy, device wait, starved, blocked; occupancy; stats.jsonl; trace).
#include "graph/engine.h"

#include <oneapi/tbb/task_arena.h>

#include <filesystem>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "graph/flow_graph.h"
#include "graph/observe/monitor.h"
#include "graph/runtime.h"

namespace pipeline::graph {

void Runtime::fail(const std::string& stage, std::exception_ptr e) {
  {
    std::lock_guard lock(fail_mu);
    if (fail_error) return;
    fail_stage = stage;
    fail_error = e;
  }
  abort();
}

const char* site_name(EngineSite site) {
  switch (site) {
    case EngineSite::source: return "source";
    case EngineSite::fan_out: return "fan-out";
    case EngineSite::renumber: return "renumber";
    case EngineSite::cpu: return "cpu";
    case EngineSite::async: return "async";
    case EngineSite::dispatch: return "dispatch";
    case EngineSite::sequencer: return "sequencer";
    case EngineSite::device_thread: return "device thread";
    case EngineSite::timer: return "timer";
  }
  return "?";
}

void Runtime::fault(EngineSite site, const StageRt& st, std::exception_ptr e) noexcept {
  try {
    std::lock_guard lock(fail_mu);
    if (!fail_error) {
      fail_stage = st.spec.name;
      fail_where = std::string("engine, ") + site_name(site);
      fail_error = e;
    }
  } catch (...) {
    // Out of memory for the message: the run still ends (below), as "aborted".
  }
  aborted.store(true);
  cancelled.store(true);
  std::lock_guard lock(timer_mu);
  if (flow) flow->cancel();
}

void Runtime::inject_fault(const StageRt& st) {
  if (!opts.inject_fault.stage.empty() && opts.inject_fault.stage != st.spec.name) return;
  const uint64_t pass = fault_passes.fetch_add(1) + 1;
  if (pass != opts.inject_fault.nth) return;
  if (opts.inject_fault.bad_alloc) throw std::bad_alloc();
  throw std::runtime_error(std::string("injected fault at pass ") + std::to_string(pass) + " through the " +
                           site_name(opts.inject_fault.site) + " site");
}

void Runtime::abort() {
  aborted.store(true);
  std::lock_guard lock(timer_mu);
  if (timer) timer->expire_all();
}

StageRt* Runtime::find(const std::string& name) const {
  for (const auto& st : stages)
    if (st->spec.name == name) return st.get();
  return nullptr;
}

class EngineImpl {
 public:
  EngineImpl(GraphSpec spec, EngineOptions opts, bool instantiate) : monitor(rt) {
    rt.spec = std::move(spec);
    rt.opts = std::move(opts);
    resolve_graph(rt, instantiate);
  }
  void run();
  void initialize_cpu_stages();

  Runtime rt;
  Monitor monitor;
  bool ran = false;
  std::optional<Snapshot> final_snapshot;
};

void EngineImpl::initialize_cpu_stages() {
  // Stages without a thread of their own initialize here, on the calling thread, before
  // anything runs; own-thread stages initialize on their thread (device_thread.cpp).
  for (auto& st : rt.stages) {
    if (st->kind == StageKind::own_thread) continue;
    try {
      st->stage->initialize();
    } catch (const std::exception& e) {
      throw StageError(st->spec.name, std::string("initialize: ") + e.what(), std::current_exception());
    }
  }
}

void EngineImpl::run() {
  if (ran) throw std::logic_error("Engine::run() called twice");
  ran = true;
  initialize_cpu_stages();
  if (!rt.opts.run_dir.empty()) std::filesystem::create_directories(rt.opts.run_dir);
  rt.t0 = now_ns();
  monitor.start();
  struct StopMonitor {
    Monitor& m;
    ~StopMonitor() { m.stop(); }
  } stop_monitor{monitor};

  tbb::task_arena arena(rt.threads);
  arena.execute([&] {
    FlowGraph flow_graph(rt);
    flow_graph.run();
  });
  monitor.stop();

  std::string status;
  // An error of the engine's own code names its place before the message.
  std::string where;
  {
    std::lock_guard lock(rt.fail_mu);
    if (!rt.fail_where.empty()) where = rt.fail_where + ": ";
    if (rt.fail_error) {
      try {
        std::rethrow_exception(rt.fail_error);
      } catch (const std::exception& e) {
        status = "failed: stage '" + rt.fail_stage + "': " + where + e.what();
      } catch (...) {
        status = "failed: stage '" + rt.fail_stage + "'" + (where.empty() ? "" : ": " + rt.fail_where);
      }
    } else if (rt.aborted.load()) {
      status = "aborted";
    } else if (rt.stopping()) {
      status = "stopped";
    } else {
      status = "done";
    }
  }
  monitor.set_status(status);
  Snapshot last = monitor.snapshot(true, false);
  last.verdict = analyze(last);
  monitor.annotate(last);
  final_snapshot = last;
  monitor.finish(std::move(last));
  if (rt.fail_error) {
    try {
      std::rethrow_exception(rt.fail_error);
    } catch (const std::exception& e) {
      throw StageError(rt.fail_stage, where + e.what(), rt.fail_error);
    } catch (...) {
      throw StageError(rt.fail_stage, where + "unknown exception", rt.fail_error);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Public API

Engine::Engine(GraphSpec spec, EngineOptions opts)
    : impl_(std::make_unique<EngineImpl>(std::move(spec), std::move(opts), true)) {}
Engine::~Engine() = default;
void Engine::run() { impl_->run(); }
void Engine::stop() { impl_->rt.stop_level.fetch_add(1); }
void Engine::abort() { impl_->rt.stop_level.fetch_add(2); }
bool Engine::stop_requested() const { return impl_->rt.stopping(); }
Snapshot Engine::snapshot() const { return impl_->monitor.snapshot(false, false); }
Snapshot Engine::final_snapshot() const {
  return impl_->final_snapshot ? *impl_->final_snapshot : impl_->monitor.snapshot(false, false);
}
std::vector<Event> Engine::events() const { return impl_->monitor.events(); }
void Engine::add_observer(std::function<void(const Snapshot&)> fn) { impl_->monitor.add_observer(std::move(fn)); }
std::string Engine::dot() const { return graph_dot(impl_->rt); }

std::vector<std::string> Engine::stage_names() const {
  std::vector<std::string> out;
  for (const auto& st : impl_->rt.stages) out.push_back(st->spec.name);
  return out;
}

std::vector<config::Section> Engine::stage_options() const {
  std::vector<config::Section> out;
  for (const auto& st : impl_->rt.stages) out.push_back(st->options);
  return out;
}

void validate(const GraphSpec& spec) { EngineImpl(spec, {}, false); }

void dry_run(const GraphSpec& spec, const std::any& host) {
  const EngineImpl impl(spec, {}, false);
  for (const auto& st : impl.rt.stages) {
    if (!st->type->dry_run) continue;
    const StageContext ctx{st->spec.name, st->type->name, st->max_workers, st->options, host};
    try {
      st->type->dry_run(ctx);
    } catch (const config::ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw StageError(st->spec.name, std::string("building: ") + e.what(), std::current_exception());
    }
  }
}

std::string to_dot(const GraphSpec& spec) { return graph_dot(EngineImpl(spec, {}, false).rt); }
std::string to_text(const GraphSpec& spec) { return graph_text(EngineImpl(spec, {}, false).rt); }

}  // namespace pipeline::graph
