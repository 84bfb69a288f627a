// Credits: how an edge keeps its bound (and how worker slots and pooled resources are counted).
//
// Every edge producer -> consumer holds at most `capacity` items. Its credits count the free
// places: capacity, less the items on the edge, less the places reserved for items being
// produced. The count is an atomic and is the only record: a place is taken with a
// compare-and-swap, given back with an add, and nothing else keeps a copy of it.
//
// The admission. Each stage's inputs arrive in its Admission, a receiver joined to its
// producers' ports (flow_graph.cpp), and wait there in a FIFO queue. An input goes on to the
// stage's node only after one place has been taken from each of the stage's credits: a worker
// slot, a place on each output edge, a pooled resource. So whenever the node runs an input, its
// places are already reserved, and the bound holds counting the items being produced. Places are
// taken only for an input that is there: nothing is reserved ahead of the input, and the queue
// keeps the order the inputs arrived in.
//
// Inputs are admitted by whoever queues one or gives credits back: a producer putting an item
// on an edge, a consumer taking items off an edge (places back to the producer's credits), an
// invocation that completes (its worker slot and the places it did not use), a pool (its
// resources); each then pokes the admission. The poke takes no lock: the thread that finds no
// poke in progress admits every input the credits allow, and looks again as long as other
// threads poked meanwhile, so a place that comes back while an input is being admitted is never
// overlooked; and a poke that can see nothing to admit returns without writing anything (see
// poke() for why that is safe). The admitted input is put to the node on the poking thread and
// runs as a task of its own (the nodes are never lightweight, flow_graph.cpp). The queue's lock
// is held only to push and pop, never while a node is put to.
//
// A source has a gate instead: a limiter_node between its input_node and its fan-out, whose
// count is the tokens (a decrement of 1 per admission). The gate starts full and each token
// lowers it by one; a source admits one packet at a time, so the count never leaves [0, 1] and no
// message to it is ever clamped.
//
// A stage that emits k > 1 items for one input (pack, a reader that splits a shard) needs k − 1
// more places. It takes them whether or not they are free (owe): the count goes below 0, the
// places that come back pay what is owed first, and no further input is admitted until the edge
// is back within its bound. Hence the bound the README states: an edge holds at most
// capacity + (k − 1) items, with k the largest output of one input; with several producer
// workers, at most that per worker.
//
// A source admits one packet at a time (its worker slot) and needs a free place on every edge,
// but takes none at admission: its fan-out takes as many as the packet has items, and nothing
// else takes places on a source's edges, so the places it saw free are still free. A batch (several
// cheap items in one message) is sized when it is made to the room its edges have left after
// the packets ahead of it (source_node.cpp), so a source's edges keep their bound exactly.
//
// A filtered edge out of an own-thread stage is on demand (EdgeRt::on_demand): its credits gate
// no admission, so the producer is admitted inputs whatever the edge holds, and an item the
// filter wants takes its place when it is emitted, the producer's thread waiting for one if the
// edge is full. The bound is exact.
//
// Autotune moves a bound while the graph runs: raising it adds places (and pokes), lowering it
// owes the difference, which the next places that come back pay.
#include "graph/runtime.h"

#include <algorithm>

namespace pipeline::graph {

void Credits::open(int64_t max, int64_t bound, Admission* gated) {
  max_ = std::max<int64_t>(max, 1);
  bound = std::clamp<int64_t>(bound, 1, max_);
  bound_.store(bound, std::memory_order_relaxed);
  free_.store(bound, std::memory_order_relaxed);
  gated_ = gated;
}

// Every change of a count is sequentially consistent (on x86 the same locked instruction as
// acq_rel), and so are the reads in Admission::can_admit: see poke().
bool Credits::try_take() {
  int64_t f = free_.load(std::memory_order_seq_cst);
  while (f > 0)
    if (free_.compare_exchange_weak(f, f - 1, std::memory_order_seq_cst)) return true;
  return false;
}

void Credits::owe(int64_t n) { free_.fetch_sub(n, std::memory_order_seq_cst); }

void Credits::release(int64_t n) {
  if (free_.fetch_add(n, std::memory_order_seq_cst) + n <= 0) return;  // it paid what was owed
  if (gated_) {
    gated_->poke();
    return;
  }
  { std::lock_guard wake(place_mu_); }  // a waiter between its check and its wait sees the notify
  place_freed_.notify_all();
}

void Credits::wait_for_place(std::chrono::milliseconds d) {
  std::unique_lock lock(place_mu_);
  place_freed_.wait_for(lock, d, [&] { return free_.load(std::memory_order_acquire) > 0; });
}

void Credits::set_bound(int64_t bound) {
  bound = std::clamp<int64_t>(bound, 1, max_);
  const int64_t delta = bound - bound_.exchange(bound, std::memory_order_relaxed);
  if (delta > 0)
    release(delta);
  else if (delta < 0)
    owe(-delta);
}

void Admission::open(flow::graph& g) {
  graph_ = &g;
  node_ = nullptr;
  gate_.reset();
  reserve_.clear();
  check_.clear();
}

void Admission::open_gate(flow::graph& g) {
  graph_ = &g;
  node_ = nullptr;
  reserve_.clear();
  check_.clear();
  gate_ = std::make_unique<Limiter>(g, 1);
  // Full until the first token: nothing is connected yet, so this forwards nothing.
  gate_->decrementer().try_put(-1);
}

void Admission::close() {
  gate_.reset();
  tbb::spin_mutex::scoped_lock lock(queue_mu_);
  queue_.clear();
  queued_.store(0, std::memory_order_relaxed);
}

void Admission::push(Packet&& p) {
  {
    tbb::spin_mutex::scoped_lock lock(queue_mu_);
    queue_.push_back(std::move(p));
    queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_seq_cst);  // see poke()
  }
  poke();
}

flow_internal::graph_task* Admission::try_put_task(const Packet& p) {
  push(Packet(p));
  return flow_internal::SUCCESSFULLY_ENQUEUED;  // never rejected: the producer's put is done
}

// A poke that finds nothing to admit returns at once, without touching `pokes_` (the line every
// poking thread would otherwise write). That is safe because every change that can make an
// admission possible (an input queued, a place given back) is a sequentially consistent write
// followed by can_admit()'s sequentially consistent reads: of two such changes, the later one
// in that single order sees the earlier, so when the last missing piece arrives, its thread
// sees every other piece and pokes. The one change made without a poke after it is the
// admitting thread's own: a place it took and gave back because a later one was missing
// (take_one). It looks again itself after giving it back (can_admit() before each take_one()),
// and sees any place given back meanwhile by a thread that saw the one it held as taken.
void Admission::poke() {
  if (!can_admit()) return;
  if (pokes_.fetch_add(1, std::memory_order_acq_rel) != 0) return;  // the thread admitting looks again
  int64_t seen = 1;
  for (;;) {
    if (node_) {
      // Only this thread pops: an input counted in queued_ is there. The places are taken
      // before the input is taken out, so a place that is missing leaves it first in line.
      while (can_admit() && take_one()) {
        Packet p;
        {
          tbb::spin_mutex::scoped_lock lock(queue_mu_);
          p = std::move(queue_.front());
          queue_.pop_front();
          queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_relaxed);
        }
        sent_.store(sent_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // one writer
        node_->try_put(p);  // spawns the body's task (its node is never lightweight, flow_graph.cpp)
      }
    } else {
      while (can_admit() && take_one()) {
        sent_.store(sent_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        gate_->decrementer().try_put(1);
      }
    }
    seen = pokes_.fetch_sub(seen, std::memory_order_acq_rel) - seen;
    if (seen == 0) return;
  }
}

bool Admission::can_admit() const {
  if (node_ && queued_.load(std::memory_order_seq_cst) <= 0) return false;
  for (const Credits* c : check_)
    if (c->full()) return false;
  for (const Credits* c : reserve_)
    if (c->full()) return false;
  return true;
}

bool Admission::take_one() {
  // Only the thread inside poke() takes here; owe() and try_take() elsewhere may race with it,
  // so each place is taken with a compare-and-swap and given back if a later one is missing.
  for (const Credits* c : check_)
    if (c->full()) return false;
  for (size_t i = 0; i < reserve_.size(); ++i) {
    if (reserve_[i]->try_take()) continue;
    for (size_t j = 0; j < i; ++j) reserve_[j]->untake();
    return false;
  }
  return true;
}

void EdgeRt::count_in(int64_t k) {
  int64_t n = load.fetch_add(k) + k;  // seq_cst: the end-of-stream protocol reads it (invocation.cpp)
  int64_t hw = high_water.load(std::memory_order_relaxed);
  while (n > hw && !high_water.compare_exchange_weak(hw, n, std::memory_order_relaxed)) {
  }
}

}  // namespace pipeline::graph
