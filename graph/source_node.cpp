// The bodies of a source's nodes (engine internals): what its input_node (or its reader thread,
// source_thread.h) does to make the next packet, and its fan-out to the consumers.
#include <algorithm>
#include <optional>

#include "graph/invocation.h"

namespace pipeline::graph {

namespace {

// How many items a source puts in one packet: as many as about 20 µs of the costliest stage's
// work (so a batch never keeps expensive items from parallel workers), within batch_max (half
// the smallest capacity of its output edges, at most 64: two packets fit on every edge). Until
// every stage has measured its cost, 1.
int source_batch(const Runtime& rt, StageRt& st) {
  if (st.batch_max <= 1) return 1;
  if (st.bodies++ % 32 != 0) return st.batch.load(std::memory_order_relaxed);
  int64_t worst = 0;
  bool unknown = false;
  for (const auto& s : rt.stages) {
    int64_t c = s->item_cost_ns.load(std::memory_order_relaxed);
    unknown |= c == 0;
    worst = std::max(worst, c);
  }
  int k = unknown ? 1 : static_cast<int>(std::clamp<int64_t>(20'000 / std::max<int64_t>(worst, 1), 1, st.batch_max));
  k = std::min(k, st.batch_max);
  st.batch.store(k, std::memory_order_relaxed);
  return k;
}

// The next `n` items of a source's outbox as one packet.
Packet take_from_outbox(StageRt& st, size_t n) {
  Packet p;
  if (n == 1) {
    p.item = std::move(st.outbox[st.outbox_next++]);
    return p;
  }
  p.kind = Packet::Kind::items;
  p.items = std::make_shared<std::vector<Item>>();
  p.items->reserve(n);
  for (size_t i = 0; i < n; ++i) p.items->push_back(std::move(st.outbox[st.outbox_next++]));
  return p;
}

}  // namespace

Packet run_source(Runtime& rt, StageRt& st, tbb::flow_control& fc) {
  std::optional<Packet> p = next_source_packet(rt, st);
  if (!p) {
    fc.stop();
    return {};
  }
  return std::move(*p);
}

std::optional<Packet> next_source_packet(Runtime& rt, StageRt& st) {
  size_t k = static_cast<size_t>(source_batch(rt, st));
  if (k > 1) {
    // No more than the edges have places for after the packets ahead of it (made, not yet
    // fanned out): the batch then leaves owing nothing. Only this source's fan-out takes places
    // on its edges, and it takes the pending items' places before it stops counting them
    // pending (pending first, then room: never more room than there is).
    int64_t room = k;
    const int64_t pending = st.source_pending_items.load(std::memory_order_acquire);
    for (EdgeRt* e : st.outputs) room = std::min(room, e->credits.room() - pending);
    k = static_cast<size_t>(std::max<int64_t>(room, 1));
  }
  for (;;) {
    size_t have = rt.failing() ? 0 : st.outbox.size() - st.outbox_next;
    if (have >= k || (have > 0 && st.source_state != StageRt::SourceState::producing)) {
      Packet p = take_from_outbox(st, std::min(have, k));
      st.source_pending_items.fetch_add(p.count(), std::memory_order_acq_rel);
      return p;
    }
    if (have == 0) {
      st.outbox.clear();
      st.outbox_next = 0;
    }
    if (st.source_state == StageRt::SourceState::producing) {
      bool more = false;
      if (!rt.failing() && !rt.stopping() && !st.wound_down.load(std::memory_order_relaxed)) {
        const size_t before = st.outbox.size();
        const int64_t t0 = st.batch_max > 1 ? now_ns() : 0;
        Invocation inv(rt, st, Delivery::outbox, nullptr, 0);
        more = inv.produce();
        inv.complete();
        if (t0) note_item_cost(st, now_ns() - t0, static_cast<int64_t>(st.outbox.size() - before));
      }
      if (!more) st.source_state = StageRt::SourceState::finalizing;
    } else if (st.source_state == StageRt::SourceState::finalizing) {
      Invocation inv(rt, st, Delivery::outbox, nullptr, 0);
      inv.finalize_source();
      inv.complete();
      st.source_state = StageRt::SourceState::ending;
    } else if (st.source_state == StageRt::SourceState::ending) {
      st.source_state = StageRt::SourceState::ended;
      st.end_ns.store(now_ns(), std::memory_order_relaxed);
      st.done.store(true, std::memory_order_release);
      Packet p;
      p.kind = Packet::Kind::eos;
      st.source_pending_items.fetch_add(1, std::memory_order_acq_rel);
      return p;
    } else {
      return std::nullopt;
    }
  }
}

void fan_out_source(StageRt& st, const Packet& p) {
  // The source's worker slot (one) admits one packet at a time: this one, which found a place
  // free on every edge. It takes its places here, as many as it has items for each edge
  // (edge.cpp). It runs as a task of its own, so the token it sends at the end cannot re-enter
  // the gate that is passing it on (flow_graph.cpp).
  for (size_t i = 0; i < st.outputs.size(); ++i) {
    EdgeRt* e = st.outputs[i];
    Packet q;
    q.kind = p.kind;
    if (p.kind == Packet::Kind::item) {
      if (e->accepts && !e->accepts(p.item)) continue;
      q.item = p.item;
    } else if (p.kind == Packet::Kind::items) {
      // Every edge numbers its own copies of the items.
      q.items = std::make_shared<std::vector<Item>>();
      for (const Item& it : *p.items)
        if (!e->accepts || e->accepts(it)) q.items->push_back(it);
      if (q.items->empty()) continue;
      if (q.items->size() == 1) {
        q.kind = Packet::Kind::item;
        q.item = std::move(q.items->front());
        q.items.reset();
      }
    }
    stamp(e, q);
    const int64_t n = q.count();
    e->credits.owe(n);  // free: the admission saw one, and a batch was sized to the room
    e->count_in(n);
    if (e->admission)
      e->admission->push(std::move(q));
    else
      st.ports[static_cast<size_t>(e->out_index)]->try_put(q);
  }
  st.source_pending_items.fetch_sub(p.count(), std::memory_order_acq_rel);
  st.worker_slots.release();  // the next packet may pass the gate
}

}  // namespace pipeline::graph
