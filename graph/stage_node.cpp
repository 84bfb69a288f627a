// The bodies of a stage's nodes (engine internals): a CPU stage's multifunction node, an
// own-thread or timed stage's async node (run_packet), and the dispatch node after an async
// node or a sequencer. flow_graph.cpp installs them, each under at_site.
#include <memory>
#include <mutex>

#include "graph/invocation.h"
#include "graph/timer.h"

namespace pipeline::graph {

void run_packet(Runtime& rt, StageRt& st, Packet& p, Delivery delivery, Gateway* gateway) {
  auto run = [&](Invocation& inv) {
    p.edge->take(p.count());
    if (p.kind == Packet::Kind::eos) {
      inv.end_of_input();
    } else if (p.kind == Packet::Kind::items) {
      inv.take_batch(static_cast<int64_t>(p.items->size()));
      for (Item& it : *p.items) inv.process(std::move(it));
    } else {
      inv.process(std::move(p.item));
    }
  };
  if (st.kind == StageKind::timed) {
    auto inv = std::make_unique<Invocation>(rt, st, delivery, gateway, p.seq);
    run(*inv);
    if (inv->held() && !rt.failing()) {
      std::lock_guard lock(rt.timer_mu);
      if (rt.timer) {
        rt.timer->hold(std::move(inv));
        return;
      }
    }
    inv->complete();
    return;
  }
  Invocation inv(rt, st, delivery, gateway, p.seq);
  run(inv);
  inv.complete();
}

void dispatch(StageRt& st, const Packet& p) {
  if (p.kind == Packet::Kind::bundle) {
    for (auto& [e, q] : p.bundle->outs) {
      e->held.fetch_sub(1, std::memory_order_relaxed);
      e->in_order.fetch_sub(1, std::memory_order_relaxed);
      stamp(e, q);
      if (e->admission)
        e->admission->push(std::move(q));  // the bundle is this node's alone
      else
        st.ports[static_cast<size_t>(e->out_index)]->try_put(q);
    }
    return;
  }
  st.ports[static_cast<size_t>(p.edge->out_index)]->try_put(p);
}

}  // namespace pipeline::graph
