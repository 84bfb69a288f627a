// Sources that block (engine internals). A source type that declares own_thread (read_shards,
// read_tokens: they read and decompress files) produces on a thread of its own, so that no TBB
// worker ever waits for a disk, however slow the filesystem:
//
//   input_node ─[gate: 1 packet, room on every edge]─▶ async_node ═▶ reader thread ═▶ gateway ─▶ fan-out
//   (tickets)
//
// The input_node makes tickets (a body that never blocks); each ticket the source's gate
// lets through (one packet at a time, and only while every output edge has room) asks the reader
// for one packet. The reader keeps a few packets read ahead, in a bounded ring that it refills
// as the tickets take them: the buffers go round a loop of fixed size, as in oneTBB's fgbzip2
// example, and reading overlaps the stages downstream. After the end-of-stream packet has left,
// the tickets stop, and a ticket already past the gate gives its worker slot back.
//
// The reader holds a reserve_wait on the gateway from its start until it has sent the end of
// stream (or the graph is cancelled), so the flow graph's wait_for_all() covers it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "graph/runtime.h"

namespace pipeline::graph {

class SourceThread {
 public:
  /// `depth`: packets read ahead at most.
  SourceThread(Runtime& rt, StageRt& st, size_t depth = 2) : rt_(rt), st_(st), depth_(depth) {}
  ~SourceThread();
  SourceThread(const SourceThread&) = delete;
  SourceThread& operator=(const SourceThread&) = delete;

  /// Starts the thread (after the flow graph is built; it answers through `gateway`).
  void start(Gateway& gateway);
  /// The async node's body: a ticket passed the source's gate. Never blocks.
  void request();
  /// The end of stream has left: the input_node makes no more tickets.
  bool ended() const { return ended_.load(std::memory_order_acquire); }
  /// The graph is being cancelled (Runtime::fault): the thread leaves after the read in hand and
  /// gives back its reservation. Any thread.
  void cancel();
  /// Waits for the thread to finish; `cancel_first`: cancel() first.
  void join(bool cancel_first);

 private:
  void main();
  // A ticket that came after the end: the credits its admission took go back.
  void give_back_admission();

  Runtime& rt_;
  StageRt& st_;
  const size_t depth_;
  Gateway* gateway_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Packet> ready_;  // read ahead, in order (the last one may be the end of stream)
  int64_t requests_ = 0;      // tickets not answered yet
  bool read_end_ = false;     // the end-of-stream packet is in ready_
  bool sent_end_ = false;     // ... and has left
  bool cancelled_ = false;
  std::atomic<bool> ended_{false};
  std::thread thread_;
};

}  // namespace pipeline::graph
