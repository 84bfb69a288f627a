// Credits: how an edge keeps its bound (and how worker slots and pooled resources are counted).
//
// Every edge producer -> consumer holds at most `capacity` items. The bound is a limiter_node
// in front of the producer (flow_graph.cpp): the producer is admitted an input only while each
// of its output edges has a free credit, and that admission reserves one credit per edge. The
// credit then travels with the first item the invocation puts on the edge (or is released when
// it puts none), and comes back when the consumer takes the item off. So a stage that emits at
// most one item per input keeps its edges within `capacity` exactly, counting the items being
// produced.
//
// A stage that emits k > 1 items for one input (pack, a reader that splits a shard) needs k - 1
// more credits. It takes free ones from the limiter when there are (a negative decrement raises
// the limiter's count), and otherwise puts the items on the edge as `debt`: credits released
// later pay the debt first instead of going back to the limiter, so no further input is
// admitted until the edge is back within its bound. Hence the bound the README states: an edge
// holds at most capacity + (k - 1) items, with k the largest output of one input; with several
// producer workers, at most that per worker.
//
// The limiter's count is private, so `used` mirrors it. The mirror is exact except for
// admissions the limiter made whose invocation has not started yet; a raise is only sent when
// the mirror plus that `margin` stays under the threshold, because the limiter clamps its count
// at the threshold and a clamped raise would be lost. Releases (decrements) go out after the
// lock, since a decrement forwards the producer's next input through its limiter chain (no lock
// of ours is held across forwarding); until one arrives, the raises leave room for it
// (`unsent`). Raises go out under the lock, so that a release the mirror saw later never
// overtakes them, except for a source's edges: there a message can pull the source's next
// packet inline (its input_node body, which reads the credits under the lock), so they go out
// after it. A source admits one packet at a time (a token, given back at the end of its
// fan-out), so when a batch (several cheap items in one message) takes its extra credits in the
// fan-out, the mirrors are exact; the source sized the batch to the room left by the packet
// ahead of it.
//
// A filtered edge out of an own-thread stage is on demand (EdgeRt::on_demand): its limiter is
// in no admission chain, so the producer is admitted inputs whatever the edge holds, and an item
// the filter wants takes its credit when it is emitted (take_place), the producer's thread
// waiting for one if the edge is full. The limiter then only counts; the bound is exact.
//
// The same mechanism counts worker slots (a stage's concurrency) and pooled resources. A bound
// below the limiter's threshold is kept with phantom credits, which is how the concurrency and
// the capacity move while the graph runs (autotune): raising the bound releases phantoms,
// lowering it turns the next releases into phantoms.
#include "graph/runtime.h"

#include <algorithm>

namespace pipeline::graph {

void Credits::open(flow::graph& g, int64_t thr, int64_t bound, bool send_unlocked) {
  tbb::spin_mutex::scoped_lock lock(mu);
  threshold = std::max<int64_t>(thr, 1);
  limiter = std::make_unique<Limiter>(g, static_cast<size_t>(threshold));
  unlocked_sends = send_unlocked;
  phantoms = threshold - std::clamp<int64_t>(bound, 1, threshold);
  used.store(phantoms, std::memory_order_relaxed);
  if (phantoms > 0) limiter->decrementer().try_put(-phantoms);
}

void Credits::release(int64_t n) {
  {
    tbb::spin_mutex::scoped_lock lock(mu);
    int64_t pay = std::min(debt, n);
    debt -= pay;
    n -= pay;
    int64_t retire = std::min(retiring, n);
    retiring -= retire;
    phantoms += retire;
    n -= retire;
    if (n == 0) return;
    used.fetch_sub(n, std::memory_order_relaxed);
    unsent.fetch_add(n, std::memory_order_relaxed);
  }
  // Without the lock: the decrement forwards the producer's next input through its limiter
  // chain (and a source's may run its input_node body inline, which takes this lock). Until it
  // arrives, raises leave room for it (`unsent`).
  send_unlocked(n);
  if (on_demand) {
    { std::lock_guard wake(place_mu); }  // a waiter between its check and its wait sees the notify
    place_freed.notify_all();
  }
}

bool Credits::take_place() {
  tbb::spin_mutex::scoped_lock lock(mu);
  if (used.load(std::memory_order_relaxed) + debt >= threshold) return false;
  used.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Credits::wait_for_place(std::chrono::milliseconds d) {
  std::unique_lock lock(place_mu);
  place_freed.wait_for(lock, d, [&] {
    tbb::spin_mutex::scoped_lock credits(mu);
    return used.load(std::memory_order_relaxed) + debt < threshold;
  });
}

void Credits::send_unlocked(int64_t n) {
  limiter->decrementer().try_put(n);
  unsent.fetch_sub(n, std::memory_order_relaxed);
}

void Credits::extra(int64_t n, int64_t margin) {
  int64_t room = 0;
  {
    tbb::spin_mutex::scoped_lock lock(mu);
    room = std::clamp<int64_t>(threshold - margin - used.load(std::memory_order_relaxed) - unsent.load(std::memory_order_relaxed),
                               0, n);
    used.fetch_add(room, std::memory_order_relaxed);
    debt += n - room;
    if (room == 0) return;
    if (!unlocked_sends) {
      limiter->decrementer().try_put(-room);
      return;
    }
  }
  limiter->decrementer().try_put(-room);
}

bool Credits::try_extra(int64_t margin) {
  {
    tbb::spin_mutex::scoped_lock lock(mu);
    if (used.load(std::memory_order_relaxed) + unsent.load(std::memory_order_relaxed) + margin >= threshold) return false;
    used.fetch_add(1, std::memory_order_relaxed);
    if (!unlocked_sends) {
      limiter->decrementer().try_put(-1);
      return true;
    }
  }
  limiter->decrementer().try_put(-1);
  return true;
}

void Credits::set_bound(int64_t bound) {
  tbb::spin_mutex::scoped_lock lock(mu);
  bound = std::clamp<int64_t>(bound, 1, threshold);
  int64_t want = threshold - bound;  // phantoms wanted
  for (int64_t have = phantoms + retiring; have < want; ++have) ++retiring;
  int64_t freed = 0;
  for (int64_t have = phantoms + retiring; have > want; --have) {
    if (retiring > 0) {
      --retiring;
    } else {
      --phantoms;
      ++freed;
    }
  }
  if (freed == 0) return;
  used.fetch_sub(freed, std::memory_order_relaxed);
  unsent.fetch_add(freed, std::memory_order_relaxed);
  lock.release();
  send_unlocked(freed);
}

int64_t Credits::room() const {
  tbb::spin_mutex::scoped_lock lock(mu);
  return std::max<int64_t>(0, threshold - used.load(std::memory_order_relaxed) - unsent.load(std::memory_order_relaxed) - debt);
}

int64_t Credits::bound() const {
  tbb::spin_mutex::scoped_lock lock(mu);
  return threshold - phantoms - retiring;
}

bool Credits::full() const {
  tbb::spin_mutex::scoped_lock lock(mu);
  return used.load(std::memory_order_relaxed) + debt >= threshold;
}

void EdgeRt::count_in(int64_t k) {
  int64_t n = load.fetch_add(k) + k;  // seq_cst: the end-of-stream protocol reads it (invocation.cpp)
  int64_t hw = high_water.load(std::memory_order_relaxed);
  while (n > hw && !high_water.compare_exchange_weak(hw, n, std::memory_order_relaxed)) {
  }
}

}  // namespace pipeline::graph
