// See flow_graph.h.
#include "graph/flow_graph.h"

#include <utility>

#include "graph/device_thread.h"
#include "graph/invocation.h"
#include "graph/source_thread.h"

namespace pipeline::graph {

StageRt::StageRt() = default;
StageRt::~StageRt() = default;

namespace {

template <class Node, size_t... I>
std::array<OutPort*, kMaxOutputs> ports_of(Node& node, std::index_sequence<I...>) {
  return {&flow::output_port<I>(node)...};
}

template <class Node>
std::array<OutPort*, kMaxOutputs> ports_of(Node& node) {
  return ports_of(node, std::make_index_sequence<kMaxOutputs>{});
}

// The fan-out and dispatch bodies number packets in the order they leave, so they must see
// them in order: dispatch is lightweight (inline in the sender's thread, which oneTBB allows
// only for a noexcept body), a source's fan-out is serial and queueing (first in, first out).

// Every node body runs inside this: an error of the engine's own code (or one injected by a
// test) fails the run naming the stage and the site, and cancels the graph (Runtime::fault).
// Stage code has its own guard (invocation.cpp); this one catches what the engine throws.
//
// The bodies of CPU and async nodes must not be declared noexcept although nothing leaves
// them: oneTBB runs a noexcept body of an async_node (whose policy is lightweight) inline in
// the sender's thread, inside the forwarding of the gate in front of it (under the gate's
// successor lock), and a token the body sends to that gate (a worker slot given back) would
// re-enter it and deadlock.
template <class F>
void at_site(Runtime& rt, StageRt& st, EngineSite site, F&& body) noexcept {
  try {
    rt.fault_point(site, st);
    body();
  } catch (...) {
    rt.fault(site, st, std::current_exception());
  }
}

}  // namespace

FlowGraph::FlowGraph(Runtime& rt) : rt_(rt) {
  for (auto& st : rt_.stages) build_stage(*st);
  // Every edge: the producer's output port -> the consumer's admission (or its renumbering
  // node, for a stage that merges several inputs and must keep their order).
  for (auto& e : rt_.edges) {
    StageRt& from = *rt_.stages[e->producer];
    StageRt& to = *rt_.stages[e->consumer];
    if (to.renumber) {
      flow::make_edge(*from.ports[static_cast<size_t>(e->out_index)], *to.renumber);
    } else {
      flow::make_edge(*from.ports[static_cast<size_t>(e->out_index)], to.admission);
      e->admission = &to.admission;  // the producer's invocations put there directly (invocation.cpp)
    }
  }
  std::lock_guard lock(rt_.timer_mu);
  rt_.timer = &timer_;
  rt_.flow = this;
}

void FlowGraph::cancel() {
  g_.cancel();
  timer_.expire_all();
  for (auto& st : rt_.stages) {
    if (st->device) st->device->cancel();
    if (st->reader) st->reader->cancel();
  }
}

void FlowGraph::build_stage(StageRt& st) {
  if (st.is_side()) return;  // beside the graph: no node
  Runtime& rt = rt_;
  // The admission (edge.cpp): inputs wait in it until it puts them to the node, each having
  // taken a worker slot, a place on every output edge and, with a pool, a resource. A source has
  // a gate in front of its fan-out instead, takes one packet at a time and only checks its
  // edges: its fan-out takes the places.
  Admission& adm = st.admission;
  if (st.is_source()) {
    adm.open_gate(g_);
    st.worker_slots.open(1, 1, &adm);
  } else {
    adm.open(g_);
    st.worker_slots.open(st.max_workers, st.start_workers, &adm);
  }
  adm.reserve(st.worker_slots);
  for (EdgeRt* e : st.outputs) {
    const bool gates = !e->on_demand;  // on demand: the place is taken at emission
    e->credits.open(e->max_capacity, e->start_capacity, gates ? &adm : nullptr);
    if (gates && st.is_source())
      adm.check(e->credits);
    else if (gates)
      adm.reserve(e->credits);
  }
  if (st.pool) {
    st.resources.open(st.pool->size(), st.pool->size(), &adm);
    adm.reserve(st.resources);
    ResourcePool* pool = st.pool.get();
    st.pool->set_gate({.reserved =
                           [pool] {
                             Invocation* inv = Invocation::current();
                             return inv && inv->stage().pool.get() == pool && inv->take_resource_reservation();
                           },
                       .extra =
                           [pool] {
                             Invocation* inv = Invocation::current();
                             return inv && inv->stage().pool.get() == pool && inv->extra_resource();
                           },
                       .released = [&st] { st.resources.release(); }});
  }
  if (st.is_source() && st.type->own_thread) {
    Limiter& gate = adm.gate();
    // Tickets through the gate to the reader thread, which answers with the packets
    // (source_thread.h).
    st.reader = std::make_unique<SourceThread>(rt, st);
    st.source = std::make_unique<Source>(g_, [&st](tbb::flow_control& fc) {
      if (st.reader->ended()) fc.stop();
      return Packet{};
    });
    st.async = std::make_unique<AsyncNode>(g_, flow::unlimited, [&rt, &st](const Packet&, Gateway&) {
      st.admission.used();
      at_site(rt, st, EngineSite::async, [&] { st.reader->request(); });
    });
    st.source_route = std::make_unique<SourceRouteNode>(g_, flow::serial, [&rt, &st](const Packet& p, auto&) noexcept {
      at_site(rt, st, EngineSite::fan_out, [&] { fan_out_source(st, p); });
    });
    st.ports = ports_of(*st.source_route);
    flow::make_edge(*st.source, gate);
    flow::make_edge(gate, *st.async);
    flow::make_edge(*st.async, *st.source_route);
    return;
  }
  if (st.is_source()) {
    Limiter& gate = adm.gate();
    st.source = std::make_unique<Source>(g_, [&rt, &st](tbb::flow_control& fc) {
      Packet out;
      bool ok = false;
      at_site(rt, st, EngineSite::source, [&] {
        out = run_source(rt, st, fc);
        ok = true;
      });
      if (!ok) fc.stop();  // the graph is being cancelled
      return out;
    });
    st.source_route = std::make_unique<SourceRouteNode>(g_, flow::serial, [&rt, &st](const Packet& p, auto&) noexcept {
      st.admission.used();
      at_site(rt, st, EngineSite::fan_out, [&] { fan_out_source(st, p); });
    });
    st.ports = ports_of(*st.source_route);
    flow::make_edge(*st.source, gate);
    flow::make_edge(gate, *st.source_route);
    return;
  }

  if (st.renumber_input) {
    // Merged inputs get one dense sequence, in arrival order, for the sequencer downstream.
    // (RenumberNode, runtime.h: the put happens inside the serial body, so numbers arrive in order.)
    st.renumber = std::make_unique<RenumberNode>(g_, flow::serial, [&rt, &st](const Packet& p, auto& ports) {
      at_site(rt, st, EngineSite::renumber, [&] {
        Packet q = p;
        q.seq = st.input_seq.fetch_add(1, std::memory_order_relaxed);
        if (q.kind == Packet::Kind::item) q.item.set_seq(q.seq);
        std::get<0>(ports).try_put(q);
      });  // after a fault nothing is put: the cancelled graph ends
    });
    flow::make_edge(flow::output_port<0>(*st.renumber), st.admission);
  }
  if (st.ordered_commit) {
    st.sequencer = std::make_unique<Sequencer>(g_, [](const Packet& p) { return static_cast<size_t>(p.seq); });
    st.ordered_route = std::make_unique<OrderedRouteNode>(g_, flow::serial, [&rt, &st](const Packet& p, auto&) noexcept {
      at_site(rt, st, EngineSite::sequencer, [&] { dispatch(st, p); });
    });
    flow::make_edge(*st.sequencer, *st.ordered_route);
  }

  if (st.kind == StageKind::cpu) {
    // The body's Packet is the task's own copy: moving the item out of it is safe.
    st.cpu = std::make_unique<CpuNode>(g_, flow::unlimited, [&rt, &st](const Packet& p, auto&) {
      at_site(rt, st, EngineSite::cpu, [&] {
        run_packet(rt, st, const_cast<Packet&>(p), Delivery::ports, nullptr);
      });
    });
    adm.admit_to(*st.cpu);
    if (st.ordered_commit) {
      st.bundle_port = &flow::output_port<0>(*st.cpu);
      flow::make_edge(*st.bundle_port, *st.sequencer);
      st.ports = ports_of(*st.ordered_route);
    } else {
      st.ports = ports_of(*st.cpu);
    }
    return;
  }

  // Own-thread and timed stages: an async node whose work leaves the TBB scheduler.
  if (st.kind == StageKind::own_thread) st.device = std::make_unique<DeviceThread>(rt, st);
  st.async = std::make_unique<AsyncNode>(g_, flow::unlimited, [&rt, &st](const Packet& p, Gateway& gateway) {
    st.admission.used();
    at_site(rt, st, EngineSite::async, [&] {
      if (st.kind == StageKind::own_thread) {
        st.device->hand_over(const_cast<Packet&>(p));
        return;
      }
      run_packet(rt, st, const_cast<Packet&>(p), Delivery::gateway, &gateway);
    });
  });
  adm.admit_to(*st.async);
  if (st.ordered_commit) {
    flow::make_edge(*st.async, *st.sequencer);
    st.ports = ports_of(*st.ordered_route);
  } else {
    st.route = std::make_unique<RouteNode>(g_, flow::unlimited, [&rt, &st](const Packet& p, auto&) noexcept {
      at_site(rt, st, EngineSite::dispatch, [&] { dispatch(st, p); });
    });
    flow::make_edge(*st.async, *st.route);
    st.ports = ports_of(*st.route);
  }
}

void FlowGraph::run() {
  ran_ = true;
  timer_.start();
  for (auto& st : rt_.stages) {
    if (st->device) st->device->start(st->async->gateway());
    if (st->reader) st->reader->start(st->async->gateway());
  }
  // The first tokens: every stage is admitted what its credits allow.
  for (auto& st : rt_.stages)
    if (!st->is_side()) st->admission.poke();
  for (auto& st : rt_.stages)
    if (st->source) st->source->activate();
  g_.wait_for_all();
  for (auto& st : rt_.stages) {
    if (st->device) st->device->join(false);
    if (st->reader) st->reader->join(false);
  }
  timer_.stop();
}

FlowGraph::~FlowGraph() {
  // Unwinding from an error of the engine itself: threads must not outlive the nodes.
  for (auto& st : rt_.stages) {
    if (st->device) st->device->join(true);
    if (st->reader) st->reader->join(true);
  }
  {
    std::lock_guard lock(rt_.timer_mu);
    rt_.timer = nullptr;
    rt_.flow = nullptr;
  }
  timer_.stop();
  for (auto& st : rt_.stages) {
    if (st->pool) st->pool->set_gate({});
    st->device.reset();
    st->reader.reset();
    st->source.reset();
    st->route.reset();
    st->source_route.reset();
    st->ordered_route.reset();
    st->sequencer.reset();
    st->cpu.reset();
    st->async.reset();
    st->renumber.reset();
    st->admission.close();
    st->ports = {};
    st->bundle_port = nullptr;
  }
}

}  // namespace pipeline::graph
