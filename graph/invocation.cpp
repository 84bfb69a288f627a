// See invocation.h. The rules an invocation follows, in the order it meets them:
//   - It starts holding one credit on each output edge (its admission reserved them), a worker
//     slot, and, for a stage with a ResourcePool, one resource.
//   - Each item it emits goes to every consumer whose filter wants it, with the edge's next
//     sequence number; the first item on an edge uses the reserved credit, later ones take a
//     fresh credit or put the edge in debt (edge.cpp).
//   - An order-keeping parallel stage collects its outputs in a bundle keyed by the input's
//     sequence number; its sequencer releases bundles in input order.
//   - At the end, unused credits and the slot go back, and the busy time is counted.
//   - After the end-of-stream marker from every input, the stage is finalized once all its
//     other invocations are done, and sends an end-of-stream marker on every output edge.
//   - After a failure (or abort) stage code is no longer called: inputs are dropped, but every
//     marker still flows, so the graph drains and the run ends.
#include "graph/invocation.h"

#include <stdexcept>

#include "graph/timer.h"

namespace pipeline::graph {

namespace {

thread_local Invocation* t_current = nullptr;

// Single-writer counters (each slot is held by one invocation at a time): no locked add needed.
template <class T>
void bump(std::atomic<T>& a, T d = 1) {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

int take_slot(StageRt& st) {
  if (st.max_workers <= 1) return 0;
  tbb::spin_mutex::scoped_lock lock(st.slot_mu);
  if (st.free_slots.empty())
    throw std::logic_error("engine: stage '" + st.spec.name + "' was admitted an input with no free worker slot");
  int s = st.free_slots.back();
  st.free_slots.pop_back();
  return s;
}

void give_slot(StageRt& st, int s) {
  if (st.max_workers <= 1) return;
  tbb::spin_mutex::scoped_lock lock(st.slot_mu);
  st.free_slots.push_back(s);
}

// Gives a packet its place on its edge: edges number what they carry 0, 1, 2, ... in the order
// the consumer receives it (so a bundle's items are numbered when the sequencer releases them).
void stamp(EdgeRt* e, Packet& p) {
  p.edge = e;
  p.seq = e->next_seq.fetch_add(1, std::memory_order_relaxed);
  if (p.kind == Packet::Kind::item) p.item.set_seq(p.seq);
}

// Stage code runs inside this: the first exception fails the run, naming the stage; and
// Invocation::current() names the invocation (ResourcePool::acquire needs it).
template <class F>
void guarded(Invocation* inv, Runtime& rt, StageRt& st, F&& f) {
  struct Current {
    Invocation* previous = t_current;
    explicit Current(Invocation* i) { t_current = i; }
    ~Current() { t_current = previous; }
  } current(inv);
  try {
    f();
  } catch (const Cancelled&) {
    // Thrown into a stage that called the engine after the run failed: the failure is recorded.
  } catch (...) {
    rt.fail(st.spec.name, std::current_exception());
  }
}

}  // namespace

Invocation::Invocation(Runtime& rt, StageRt& st, Delivery delivery, Gateway* gateway, uint64_t seq)
    : rt_(rt), st_(st), delivery_(delivery), gateway_(gateway), seq_(seq) {
  slot_ = take_slot(st);
  c_ = st.counters[static_cast<size_t>(slot_)].get();
  if (delivery != Delivery::outbox) {
    for (size_t i = 0; i < st.outputs.size(); ++i) reserved_[i] = true;
    resource_reserved_ = st.pool != nullptr;
    if (st.ordered_commit) bundle_ = std::make_shared<Bundle>();
  }
  {
    std::lock_guard lock(st.eos_mu);
    ++st.running;
  }
  counted_running_ = true;
  st.running_now.fetch_add(1, std::memory_order_relaxed);
  if (rt.opts.stats) {
    t_start_ = now_ns();
    c_->busy_since.store(t_start_, std::memory_order_relaxed);
  }
}

Invocation::~Invocation() {
  if (counted_running_) {
    // Not completed (the caller unwound): give back what the invocation holds.
    std::lock_guard lock(st_.eos_mu);
    --st_.running;
  }
}

Invocation* Invocation::current() { return t_current; }

void Invocation::process(Item item) {
  bump(c_->in);
  if (rt_.failing()) return;
  if (rt_.stopping() && st_.type->on_stop == OnStop::discard) {
    bump(c_->discarded);
    return;
  }
  Emitter out(this, slot_);
  guarded(this, rt_, st_, [&] { st_.stage->process(std::move(item), out); });
}

bool Invocation::produce() {
  bool more = false;
  Emitter out(this, slot_);
  guarded(this, rt_, st_, [&] { more = st_.stage->produce(out); });
  return more && !rt_.failing();
}

void Invocation::finalize_source() {
  if (rt_.failing()) return;
  Emitter out(this, slot_);
  guarded(this, rt_, st_, [&] { st_.stage->finalize(out); });
}

void Invocation::end_of_input() {
  bool now = false;
  {
    std::lock_guard lock(st_.eos_mu);
    if (++st_.eos_seen < static_cast<int>(st_.inputs.size())) return;
    if (st_.running == 1) {
      now = true;
    } else {
      // Other inputs are still being processed: the last of them finalizes (complete()), so
      // that finalize() runs after every process(), and sends this invocation's bundle slot.
      st_.finalize_pending = true;
      st_.eos_seq = seq_;
      skip_bundle_ = true;
    }
  }
  if (now) finalize_and_end(false);
}

void Invocation::finalize_and_end(bool deferred) {
  if (st_.ordered_commit && deferred) {
    // This invocation's own bundle keeps its place; finalize()'s outputs and the end of stream
    // take the end-of-stream input's place, the last in order.
    flush();
    bundle_ = std::make_shared<Bundle>();
    seq_ = st_.eos_seq;
    skip_bundle_ = false;
  }
  if (!rt_.failing()) {
    Emitter out(this, slot_);
    guarded(this, rt_, st_, [&] { st_.stage->finalize(out); });
  }
  emit_end_of_stream();
  st_.end_ns.store(now_ns(), std::memory_order_relaxed);
}

void Invocation::complete() {
  bool finalize_now = false;
  {
    std::lock_guard lock(st_.eos_mu);
    --st_.running;
    counted_running_ = false;
    if (st_.finalize_pending && st_.running == 0) {
      st_.finalize_pending = false;
      finalize_now = true;
    }
  }
  if (finalize_now) finalize_and_end(true);
  flush();
  for (size_t i = 0; i < st_.outputs.size(); ++i)
    if (reserved_[i]) st_.outputs[i]->credits.release();
  if (resource_reserved_) st_.resources.release();
  if (t_start_) {
    int64_t t1 = now_ns();
    bump(c_->busy_ns, t1 - t_start_);
    c_->busy_since.store(0, std::memory_order_relaxed);
    if (c_->trace.size() < c_->trace_cap) c_->trace.push_back({t_start_, t1 - t_start_});
  }
  st_.running_now.fetch_sub(1, std::memory_order_relaxed);
  const bool ended = st_.end_ns.load(std::memory_order_relaxed) != 0 && delivery_ != Delivery::outbox;
  give_slot(st_, slot_);
  // Own-thread stages free their slot when their thread takes the next input (device_thread.cpp).
  if (st_.kind == StageKind::cpu || st_.kind == StageKind::timed) st_.worker_slots.release();
  if (ended) st_.done.store(true, std::memory_order_release);
}

void Invocation::emit(Item item) {
  if (st_.out_type != std::type_index(typeid(void)) && item.type() != st_.out_type)
    throw std::logic_error("stage '" + st_.spec.name + "' (type " + st_.type->name + ") emitted a " +
                           type_name_of(item.type()) + " but its output port '" + st_.out_port + "' carries " +
                           type_name_of(st_.out_type));
  if (st_.is_sink())
    throw std::logic_error("stage '" + st_.spec.name + "' (type " + st_.type->name + ") is a sink but emitted an item");
  bump(c_->out);
  if (delivery_ == Delivery::outbox) {
    st_.outbox.push_back(std::move(item));
    return;
  }
  for (EdgeRt* e : st_.outputs) {
    if (e->accepts && !e->accepts(item)) continue;
    Packet p;
    p.item = item;
    put(e, std::move(p));
  }
}

void Invocation::emit_end_of_stream() {
  for (EdgeRt* e : st_.outputs) {
    Packet p;
    p.kind = Packet::Kind::eos;
    put(e, std::move(p));
  }
}

void Invocation::put(EdgeRt* e, Packet p) {
  auto i = static_cast<size_t>(e->out_index);
  if (reserved_[i])
    reserved_[i] = false;
  else
    e->credits.extra(margin());
  p.edge = e;
  e->count_in();
  deliver(e, std::move(p));
}

void Invocation::deliver(EdgeRt* e, Packet p) {
  if (bundle_ || st_.kind == StageKind::timed) {
    e->held.fetch_add(1, std::memory_order_relaxed);  // on the edge, not yet where the consumer can take it
    if (bundle_)
      bundle_->outs.emplace_back(e, std::move(p));
    else
      held_.push_back(std::move(p));
  } else {
    stamp(e, p);
    if (delivery_ == Delivery::ports)
      st_.ports[static_cast<size_t>(e->out_index)]->try_put(p);
    else
      gateway_->try_put(p);
  }
}

void Invocation::flush() {
  if (bundle_ && !skip_bundle_) {
    Packet b;
    b.kind = Packet::Kind::bundle;
    b.seq = seq_;
    b.bundle = std::move(bundle_);
    if (delivery_ == Delivery::ports)
      st_.bundle_port->try_put(b);
    else
      gateway_->try_put(b);
  }
  bundle_.reset();
  for (Packet& p : held_) {
    p.edge->held.fetch_sub(1, std::memory_order_relaxed);
    stamp(p.edge, p);
    gateway_->try_put(p);
  }
  held_.clear();
}

int64_t Invocation::margin() const {
  // A single-worker CPU stage runs alone: its limiters cannot have admitted anything the mirror
  // has not counted. Otherwise up to one admission per worker may be in flight.
  if (st_.kind == StageKind::cpu && st_.max_workers == 1) return 0;
  return std::max(1, st_.max_workers);
}

void Invocation::hold_for(std::chrono::nanoseconds d) {
  if (st_.kind != StageKind::timed)
    throw std::logic_error("Emitter::hold_for: stage type " + st_.type->name + " is not declared timed");
  if (rt_.failing() || d.count() <= 0) return;
  hold_until_ = std::max(hold_until_, now_ns() + d.count());
}

void Invocation::add_device_wait(std::chrono::nanoseconds d) { bump(c_->device_wait_ns, d.count()); }

bool Invocation::take_resource_reservation() {
  if (!resource_reserved_) return false;
  resource_reserved_ = false;
  return true;
}

bool Invocation::extra_resource() { return st_.resources.try_extra(margin()); }

// ---------------------------------------------------------------------------------------------
// Node bodies

void count_admission(StageRt& st) {
  st.worker_slots.admitted();
  for (EdgeRt* e : st.outputs) e->credits.admitted();
  if (st.pool) st.resources.admitted();
}

void run_packet(Runtime& rt, StageRt& st, Packet& p, Delivery delivery, Gateway* gateway) {
  auto run = [&](Invocation& inv) {
    p.edge->take();
    if (p.kind == Packet::Kind::eos)
      inv.end_of_input();
    else
      inv.process(std::move(p.item));
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

Packet run_source(Runtime& rt, StageRt& st, tbb::flow_control& fc) {
  for (;;) {
    if (st.outbox_next < st.outbox.size() && !rt.failing()) {
      Packet p;
      p.item = std::move(st.outbox[st.outbox_next++]);
      return p;
    }
    st.outbox.clear();
    st.outbox_next = 0;
    if (st.source_state == StageRt::SourceState::producing) {
      bool more = false;
      if (!rt.failing() && !rt.stopping()) {
        Invocation inv(rt, st, Delivery::outbox, nullptr, 0);
        more = inv.produce();
        inv.complete();
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
      return p;
    } else {
      fc.stop();
      return {};
    }
  }
}

void fan_out_source(StageRt& st, const Packet& p) {
  for (EdgeRt* e : st.outputs) {
    e->credits.admitted();  // the source's limiters passed this packet: one credit on every edge
    if (p.kind == Packet::Kind::item && e->accepts && !e->accepts(p.item)) {
      e->credits.release();
      continue;
    }
    Packet q = p;
    stamp(e, q);
    e->count_in();
    st.ports[static_cast<size_t>(e->out_index)]->try_put(q);
  }
}

void dispatch(StageRt& st, const Packet& p) {
  if (p.kind == Packet::Kind::bundle) {
    for (auto& [e, q] : p.bundle->outs) {
      e->held.fetch_sub(1, std::memory_order_relaxed);
      stamp(e, q);
      st.ports[static_cast<size_t>(e->out_index)]->try_put(q);
    }
    return;
  }
  st.ports[static_cast<size_t>(p.edge->out_index)]->try_put(p);
}

// ---------------------------------------------------------------------------------------------
// The stage-facing Emitter

void Emitter::emit_item(Item item) { impl_->emit(std::move(item)); }
bool Emitter::stop_requested() const { return impl_->runtime().stopping(); }
void Emitter::hold_for(std::chrono::nanoseconds d) { impl_->hold_for(d); }
void Emitter::add_device_wait(std::chrono::nanoseconds d) { impl_->add_device_wait(d); }
void Emitter::add_device_busy(const std::string& stage, std::chrono::nanoseconds d) {
  if (StageRt* s = impl_->runtime().find(stage)) s->device_busy_ns.fetch_add(d.count(), std::memory_order_relaxed);
}

}  // namespace pipeline::graph
