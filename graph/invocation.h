// What happens when a stage runs (engine internals): the node bodies that flow_graph.cpp
// installs (stage_node.cpp, source_node.cpp) call these. One Invocation is one produce(), process() or end of stream of a stage:
// it owns a worker slot, the credits its admission reserved on each output edge, and the
// outputs it emits; complete() settles all of that and, after the last input, finalizes the
// stage and sends the end of stream downstream.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "graph/runtime.h"

namespace pipeline::graph {

/// How an invocation's outputs leave its node.
enum class Delivery {
  ports,    // a CPU stage: the multifunction node's output ports (inside its body)
  gateway,  // an async node (own thread, timed): its gateway, then its dispatch node
  outbox,   // a source: the stage's outbox, handed to the flow graph one item per call
};

class Invocation {
 public:
  Invocation(Runtime& rt, StageRt& st, Delivery delivery, Gateway* gateway, uint64_t seq);
  ~Invocation();
  Invocation(const Invocation&) = delete;
  Invocation& operator=(const Invocation&) = delete;

  /// The invocation running stage code on this thread (for ResourcePool), or null.
  static Invocation* current();

  /// Runs process() on one input (dropped after a failure; discarded on stop by stages that
  /// discard on stop, and by a stage that wound down).
  void process(Item item);
  /// The input is a batch of `items` items (process() follows for each): the outputs are
  /// batched per edge too, and the cost of an item is measured.
  void take_batch(int64_t items);
  /// An end-of-stream marker from one input: after the last one, finalize (now, or when the
  /// stage's other invocations are done) and pass the end of stream on.
  void end_of_input();
  /// A source's produce() call; false at the end of its input.
  bool produce();
  /// A source's end: finalize() into the outbox.
  void finalize_source();
  /// Settles the invocation: outputs leave, unused credits go back, the slot is freed.
  void complete();
  /// A timed stage asked to be completed later (Emitter::hold_for); when, in now_ns() time.
  bool held() const { return hold_until_ != 0; }
  int64_t hold_until() const { return hold_until_; }
  Gateway* gateway() const { return gateway_; }

  // The Emitter's side.
  void emit(Item item);
  void hold_for(std::chrono::nanoseconds d);
  void add_device_wait(std::chrono::nanoseconds d);
  Runtime& runtime() const { return rt_; }
  StageRt& stage() const { return st_; }
  /// ResourcePool::acquire: uses the resource the admission reserved (false: none left).
  bool take_resource_reservation();
  /// ResourcePool::try_acquire: one more resource credit if the gate has one.
  bool extra_resource();
  /// The thread CPU time of stage code, sampled (stats): the weight of this invocation's
  /// sample (0: not sampled), and the time measured.
  int cpu_weight() const { return cpu_weight_; }
  void add_cpu(int64_t ns) { c_->cpu_ns.store(c_->cpu_ns.load(std::memory_order_relaxed) + ns * cpu_weight_, std::memory_order_relaxed); }

 private:
  void put(EdgeRt* e, Packet p);
  void deliver(EdgeRt* e, Packet p);
  void send(Packet& p);
  void emit_end_of_stream();
  void finalize_and_end(bool deferred);
  void flush();
  void flush_batches();
  void flush_batch(size_t output);
  void wait_for_place(EdgeRt* e);

  Runtime& rt_;
  StageRt& st_;
  Delivery delivery_;
  Gateway* gateway_;
  uint64_t seq_;
  int slot_ = 0;
  SlotCounters* c_ = nullptr;
  int64_t t_start_ = 0;
  int64_t hold_until_ = 0;
  std::array<bool, kMaxOutputs> reserved_{};  // the admission's credit on each output, unused so far
  bool resource_reserved_ = false;
  bool counted_running_ = false;
  bool skip_bundle_ = false;  // the deferred end of stream: another invocation sends its bundle
  std::shared_ptr<Bundle> bundle_;  // order-keeping parallel stages
  std::vector<Packet> held_;        // timed stages: outputs that leave at completion
  bool batching_ = false;           // the input was a batch: outputs leave as one packet per edge
  // Per output edge, the batch being filled (sized only when batching: most invocations never
  // batch, and clearing kMaxOutputs pointers on every one costs more than the hop's own work).
  std::vector<std::shared_ptr<std::vector<Item>>> out_batch_;
  int64_t items_ = 0;               // inputs processed (for the cost of an item)
  int cpu_weight_ = 0;
};

/// Gives a packet its place on its edge: edges number their packets and their items 0, 1, 2, ...
/// in the order the consumer receives them (so a bundle's items are numbered when the sequencer
/// releases them).
void stamp(EdgeRt* e, Packet& p);
/// Averages the cost of one item into the stage's moving average (sources read it to decide
/// whether to batch).
void note_item_cost(StageRt& st, int64_t ns, int64_t items);

// The node bodies, by kind: stage_node.cpp (CPU, async, dispatch) and source_node.cpp.

/// One input through a stage: takes it off its edge, runs it (or its end of stream) and
/// completes the invocation, or, for a timed stage that held it, leaves it to the timer.
void run_packet(Runtime& rt, StageRt& st, Packet& p, Delivery delivery, Gateway* gateway);
/// A source's next packet (its items, then its end-of-stream marker; nothing after that): runs
/// produce() and finalize() as needed. The input_node body, or a source thread's reads.
std::optional<Packet> next_source_packet(Runtime& rt, StageRt& st);
/// A source's input_node body.
Packet run_source(Runtime& rt, StageRt& st, tbb::flow_control& fc);
/// A source's fan-out node (after its gate): one packet to every consumer that wants it.
void fan_out_source(StageRt& st, const Packet& p);
/// The node after an async node or a sequencer: sends each packet to its edge's port.
void dispatch(StageRt& st, const Packet& p);

}  // namespace pipeline::graph
