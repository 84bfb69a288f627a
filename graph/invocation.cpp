// See invocation.h. The rules an invocation follows, in the order it meets them:
//   - It starts holding a place on each output edge (its admission reserved them), a worker
//     slot, and, for a stage with a ResourcePool, one resource.
//   - Each item it emits goes to every consumer whose filter wants it, with the edge's next
//     sequence number; the first item on an edge uses the reserved place, later ones take
//     places whether or not they are free, owing them (edge.cpp).
//   - An order-keeping parallel stage collects its outputs in a bundle keyed by the input's
//     sequence number; its sequencer releases bundles in input order.
//   - At the end, unused credits and the slot go back, and the busy time is counted.
//   - After the end-of-stream marker from every input, the stage is finalized once all its
//     other invocations are done, and sends an end-of-stream marker on every output edge.
//   - After a failure (or abort) stage code is no longer called: inputs are dropped, but every
//     marker still flows, so the graph drains and the run ends.
//   - A stage that winds down (Emitter::wind_down) drops what reaches it from then on, and so do
//     the stages upstream of it whose outputs all lead to stages that wound down; sources among
//     them stop producing. Markers still flow, and the run still ends as "done".
//   - Batches: a source whose items are cheap, in a graph whose stages are all cheap, sends
//     several items per packet (run_source); a stage that takes such a packet processes each
//     item and sends what it emitted on each edge as one packet too. Credits still count items:
//     the items beyond the first of a packet take (or owe) places of their own (edge.cpp).
#include "graph/invocation.h"

#include "base/nvtx.h"

#include <algorithm>
#include <stdexcept>

#include <time.h>

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

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

void stamp(EdgeRt* e, Packet& p) {
  p.edge = e;
  p.seq = e->next_packet.fetch_add(1, std::memory_order_relaxed);
  if (p.kind == Packet::Kind::item) {
    p.item.set_seq(e->next_seq.fetch_add(1, std::memory_order_relaxed));
  } else if (p.kind == Packet::Kind::items) {
    uint64_t first = e->next_seq.fetch_add(p.items->size(), std::memory_order_relaxed);
    for (Item& it : *p.items) it.set_seq(first++);
  }
}

void note_item_cost(StageRt& st, int64_t ns, int64_t items) {
  if (items <= 0) return;
  int64_t per = ns / items, old = st.item_cost_ns.load(std::memory_order_relaxed);
  st.item_cost_ns.store(old ? (7 * old + per) / 8 : per, std::memory_order_relaxed);
}

namespace {

// Stage code runs inside this: the first exception fails the run, naming the stage; and
// Invocation::current() names the invocation (ResourcePool::acquire needs it).
template <class F>
void guarded(Invocation* inv, Runtime& rt, StageRt& st, F&& f) {
  struct Current {
    Invocation* previous = t_current;
    explicit Current(Invocation* i) { t_current = i; }
    ~Current() { t_current = previous; }
  } current(inv);
  const NvtxRange range(st.spec.name.c_str());  // the stage on this thread's Nsight timeline
  const int64_t cpu0 = inv->cpu_weight() ? thread_cpu_ns() : 0;
  try {
    f();
  } catch (const Cancelled&) {
    // Thrown into a stage that called the engine after the run failed: the failure is recorded.
  } catch (...) {
    rt.fail(st.spec.name, std::current_exception());
  }
  if (cpu0) inv->add_cpu(thread_cpu_ns() - cpu0);
}

}  // namespace

Invocation::Invocation(Runtime& rt, StageRt& st, Delivery delivery, Gateway* gateway, uint64_t seq)
    : rt_(rt), st_(st), delivery_(delivery), gateway_(gateway), seq_(seq) {
  slot_ = take_slot(st);
  c_ = st.counters[static_cast<size_t>(slot_)].get();
  if (delivery == Delivery::ports) bump(c_->started);  // a CPU stage's admitted input (Admission::used)
  if (delivery != Delivery::outbox) {
    for (size_t i = 0; i < st.outputs.size(); ++i) reserved_[i] = !st.outputs[i]->on_demand;
    resource_reserved_ = st.pool != nullptr;
    if (st.ordered_commit) bundle_ = std::make_shared<Bundle>();
  }
  st.running.fetch_add(1);
  counted_running_ = true;
  if (rt.opts.stats) {
    t_start_ = now_ns();
    c_->busy_since.store(t_start_, std::memory_order_relaxed);
    // The thread CPU clock is a system call: read it on every invocation of a stage whose items
    // cost 50 us or more, on one in 16 (counted 16 times) otherwise.
    if (st.item_cost_ns.load(std::memory_order_relaxed) >= 50'000)
      cpu_weight_ = 1;
    else if (c_->cpu_samples.load(std::memory_order_relaxed) % 16 == 0)
      cpu_weight_ = 16;
    bump(c_->cpu_samples);
    if (!st.first_ns.load(std::memory_order_relaxed)) {
      int64_t zero = 0;
      st.first_ns.compare_exchange_strong(zero, t_start_, std::memory_order_relaxed);
    }
  } else {
    // Without stats, one invocation in 16 (of each worker slot) is timed: the cost of an item.
    if (c_->cost_samples.load(std::memory_order_relaxed) % 16 == 0) t_start_ = now_ns();
    bump(c_->cost_samples);
  }
}

void Invocation::take_batch(int64_t items) {
  items_ = items;
  if (!t_start_) t_start_ = now_ns();
  // A CPU stage passes batches on (no bigger than the one it took); a stage with a thread of its
  // own, or a timed one, takes a batch's items in one go but sends its outputs one by one.
  batching_ = st_.kind == StageKind::cpu;
  if (batching_) out_batch_.resize(st_.outputs.size());
}

Invocation::~Invocation() {
  if (counted_running_) st_.running.fetch_sub(1, std::memory_order_acq_rel);  // not completed: the caller unwound
}

Invocation* Invocation::current() { return t_current; }

void Invocation::process(Item item) {
  bump(c_->in);
  if (!batching_) items_ = 1;
  if (rt_.failing()) return;
  if ((st_.discard_on_stop && rt_.stopping()) || st_.wound_down.load(std::memory_order_relaxed)) {
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

// Who finalizes, without a lock: the invocation that takes the last end-of-stream marker
// sets finalize_pending, then whichever invocation finds itself the only one running with the
// flag set and nothing left on the stage's input edges claims it (compare-and-swap), either
// that same invocation at once or the last of the others in complete(). Since every invocation
// decrements `running` before it looks at the flag, and the marker's invocation looks after
// setting it, one of them always sees both.
//
// The input edges matter because an admitted input is not running yet: its task may wait in a
// worker's deque (oneTBB runs the newest first) while later inputs, the marker among them, run.
// Its items stay on the edge (`load`) until its invocation has started (counted in `running`)
// and takes them, so reading the loads before `running` never misses it.
static bool inputs_idle(const StageRt& st) {
  for (const EdgeRt* e : st.inputs)
    if (e->load.load() != 0) return false;
  return true;
}

static bool claim_finalize(StageRt& st) {
  bool expected = true;
  return st.finalize_pending.compare_exchange_strong(expected, false, std::memory_order_acq_rel);
}

void Invocation::end_of_input() {
  if (st_.eos_seen.fetch_add(1, std::memory_order_acq_rel) + 1 < static_cast<int>(st_.inputs.size())) return;
  st_.eos_seq = seq_;
  skip_bundle_ = true;  // unless finalized here: another invocation sends the end-of-stream bundle
  st_.finalize_pending.store(true);
  if (inputs_idle(st_) && st_.running.load() == 1 && claim_finalize(st_)) {
    skip_bundle_ = false;
    finalize_and_end(false);
  }
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
  counted_running_ = false;
  const bool idle = inputs_idle(st_);  // before leaving `running` (see claim_finalize)
  if (st_.running.fetch_sub(1) == 1 && idle && st_.finalize_pending.load() && claim_finalize(st_))
    finalize_and_end(true);
  flush();
  for (size_t i = 0; i < st_.outputs.size(); ++i)
    if (reserved_[i]) st_.outputs[i]->credits.release();
  if (resource_reserved_) st_.resources.release();
  if (t_start_) {
    int64_t t1 = now_ns();
    note_item_cost(st_, t1 - t_start_, items_);
    bump(c_->busy_ns, t1 - t_start_);
    c_->busy_since.store(0, std::memory_order_relaxed);
    if (c_->trace.size() < c_->trace_cap) c_->trace.push_back({t_start_, t1 - t_start_});
  }
  const bool ended = st_.end_ns.load(std::memory_order_relaxed) != 0 && delivery_ != Delivery::outbox;
  give_slot(st_, slot_);
  // Own-thread stages free their slot when their thread takes the next input (device_thread.cpp).
  if (st_.kind == StageKind::cpu || st_.kind == StageKind::timed) st_.worker_slots.release();
  if (ended) st_.done.store(true, std::memory_order_release);
}

void Invocation::emit(Item item) {
  // (type_info names are unique per type: comparing the pointers first skips a strcmp.)
  if (st_.checks_out_type && item.type().name() != st_.out_type.name() && item.type() != st_.out_type)
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
  const size_t n = st_.outputs.size();
  for (size_t i = 0; i < n; ++i) {
    EdgeRt* e = st_.outputs[i];
    if (e->accepts && !e->accepts(item)) continue;
    Item copy = i + 1 == n ? std::move(item) : item;  // the last edge takes the item itself
    if (batching_ && e->batches && !bundle_) {
      // Credits and counts are settled for the whole batch when it leaves (flush_batches).
      auto& b = out_batch_[i];
      if (!b) {
        b = std::make_shared<std::vector<Item>>();
        b->reserve(static_cast<size_t>(items_));
      }
      b->push_back(std::move(copy));
      if (static_cast<int64_t>(b->size()) >= items_) flush_batch(i);  // never bigger than the input's
      continue;
    }
    Packet p;
    p.item = std::move(copy);
    put(e, std::move(p));
  }
}

void Invocation::emit_end_of_stream() {
  flush_batches();  // the items batched so far leave before the end-of-stream marker
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
  else if (e->on_demand)
    wait_for_place(e);
  else
    e->credits.owe(1);
  p.edge = e;
  e->count_in();
  deliver(e, std::move(p));
}

void Invocation::deliver(EdgeRt* e, Packet p) {
  if (bundle_ || st_.kind == StageKind::timed) {
    e->held.fetch_add(1, std::memory_order_relaxed);  // on the edge, not yet where the consumer can take it
    if (bundle_) e->in_order.fetch_add(1, std::memory_order_relaxed);
    if (bundle_)
      bundle_->outs.emplace_back(e, std::move(p));
    else
      held_.push_back(std::move(p));
  } else {
    send(p);
  }
}

void Invocation::send(Packet& p) {
  stamp(p.edge, p);
  if (delivery_ != Delivery::ports)
    gateway_->try_put(p);
  else if (Admission* a = p.edge->admission)
    a->push(std::move(p));  // what the port would do, without its broadcast and a copy
  else
    st_.ports[static_cast<size_t>(p.edge->out_index)]->try_put(p);
}

void Invocation::flush_batches() {
  if (!batching_) return;
  for (size_t i = 0; i < st_.outputs.size(); ++i) flush_batch(i);
}

void Invocation::flush_batch(size_t i) {
  auto& b = out_batch_[i];
  if (!b || b->empty()) return;
  EdgeRt* e = st_.outputs[i];
  const auto n = static_cast<int64_t>(b->size());
  // One place from the admission, the rest taken at once (owed if they are not free).
  int64_t extra = n;
  if (reserved_[i]) {
    reserved_[i] = false;
    --extra;
  }
  if (extra > 0) e->credits.owe(extra);
  e->count_in(n);
  Packet p;
  p.edge = e;
  if (n == 1) {
    p.item = std::move(b->front());
  } else {
    p.kind = Packet::Kind::items;
    p.items = std::move(b);
  }
  b.reset();
  send(p);
}

void Invocation::flush() {
  flush_batches();
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

void Invocation::wait_for_place(EdgeRt* e) {
  if (e->credits.try_take()) return;
  // The edge is full: this thread (an own-thread stage's) waits for a place, and the time counts
  // as blocked, not busy. After a failure (or an abort) the wait goes on: the consumer still
  // takes its inputs, dropping them, until the end of stream has passed, and the edge keeps its
  // bound. Only a cancelled graph (an error of the engine's own code, Runtime::fault) may never
  // take again; then the item goes on owed, and nobody reads the bound of a cancelled run.
  const int64_t t0 = now_ns();
  const bool stats = rt_.opts.stats && t_start_;
  st_.placing.fetch_add(1);
  if (stats) c_->busy_since.store(0, std::memory_order_relaxed);
  while (!e->credits.try_take()) {
    if (rt_.graph_cancelled()) {
      e->credits.owe(1);  // the edge's count stays right
      break;
    }
    e->credits.wait_for_place(std::chrono::milliseconds(10));
  }
  const int64_t waited = now_ns() - t0;
  st_.placing.fetch_sub(1);
  if (t_start_) t_start_ += waited;  // busy time (and the cost of an item) exclude the wait
  if (stats) c_->busy_since.store(t_start_, std::memory_order_relaxed);
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

bool Invocation::extra_resource() { return st_.resources.try_take(); }

// Up the in-edges from `st`, as far as the producers whose every consumer has wound down. Each
// stage sets its own flag before it reads its siblings' (seq_cst): of two consumers of one
// producer winding down at once, the later one sees the other's flag, so the producer is
// never left out.
void wind_down(Runtime& rt, StageRt& st) {
  if (st.wound_down.exchange(true)) return;
  for (const EdgeRt* in : st.inputs) {
    StageRt& producer = *rt.stages[in->producer];
    const bool all = std::all_of(producer.outputs.begin(), producer.outputs.end(),
                                 [&](const EdgeRt* out) { return rt.stages[out->consumer]->wound_down.load(); });
    if (all) wind_down(rt, producer);
  }
}

// ---------------------------------------------------------------------------------------------
// The stage-facing Emitter

void Emitter::emit_item(Item item) { impl_->emit(std::move(item)); }
bool Emitter::stop_requested() const {
  return impl_->runtime().stopping() || impl_->stage().wound_down.load(std::memory_order_relaxed);
}
void Emitter::wind_down() { graph::wind_down(impl_->runtime(), impl_->stage()); }
void Emitter::hold_for(std::chrono::nanoseconds d) { impl_->hold_for(d); }
void Emitter::add_device_wait(std::chrono::nanoseconds d) { impl_->add_device_wait(d); }
void Emitter::add_device_busy(const std::string& stage, std::chrono::nanoseconds d, bool gpu) {
  if (StageRt* s = impl_->runtime().find(stage)) {
    if (gpu) s->device_busy_gpu.store(true, std::memory_order_relaxed);
    s->device_busy_ns.fetch_add(d.count(), std::memory_order_relaxed);
  }
}

}  // namespace pipeline::graph

