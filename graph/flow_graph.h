// Building and running the oneTBB flow graph of one run (engine internals). The nodes each
// stage gets, by kind (see the design note in engine.cpp for the whole graph of gpt2.toml):
//
//   source     input_node -> gate (one packet at a time, a place free on every edge) -> fan-out
//              (multifunction, serial, a task of its own; it takes the places and gives the
//              worker slot back)
//   reading    (a source that owns a thread) input_node of tickets -> gate -> async_node: the
//   source     body asks the reader thread (source_thread.h) for a packet, which it sends
//              through the gateway -> fan-out
//   CPU stage  admission (its inputs' FIFO; puts one on once a worker slot, a place on every
//              output edge [, a pooled resource] are taken) -> multifunction_node (concurrency
//              unlimited: the admission bounds it) -> its output ports, one per consumer
//   own thread admission (worker slot 1, the edges) -> async_node: the body queues the input
//              for the stage's thread (device_thread.h), which answers through the gateway
//              -> dispatch (multifunction, lightweight) -> output ports
//   timed      as own thread, but the body runs the stage and the timer (timer.h) completes it
//   ordered    a parallel stage feeding an ordered one sends one bundle per input to a
//              sequencer_node keyed on the input's sequence number -> dispatch (serial)
//
// Every consumer's admission (or the node that numbers a merging stage's inputs) is joined to
// its producers' output ports with make_edge; a producer's invocations also put items into it
// directly (EdgeRt::admission), without the port's broadcast. The admission and a source's gate
// (a limiter_node, one packet at a time) are described in edge.cpp: an input goes on only once
// its places are taken, so a producer is admitted an input only when each of its output edges
// has room; back-pressure is an input waiting in an admission, and no TBB task ever blocks.
// Every body runs under at_site (flow_graph.cpp): an error of the engine's own code fails the
// run and cancels the graph (Runtime::fault).
#pragma once

#include <memory>

#include "graph/runtime.h"
#include "graph/timer.h"

namespace pipeline::graph {

class FlowGraph {
 public:
  /// Builds every node and edge of rt's resolved graph. Call inside the task arena that will
  /// run it (the graph binds to the current arena).
  explicit FlowGraph(Runtime& rt);
  /// Takes the nodes down (before the graph) and detaches resource pools.
  ~FlowGraph();
  FlowGraph(const FlowGraph&) = delete;
  FlowGraph& operator=(const FlowGraph&) = delete;

  /// Starts the device threads and the timer, activates the sources, and waits until every
  /// stage has passed its end of stream.
  void run();
  /// After an error of the engine's own code (Runtime::fault): cancels the flow graph's tasks
  /// and has every own-thread stage and the timer give back their reservations, so that run()
  /// returns although end of stream may never reach them. Any thread; idempotent.
  void cancel();

 private:
  void build_stage(StageRt& st);
  Runtime& rt_;
  flow::graph g_;
  Timer timer_;
  bool ran_ = false;
};

}  // namespace pipeline::graph
