// The device-thread adapter (engine internals). A stage that owns a thread (StageType::
// own_thread: pin, h2d, train, log, eval, checkpoint) sits behind an async_node. The node's
// body only queues the input on a moodycamel BlockingConcurrentQueue and returns; the stage's
// dedicated thread takes inputs from the queue, runs initialize(), process() and finalize()
// (so a CUDA stream, autocast state and grad mode set there stay in force), and sends its
// outputs back into the flow graph through the node's gateway. The thread holds a
// reserve_wait on the gateway from before the sources start until it has sent its end of
// stream, so the graph's wait_for_all() covers it.
//
// The queue is bounded by the stage's worker slot (one, given back when the thread takes an
// input, edge.cpp): it holds at most the next input, while the rest wait in the stage's input
// buffer, where they count against the producer's edge. A TBB worker never waits for the thread.
#pragma once

#include <concurrentqueue/blockingconcurrentqueue.h>

#include <thread>

#include "graph/runtime.h"

namespace pipeline::graph {

class DeviceThread {
 public:
  DeviceThread(Runtime& rt, StageRt& st) : rt_(rt), st_(st) {}
  ~DeviceThread();
  DeviceThread(const DeviceThread&) = delete;
  DeviceThread& operator=(const DeviceThread&) = delete;

  /// Starts the thread (after the flow graph is built; it answers through `gateway`).
  void start(Gateway& gateway);
  /// The async node's body: hands the input to the thread. Never blocks.
  void hand_over(Packet& p);
  /// Waits for the thread to finish. `cancel_first`: wake it even if its end of stream never came
  /// (the run is unwinding from an error of the engine itself).
  void join(bool cancel_first);
  /// The graph is being cancelled (Runtime::fault): the thread leaves after the input in hand and
  /// gives back its reservation, although its end of stream may never come. Any thread.
  void cancel();

 private:
  void main();
  Runtime& rt_;
  StageRt& st_;
  Gateway* gateway_ = nullptr;
  moodycamel::BlockingConcurrentQueue<Packet> queue_;
  std::thread thread_;
};

}  // namespace pipeline::graph
