// Credits: how an edge keeps its bound (and how worker slots and pooled resources are counted).
//
// Every edge producer -> consumer holds at most `capacity` items. Its credits count the free
// places: capacity, less the items on the edge, less the places reserved for items being
// produced. The count is an atomic and is the only record: a place is taken with a
// compare-and-swap, given back with an add, and nothing else keeps a copy of it.
//
// The admission. Each stage has one gate, a limiter_node between its input buffer and its node
// (flow_graph.cpp), and the gate's count is the tokens: the stage may be admitted an input for
// each token. A token is sent (a decrement of 1) only after one place has been taken from each
// of the stage's credits: a worker slot, a place on each output edge, a pooled resource. So
// whenever the limiter lets an input through, its places are already reserved, and the bound
// holds counting the items being produced. The gate starts full (raised to its threshold once,
// when it is made) and each token lowers it by one, so its count is threshold − tokens not yet
// used; tokens never outnumber the worker slots, so the count never leaves [0, threshold], no
// message to it is ever clamped, and it needs no mirror.
//
// Tokens are sent by whoever gives credits back: a consumer taking items off an edge gives
// places back to the producer's credits, an invocation that completes gives back its worker slot
// and the places it did not use, a pool its resources; each then pokes the admission they gate.
// The poke takes no lock: the thread that finds no poke in progress sends every token the
// credits allow, and looks again as long as other threads poked meanwhile, so a place that
// comes back while a token is being put together is never overlooked. The token's decrement
// forwards the stage's next input through the gate, on the poking thread (its body runs as a
// task of its own; node bodies behind a gate are never run inline, flow_graph.cpp).
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

bool Credits::try_take() {
  int64_t f = free_.load(std::memory_order_relaxed);
  while (f > 0)
    if (free_.compare_exchange_weak(f, f - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return true;
  return false;
}

void Credits::owe(int64_t n) { free_.fetch_sub(n, std::memory_order_acq_rel); }

void Credits::release(int64_t n) {
  if (free_.fetch_add(n, std::memory_order_acq_rel) + n <= 0) return;  // it paid what was owed
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

void Admission::open(flow::graph& g, int64_t tokens) {
  tokens = std::max<int64_t>(tokens, 1);
  reserve_.clear();
  check_.clear();
  gate_ = std::make_unique<Limiter>(g, static_cast<size_t>(tokens));
  // Full until the first token: nothing is connected yet, so this forwards nothing.
  gate_->decrementer().try_put(-tokens);
}

void Admission::poke() {
  if (pokes_.fetch_add(1, std::memory_order_acq_rel) != 0) return;  // the thread sending tokens looks again
  int64_t seen = 1;
  for (;;) {
    while (take_one()) {
      idle_.fetch_add(1, std::memory_order_relaxed);  // before the token: its input may arrive at once
      gate_->decrementer().try_put(1);
    }
    seen = pokes_.fetch_sub(seen, std::memory_order_acq_rel) - seen;
    if (seen == 0) return;
  }
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
