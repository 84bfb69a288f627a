// The engine's runtime state, shared by its parts (engine internals; stages never see it):
//   graph_spec.cpp   validates the spec and resolves it into stages and edges
//   flow_graph.cpp   builds and runs the oneTBB flow graph (nodes and edges; node bodies)
//   invocation.cpp   what happens when a stage runs: taking inputs, emitting, credits, end of stream
//   stage_node.cpp   the bodies of CPU, async and dispatch nodes; source_node.cpp: a source's
//   source_thread.*  sources that read files: an async_node answered by a reader thread
//   edge.cpp         an edge's credits (its bound), load and high-water mark
//   device_thread.*  own-thread stages: an async_node feeding a dedicated thread (moodycamel queue)
//   timer.*          held invocations (delay): an async_node completed by a timer thread
//   observe/         monitor (sampling, snapshots, stats.jsonl, observers, trace), verdict, ...
//   engine.cpp       the public Engine: construction, run, stop, errors
// See engine.cpp for the design note with the graph that gpt2.toml builds.
#pragma once

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/spin_mutex.h>
#include <oneapi/tbb/version.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/cache_line.h"
#include "graph/engine.h"
#include "graph/stage.h"

namespace pipeline::graph {

namespace flow = tbb::flow;

// The namespace of the flow graph's internals that a receiver's try_put_task names (graph_task,
// SUCCESSFULLY_ENQUEUED): oneTBB 2022.0 moved them from tbb::detail::d1 to d2 (2021.5 to 2021.13
// have d1; 2022.0 to 2023.0 have d2). CMakeLists.txt refuses a oneTBB older than 2021.5, and
// tools/check_onetbb.sh builds the engine and its tests against 2022.
#if TBB_VERSION_MAJOR >= 2022
namespace flow_internal = tbb::detail::d2;
#else
namespace flow_internal = tbb::detail::d1;
#endif

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Most consumers one stage may feed: the width of a multifunction node's output-port tuple.
constexpr int kMaxOutputs = 8;

struct EdgeRt;
struct Bundle;

/// The message on every flow-graph edge: one item, several items (a cheap source's batch and
/// what the stages downstream make of it), an end-of-stream marker, or (between a parallel
/// stage and its sequencer) everything one invocation emitted.
struct Packet {
  enum class Kind : uint8_t { item, items, eos, bundle };
  Kind kind = Kind::item;
  EdgeRt* edge = nullptr;  // the edge it travels on (null on a source's way to its fan-out)
  uint64_t seq = 0;        // its place among the packets on its edge; bundles: the input packet's
  Item item;                                 // Kind::item
  std::shared_ptr<std::vector<Item>> items;  // Kind::items
  std::shared_ptr<Bundle> bundle;            // Kind::bundle
  /// How many places on an edge it takes: its items, or 1 for an end-of-stream marker.
  int64_t count() const {
    return kind == Kind::items ? static_cast<int64_t>(items->size()) : kind == Kind::bundle ? 0 : 1;
  }
};

/// The outputs of one invocation of an order-keeping parallel stage, in emission order.
struct Bundle {
  std::vector<std::pair<EdgeRt*, Packet>> outs;
};

using Ports = std::tuple<Packet, Packet, Packet, Packet, Packet, Packet, Packet, Packet>;
static_assert(std::tuple_size_v<Ports> == kMaxOutputs);
using CpuNode = flow::multifunction_node<Packet, Ports>;
using RouteNode = flow::multifunction_node<Packet, Ports, flow::lightweight>;
// A source's fan-out runs as a task of its own: run inline inside its gate's try_put
// (lightweight), the token it sends when it gives the worker slot back would re-enter the gate
// that holds its successor lock, and deadlock.
using SourceRouteNode = flow::multifunction_node<Packet, Ports, flow::queueing>;
using OrderedRouteNode = flow::multifunction_node<Packet, Ports, flow::queueing_lightweight>;
using OutPort = std::remove_reference_t<decltype(flow::output_port<0>(std::declval<CpuNode&>()))>;
// Numbers a merging stage's inputs in the order they reach its admission. A multifunction
// node, because it puts inside its body: a serial function_node lets the next body start
// before the previous output has been put (oneTBB spawns the postponed task first), so its
// outputs can overtake each other, and a packet admitted ahead of a smaller number could fill
// the edge behind the sequencer while the smaller one waits for a credit: a deadlock.
using RenumberNode = flow::multifunction_node<Packet, std::tuple<Packet>>;
using AsyncNode = flow::async_node<Packet, Packet>;
using Gateway = AsyncNode::gateway_type;
using Limiter = flow::limiter_node<Packet, long long>;
using Source = flow::input_node<Packet>;
using Sequencer = flow::sequencer_node<Packet>;

class Admission;

/// A count of free places: an edge's credits (its bound), a stage's worker slots, or its pool's
/// resources. The count is the truth; nothing mirrors it. See edge.cpp. On a cache line of its
/// own: the producer, the consumer and whichever thread sends the stage's tokens all write it.
class alignas(kCacheLine) Credits {
 public:
  /// The count starts at `bound` (in [1, max]); `gated`: the admission these credits gate, told
  /// when some come back (null: none, an on-demand edge).
  void open(int64_t max, int64_t bound, Admission* gated);
  /// Takes one place if one is free; never owes.
  bool try_take();
  /// Gives back a place try_take() took, telling no one (an admission that could not take all
  /// the places it needs puts back the ones it took; nothing waited for them meanwhile).
  void untake() { free_.fetch_add(1, std::memory_order_seq_cst); }
  /// Takes `n` places, free or not: those beyond the bound are owed, and the places that come
  /// back pay them before any admission sees them (a stage that emits several items per input).
  void owe(int64_t n);
  /// `n` places are free again (items taken off the edge, a reservation not used, a worker slot
  /// or a resource given back). Never blocks; any thread.
  void release(int64_t n = 1);
  /// Waits (a dedicated thread, never a TBB worker) until a place may be free, at most `d`.
  void wait_for_place(std::chrono::milliseconds d);
  /// Moves the bound to `bound`, in [1, max]: lowering it owes the difference.
  void set_bound(int64_t bound);
  int64_t bound() const { return bound_.load(std::memory_order_relaxed); }
  /// Places free now (never below 0).
  int64_t room() const { return std::max<int64_t>(0, free_.load(std::memory_order_acquire)); }
  /// No place for the next input: none free, and none held by an input admitted that has not
  /// started yet (`held`; such a place is as good as free: the monitor does not call the stage
  /// blocked on it).
  bool full(int64_t held = 0) const { return free_.load(std::memory_order_seq_cst) + held <= 0; }

 private:
  std::atomic<int64_t> free_{0};  // free places; below 0: owed
  std::atomic<int64_t> bound_{0};
  int64_t max_ = 0;
  Admission* gated_ = nullptr;
  // An on-demand edge (no admission): release() wakes wait_for_place().
  std::mutex place_mu_;
  std::condition_variable place_freed_;
};

/// What admits inputs to one stage, and the credits each admission takes. A stage with inputs
/// receives them here (the admission is the receiver its producers' ports are joined to): they
/// wait in a FIFO queue, and each one is put to the stage's node only once one place of every
/// credit it needs has been taken, so the node runs exactly the inputs the credits allow. A
/// source has a gate instead, a limiter_node between its input_node and its fan-out whose count
/// is those tokens (the input_node makes its packet when the gate pulls it). See edge.cpp.
///
/// A receiver of oneTBB's own interface (try_put_task is its protected virtual), because a
/// queue_node and a limiter_node in front of every stage cost two spawned tasks, five spin locks
/// and an edge reversal per item when the stage is busy; this costs one short lock to queue an
/// item and one to take it out, and one task, the node's body.
class Admission final : public flow::receiver<Packet> {
 public:
  /// Queues an input (a producer that knows this admission puts it here directly, moving it:
  /// EdgeRt::admission) and admits what the credits allow.
  void push(Packet&& p);
  /// A stage with inputs: they queue here until admitted, then go to the node admit_to() names.
  void open(flow::graph& g);
  void admit_to(flow::receiver<Packet>& node) { node_ = &node; }
  /// A source: creates the gate (its threshold is 1 packet at a time).
  void open_gate(flow::graph& g);
  /// Every admission takes one place of `c` (worker slots, the stage's output edges, its pool).
  void reserve(Credits& c) { reserve_.push_back(&c); }
  /// Every admission needs a free place of `c` but takes none: a source's edges, whose places its
  /// fan-out takes (one packet at a time, so nothing takes them in between).
  void check(Credits& c) { check_.push_back(&c); }
  /// Some credits came back, or an input arrived: admits what the credits allow. Any thread;
  /// never blocks, no lock held while it puts. Whoever frees a credit or queues an input calls
  /// it after doing so (edge.cpp: why a poke that finds nothing to admit may return at once).
  void poke();
  /// An admitted input reached an own-thread or timed stage's node (a CPU stage's invocations
  /// count theirs per worker slot, SlotCounters::started).
  void used() { used_.fetch_add(1, std::memory_order_relaxed); }
  /// Inputs admitted so far, and of those, counted by used().
  int64_t sent() const { return sent_.load(std::memory_order_relaxed); }
  int64_t used_count() const { return used_.load(std::memory_order_relaxed); }
  Limiter& gate() { return *gate_; }
  void close();

 protected:
  flow_internal::graph_task* try_put_task(const Packet& p) override;
  flow::graph& graph_reference() const override { return *graph_; }

 private:
  bool can_admit() const;
  bool take_one();
  flow::graph* graph_ = nullptr;
  flow::receiver<Packet>* node_ = nullptr;  // null: a source (gate_)
  std::unique_ptr<Limiter> gate_;
  std::vector<Credits*> reserve_, check_;
  // The queue: written by producers (push) and the thread admitting (pop). `queued_` is its
  // size, stored under the lock, read without it: only the admitting thread pops, so an item it
  // sees counted is there.
  alignas(kCacheLine) tbb::spin_mutex queue_mu_;
  std::deque<Packet> queue_;
  std::atomic<int64_t> queued_{0};
  // poke()s not yet looked at; the thread that moves it from 0 admits (edge.cpp). `sent_`: on
  // the pokes' line, written only by the thread admitting.
  alignas(kCacheLine) std::atomic<int64_t> pokes_{0};
  std::atomic<int64_t> sent_{0};
  alignas(kCacheLine) std::atomic<int64_t> used_{0};  // written by the node's bodies
};

/// An edge producer -> consumer: its credits (its bound), load, sequence numbers and samples.
/// On cache lines of its own (edges are written by their producers and consumers, each edge by
/// other threads), and the monitor's samples on their own lines again.
struct alignas(kCacheLine) EdgeRt {
  size_t producer = 0, consumer = 0;  // stage indices (topological order)
  int out_index = 0;                  // the producer's output port
  // The consumer's admission, where the producer's invocations put items directly (moved, not
  // through the port's broadcast); null when a renumbering node stands in between.
  Admission* admission = nullptr;
  std::function<bool(const Item&)> accepts;  // the consumer's routing filter
  // A filtered edge out of an own-thread stage (train -> eval, checkpoint): its credit is taken
  // when an item the filter wants is emitted, not at admission, so a step that carries no eval
  // work never waits on eval's edge; one that does waits on the producer's thread for a place.
  bool on_demand = false;
  bool batches = false;  // may carry several items per packet: the consumer is a single-worker CPU stage
  bool tune_capacity = false;  // the autotuner may move the bound (capacity = "auto", [run] autotune)
  int start_capacity = 8, max_capacity = 8;
  Credits credits;

  // Written by the producer and the consumer.
  alignas(kCacheLine) std::atomic<int64_t> load{0};  // items (and end markers) on the edge now
  std::atomic<int64_t> held{0};      // of those, held by the producer (a bundle waiting for its turn, a timer)
  std::atomic<int64_t> in_order{0};  // of those, in bundles waiting for their turn in order
  // Written by the producer only (its workers): on a line the consumer does not write.
  alignas(kCacheLine) std::atomic<int64_t> high_water{0};
  std::atomic<uint64_t> next_seq{0};     // items' sequence numbers on this edge: 0, 1, 2, ...
  std::atomic<uint64_t> next_packet{0};  // packets' sequence numbers on this edge

  // Monitor-owned occupancy samples (cumulative, so that a window is a difference).
  alignas(kCacheLine) std::vector<uint64_t> hist;
  uint64_t samples = 0, full_n = 0, empty_n = 0;
  double sum = 0;
  double window_sum = 0, last_window_mean = 0;
  uint64_t window_n = 0;

  /// `n` items put onto the edge (load and high-water mark).
  void count_in(int64_t n = 1);
  /// The consumer took a packet of `n` items (or one marker) off the edge.
  void take(int64_t n) {
    load.fetch_sub(n);  // seq_cst: the end-of-stream protocol reads it (invocation.cpp)
    credits.release(n);
  }
  int capacity() const { return static_cast<int>(credits.bound()); }
};

/// Per worker slot: written only by the invocation holding the slot, read by the monitor. On
/// lines of its own: the slots of one stage are written by different threads at once.
struct alignas(kCacheLine) SlotCounters {
  std::atomic<uint64_t> in{0}, out{0}, discarded{0};
  std::atomic<int64_t> busy_ns{0}, cpu_ns{0}, device_wait_ns{0};
  std::atomic<int64_t> busy_since{0};  // an invocation in progress since (0: idle)
  std::atomic<uint64_t> started{0};     // invocations of admitted inputs (a CPU stage's; Admission::used)
  std::atomic<uint64_t> cost_samples{0};  // invocations, to time one in 16 when stats are off
  std::atomic<uint64_t> cpu_samples{0};   // invocations, to read the thread CPU clock on some of them
  struct TraceEvent {
    int64_t start_ns, dur_ns;
  };
  std::vector<TraceEvent> trace;
  size_t trace_cap = 0;
};

enum class StageKind { source, cpu, own_thread, timed };

struct StageRt;
class DeviceThread;
class SourceThread;

/// One running stage: its instance, its nodes, its edges and its counters. On cache lines of its
/// own: a stage's workers write its counters, and no other stage's threads share the lines.
struct alignas(kCacheLine) StageRt {
  size_t index = 0;
  StageSpec spec;
  const StageType* type = nullptr;
  config::Section options;
  std::unique_ptr<Stage> stage;
  StageKind kind = StageKind::cpu;
  std::vector<EdgeRt*> inputs, outputs;
  std::type_index out_type = typeid(void);
  bool checks_out_type = false;  // out_type is known: emit() checks every item against it
  std::string out_port;
  bool ordered_commit = false;  // parallel and feeding an ordered stage: bundles + sequencer
  bool renumber_input = false;   // several inputs and ordered_commit: a serial node numbers them
  bool discard_on_stop = false;  // drops queued inputs on a stop request (graph_spec.cpp)
  int max_workers = 1;          // worker slots (the gate's threshold)
  int start_workers = 1;        // the concurrency the run starts with
  bool tune_workers = false;    // the autotuner may move the concurrency (workers = "auto", [run] autotune)
  std::shared_ptr<ResourcePool> pool;

  // Nodes (flow_graph.cpp).
  std::unique_ptr<RenumberNode> renumber;
  Admission admission;   // where inputs wait for their credits (a source: its gate), and what each admission takes
  Credits worker_slots;  // up to max_workers; the bound is `workers` (a source: 1 packet at a time)
  Credits resources;     // the pool's resources, when the stage has a ResourcePool
  std::unique_ptr<Source> source;
  std::unique_ptr<CpuNode> cpu;
  std::unique_ptr<AsyncNode> async;
  std::unique_ptr<Sequencer> sequencer;
  std::unique_ptr<RouteNode> route;
  std::unique_ptr<SourceRouteNode> source_route;
  std::unique_ptr<OrderedRouteNode> ordered_route;
  std::array<OutPort*, kMaxOutputs> ports{};  // where items leave for each output edge
  OutPort* bundle_port = nullptr;             // a CPU order-keeping stage: to its sequencer
  std::unique_ptr<DeviceThread> device;
  std::unique_ptr<SourceThread> reader;  // a source that produces on a thread of its own (own_thread)

  // Worker slots: which of [0, max_workers) are free.
  tbb::spin_mutex slot_mu;
  std::vector<int> free_slots;

  // End of stream (invocation.cpp: who finalizes, without a lock).
  std::atomic<int> eos_seen{0};
  std::atomic<int> running{0};  // invocations in progress (also read by the monitor)
  std::atomic<int> placing{0};  // of those, waiting for a place on an on-demand edge (blocked, not busy)
  std::atomic<bool> finalize_pending{false};
  uint64_t eos_seq = 0;  // the deferred end-of-stream invocation's bundle seq (before finalize_pending)
  std::atomic<bool> done{false};
  std::atomic<uint64_t> input_seq{0};  // renumbering of merged inputs
  // Has all the input it will use (wind_down): the stage itself said so, or every stage its
  // outputs lead to did. A source stops producing; whatever reaches the stage is dropped.
  std::atomic<bool> wound_down{false};

  // Sources: items produced but not yet handed to the flow graph (one produce() call's output).
  std::vector<Item> outbox;
  size_t outbox_next = 0;
  enum class SourceState { producing, finalizing, ending, ended };
  SourceState source_state = SourceState::producing;
  // Items the source produced that its fan-out has not taken yet: they will take as many places
  // on every edge (next_source_packet sizes a batch to the room they leave).
  std::atomic<int64_t> source_pending_items{0};

  std::vector<std::unique_ptr<SlotCounters>> counters;  // per worker slot
  std::atomic<int64_t> start_ns{0}, end_ns{0};
  std::atomic<int64_t> device_busy_ns{0};
  std::atomic<bool> device_busy_gpu{false};  // device_busy_ns measured with GPU events

  // Cost of one item (ns, a moving average over invocations that measured it): sources batch
  // cheap items (flow_graph.h), and only while every stage is cheap.
  std::atomic<int64_t> item_cost_ns{0};
  std::atomic<int> batch{1};  // sources: items per packet now
  int batch_max = 1;          // sources: at most this many (half the smallest output capacity, <= 64)
  uint64_t bodies = 0;        // sources: input_node body calls, to revise `batch` now and then

  // Monitor-owned idle classification (seconds of idle worker time by cause).
  double idle_starved_w = 0, idle_blocked_w = 0, idle_order_w = 0, idle_ready_w = 0;
  std::atomic<int64_t> first_ns{0};      // when the stage first took an input (a source: produced)

  StageRt();
  ~StageRt();  // out of line: DeviceThread and SourceThread are complete in flow_graph.cpp
  bool is_source() const { return kind == StageKind::source; }
  bool is_sink() const { return type->output.none(); }
};

/// Everything the engine's parts share for one run.
struct Runtime {
  GraphSpec spec;
  EngineOptions opts;
  std::vector<std::unique_ptr<StageRt>> stages;  // topological order
  std::vector<std::unique_ptr<EdgeRt>> edges;
  bool tracing = false;
  int threads = 1;  // the arena's size

  std::atomic<int> stop_level{0};
  std::atomic<bool> aborted{false};
  // The flow graph was cancelled (Runtime::fault): its tasks may never run again, so nothing may
  // wait for a consumer to take an item. After any other failure the graph still drains.
  std::atomic<bool> cancelled{false};
  int64_t t0 = 0;
  // Guards timer and flow (an abort may come from the monitor, a fault from any thread, during
  // teardown).
  std::mutex timer_mu;
  class Timer* timer = nullptr;     // held invocations (timed stages), while the flow graph exists
  class FlowGraph* flow = nullptr;  // the flow graph, while it exists (Runtime::fault cancels it)

  std::mutex fail_mu;
  std::string fail_stage;
  std::string fail_where;  // "engine, cpu" for an error of the engine's own code; empty for stage code
  std::exception_ptr fail_error;
  std::atomic<uint64_t> fault_passes{0};  // FaultInjection: passes through the armed site so far

  /// Records the first error (later ones are dropped) and aborts the run.
  void fail(const std::string& stage, std::exception_ptr e);
  /// An error of the engine's own code at `site`, in `st`'s nodes: records it as fail() does,
  /// naming the place, and cancels the flow graph (own-thread stages and held invocations give
  /// back their reservations), because the credits and end-of-stream markers of the node that
  /// threw may never settle, and the run must end all the same.
  void fault(EngineSite site, const StageRt& st, std::exception_ptr e) noexcept;
  /// Tests only: throws when `site` is armed (EngineOptions::inject_fault) and this is its nth pass.
  void fault_point(EngineSite site, const StageRt& st) {
    if (opts.inject_fault.nth != 0 && opts.inject_fault.site == site) [[unlikely]]
      inject_fault(st);
  }
  void inject_fault(const StageRt& st);
  /// Ends the run early: sources stop, stages drop what reaches them, held items leave at once.
  void abort();
  bool failing() const { return aborted.load(std::memory_order_relaxed); }
  bool stopping() const { return stop_level.load(std::memory_order_relaxed) > 0; }
  bool graph_cancelled() const { return cancelled.load(std::memory_order_relaxed); }
  StageRt* find(const std::string& name) const;
};

/// `st` has all the input it will use (Emitter::wind_down), and so has every stage upstream of it
/// whose outputs all lead to stages that have theirs (invocation.cpp): sources among them stop
/// producing, and what is in flight towards them is dropped. Stages elsewhere in the graph go on.
void wind_down(Runtime& rt, StageRt& st);

/// Validates rt.spec and fills rt.stages and rt.edges (graph_spec.cpp); with `instantiate`,
/// also builds the stage instances. Throws config::ConfigError or StageError.
void resolve_graph(Runtime& rt, bool instantiate);
/// The resolved graph in Graphviz DOT.
std::string graph_dot(const Runtime& rt);
/// The graph drawn as text, top to bottom (`pipeline graph --text`).
std::string graph_text(const Runtime& rt);

}  // namespace pipeline::graph
