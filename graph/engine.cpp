// The engine: validates a GraphSpec, builds the stages and their bounded queues, runs them,
// stops them, and measures them.
//
// DESIGN DECISION: how edges are bounded, and how threads are used.
//
// * Every stage has ONE input queue of its own (class Queue below: a mutex, two condition
//   variables, a deque and a capacity). Every producer feeding the stage pushes into it; a
//   producer with several consumers (fan-out) pushes the same Item (a shared pointer, no copy)
//   into each consumer's queue. push() waits while the queue holds `capacity` items, pop()
//   waits while it is empty. So a full queue stalls its producers, nothing is dropped, no edge
//   ever holds more than its capacity (checked by an exact high-water counter taken under the
//   lock at every push) and memory is bounded by sum(capacity) + one item per worker.
//   We chose our own blocking queue over TBB's buffering nodes plus a limiter_node because
//   stages emit zero, one or MANY outputs per input (read: a shard -> thousands of documents;
//   pack: a batch whenever enough tokens accumulated). A limiter admits one message per
//   decrement, so a stage emitting k outputs would need k free slots reserved before it runs;
//   the producer must instead be able to wait in the middle of process(), at each emit().
//   The queue also gives exact occupancy and wait times for the stats, which TBB's internal
//   buffers do not expose.
//
// * CPU stages run as tbb::flow::function_node bodies in a tbb::flow::graph, with the node's
//   concurrency = the stage's `workers`; each body is one worker loop (pop, process, emit)
//   that lives until its input is drained. Those bodies block (in pop/push), which would
//   starve a TBB arena sized to the 2 cores of a small machine. We prove it cannot deadlock
//   by giving the graph its own task_arena with max_concurrency = sum(workers of CPU stages)
//   + 1 (the thread calling wait_for_all, which also runs bodies), and raising
//   global_control::max_allowed_parallelism to at least that for the run: every worker
//   loop then has a thread of its own, so a blocked loop never keeps another from running,
//   and the wait graph is the data-flow graph itself, which is acyclic (cycles are rejected
//   at build time): the most downstream non-waiting stage can always make progress.
//   The threads sleep in futex waits when blocked, so oversubscription costs no CPU.
//
// * Stages with own_thread (device work) run on a dedicated std::thread, with initialize(),
//   every process() and finalize() on that thread; they are fed by the same bounded Queue,
//   which is the bounded hand-off between the TBB side and the thread.
//
// * Order: a single-worker stage preserves order. A stage with several workers whose output
//   reaches (directly or through other stages) a stage that declares `ordered` commits its
//   outputs in input order: each input gets a ticket at pop(), and a worker takes its turn
//   (waits until all earlier tickets finished) at its first emit() or at the end of process().
//   Outputs stream straight into the queue in turn, so nothing is buffered and a stage may
//   emit any number of items per input. Sequence numbers are assigned per stage output at
//   emission, so they count that stage's output stream 0, 1, 2, ... in order.
//
// * Lifecycle: end of input closes a queue once all its producers finished (after their
//   finalize()); consumers drain it and finish in turn. The first exception in a stage is
//   recorded and aborts every queue (blocked push/pop wake up, emit() throws Cancelled), so
//   every worker unwinds; run() rethrows it as StageError naming the stage. stop() only sets
//   an atomic (so a signal handler may call it): sources stop producing, queued items finish
//   (or are discarded by stages declaring OnStop::discard), and the monitor thread aborts the
//   graph if draining takes longer than stop_grace or if stop() is called twice.
//
// * Stats: per-worker counters are single-writer relaxed atomics (plain stores, no locked
//   instructions). Waiting time is measured only on the slow path (when a push or pop must
//   wait), and busy time is derived as wall time minus waiting time, so the common path reads
//   no clock. A monitor thread samples queue sizes every sample_interval into histograms and
//   builds snapshots every report_interval for observers (the live view) and stats.jsonl.
//   Tracing (trace.json) reads the clock twice per item, only while a worker's event budget
//   (trace_events_per_worker) lasts.
#include "graph/engine.h"

#include "graph/json.h"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace pipeline::graph {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <class T>
void bump(std::atomic<T>& a, T d) {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

struct TraceEvent {
  int64_t start_ns, dur_ns;
  uint8_t kind;  // 0 busy (process/produce), 1 blocked on a full queue
};

enum : uint8_t { wait_none = 0, wait_starved = 1, wait_blocked = 2 };

// Written only by its worker; read by the monitor (relaxed) and after the run.
struct alignas(64) Counters {
  std::atomic<uint64_t> in{0}, out{0}, discarded{0};
  std::atomic<int64_t> starved_ns{0}, blocked_ns{0};
  std::atomic<int64_t> start_ns{0}, end_ns{0};  // end 0: still running
  std::atomic<int64_t> wait_since{0};          // a wait in progress (for live numbers)
  std::atomic<uint8_t> wait_kind{wait_none};
  bool timed = false;  // stats on: measure waits
  size_t trace_cap = 0;
  std::vector<TraceEvent> trace;

  void begin_wait(uint8_t kind, int64_t t) {
    wait_since.store(t, std::memory_order_relaxed);
    wait_kind.store(kind, std::memory_order_relaxed);
  }
  void end_wait(uint8_t kind, int64_t t0) {
    int64_t t1 = now_ns();
    wait_kind.store(wait_none, std::memory_order_relaxed);
    bump(kind == wait_starved ? starved_ns : blocked_ns, t1 - t0);
    if (kind == wait_blocked && trace.size() < trace_cap) trace.push_back({t0, t1 - t0, 1});
  }
};

}  // namespace

// A bounded multi-producer multi-consumer queue with close (by producer count) and abort.
class Queue {
 public:
  Queue(int capacity, int producers) : capacity_(capacity), open_producers_(producers) {}

  // Waits while full. False when the graph was aborted.
  bool push(Item&& item, Counters* c) {
    std::unique_lock lock(mu_);
    if (static_cast<int>(items_.size()) >= capacity_ && !aborted_) {
      int64_t t0 = c->timed ? now_ns() : 0;
      if (c->timed) c->begin_wait(wait_blocked, t0);
      ++waiting_push_;
      not_full_.wait(lock, [&] { return static_cast<int>(items_.size()) < capacity_ || aborted_; });
      --waiting_push_;
      if (c->timed) c->end_wait(wait_blocked, t0);
    }
    if (aborted_) return false;
    items_.push_back(std::move(item));
    int n = static_cast<int>(items_.size());
    size_.store(n, std::memory_order_relaxed);
    if (n > high_water_.load(std::memory_order_relaxed)) high_water_.store(n, std::memory_order_relaxed);
    bool wake = waiting_pop_ > 0;
    lock.unlock();
    if (wake) not_empty_.notify_one();
    return true;
  }

  // Waits while empty and a producer is still open. False at end of stream or abort.
  bool pop(Item& item, uint64_t& ticket, Counters* c) {
    std::unique_lock lock(mu_);
    if (items_.empty() && open_producers_ > 0 && !aborted_) {
      int64_t t0 = c->timed ? now_ns() : 0;
      if (c->timed) c->begin_wait(wait_starved, t0);
      ++waiting_pop_;
      not_empty_.wait(lock, [&] { return !items_.empty() || open_producers_ == 0 || aborted_; });
      --waiting_pop_;
      if (c->timed) c->end_wait(wait_starved, t0);
    }
    if (aborted_ || items_.empty()) return false;
    item = std::move(items_.front());
    items_.pop_front();
    ticket = pops_++;
    size_.store(static_cast<int>(items_.size()), std::memory_order_relaxed);
    bool wake = waiting_push_ > 0;
    lock.unlock();
    if (wake) not_full_.notify_one();
    return true;
  }

  void producer_done() {
    std::lock_guard lock(mu_);
    if (--open_producers_ <= 0) not_empty_.notify_all();
  }

  void abort() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    items_.clear();  // drop payloads now: a failed run should not hold memory
    size_.store(0, std::memory_order_relaxed);
    not_empty_.notify_all();
    not_full_.notify_all();
  }

  int size() const { return size_.load(std::memory_order_relaxed); }
  int high_water() const { return high_water_.load(std::memory_order_relaxed); }
  int capacity() const { return capacity_; }

 private:
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<Item> items_;
  int capacity_;
  int open_producers_;
  bool aborted_ = false;
  int waiting_pop_ = 0, waiting_push_ = 0;
  uint64_t pops_ = 0;
  std::atomic<int> size_{0}, high_water_{0};
};

namespace {

struct StageRt {
  StageSpec spec;
  const StageType* type = nullptr;
  config::Section options;
  std::unique_ptr<Stage> stage;
  std::unique_ptr<Queue> input;  // null for sources
  std::vector<Queue*> outputs;
  std::vector<size_t> producers, consumers;  // indices into stages
  std::type_index out_type = typeid(void);   // resolved (any stages inherit their input's)
  std::string out_port;                      // port name, resolved
  bool ordered_commit = false;
  std::vector<std::unique_ptr<Counters>> counters;
  std::atomic<int> live_workers{0};
  std::atomic<uint64_t> seq{0};
  std::mutex turn_mu;
  std::condition_variable turn_cv;
  uint64_t next_turn = 0;
  std::atomic<int64_t> end_ns{0};
  std::atomic<int64_t> device_wait_ns{0}, device_busy_ns{0};

  bool source() const { return type->input.none(); }
  bool sink() const { return type->output.none(); }
  bool own_thread() const { return type->own_thread; }
};

// Per-queue sampler state (under EngineImpl::stats_mu_).
struct QueueSamples {
  std::vector<uint64_t> hist;  // count per occupancy level 0..capacity
  uint64_t n = 0;
  double window_sum = 0;
  uint64_t window_n = 0;
  double last_window_mean = 0;
};

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string port_label(const std::string& name, std::type_index t) {
  if (t == std::type_index(typeid(void))) return name.empty() ? "?" : name;
  return name;
}

}  // namespace

class EmitterImpl {
 public:
  EngineImpl* eng = nullptr;
  StageRt* st = nullptr;
  Counters* c = nullptr;
  bool ordered = false;
  uint64_t ticket = 0;
  bool have_turn = false;

  void emit(Item item);
  void acquire_turn();
  void release_turn();
};

class EngineImpl {
 public:
  EngineImpl(GraphSpec spec, EngineOptions opts, bool instantiate = true);
  void build(bool instantiate);
  void run();
  void worker(StageRt& st, int w);
  void finish_worker(StageRt& st, Emitter& out);
  void fail(const std::string& stage, std::exception_ptr e);
  void abort_all();
  void monitor();
  void sample_queues();
  Snapshot snapshot(bool finished, bool advance_window) const;
  void notify(const Snapshot& s);
  void write_trace() const;
  std::string dot() const;
  std::string where(const StageSpec& s) const {
    return (s.where.empty() ? (spec_.file.empty() ? std::string("graph") : spec_.file) : s.where) + ": [stages." + s.name + "]";
  }

  GraphSpec spec_;
  EngineOptions opts_;
  std::vector<std::unique_ptr<StageRt>> stages_;  // topological order
  bool tracing_ = false;

  std::atomic<int> stop_level_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> done_{false};
  std::mutex fail_mu_;
  std::string fail_stage_;
  std::exception_ptr fail_error_;
  std::string status_ = "not started";
  int64_t t0_ = 0;
  int64_t stop_at_ = 0;
  bool ran_ = false;

  mutable std::mutex stats_mu_;
  std::vector<QueueSamples> samples_;  // per stage (its input queue), empty for sources
  struct Window {
    int64_t t = 0;
    std::vector<uint64_t> items;
    std::vector<double> busy;
  };
  mutable Window last_report_;
  std::vector<std::function<void(const Snapshot&)>> observers_;
  std::ofstream jsonl_;
  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
};

// ---------------------------------------------------------------------------------------------
// Emission and ordered commit

void EmitterImpl::emit(Item item) {
  if (st->outputs.empty()) {
    if (st->sink())
      throw std::logic_error("stage '" + st->spec.name + "' (type " + st->type->name +
                             ") is a sink but emitted an item");
    return;  // a stage whose output nobody consumes: items end here
  }
  if (st->out_type != std::type_index(typeid(void)) && item.type() != st->out_type)
    throw std::logic_error("stage '" + st->spec.name + "' (type " + st->type->name + ") emitted a " +
                           type_name_of(item.type()) + " but its output port '" + st->out_port + "' carries " +
                           type_name_of(st->out_type));
  if (ordered && !have_turn) acquire_turn();
  item.set_seq(st->seq.fetch_add(1, std::memory_order_relaxed));
  size_t n = st->outputs.size();
  for (size_t i = 0; i < n; ++i) {
    const auto& accepts = eng->stages_[st->consumers[i]]->type->accepts;
    if (accepts && !accepts(item)) continue;
    if (!st->outputs[i]->push(Item(item), c)) throw Cancelled();
  }
  bump<uint64_t>(c->out, 1);
}

void EmitterImpl::acquire_turn() {
  std::unique_lock lock(st->turn_mu);
  if (st->next_turn != ticket) {
    int64_t t0 = c->timed ? now_ns() : 0;
    if (c->timed) c->begin_wait(wait_blocked, t0);
    st->turn_cv.wait(lock, [&] { return st->next_turn == ticket || eng->aborted_.load(); });
    if (c->timed) c->end_wait(wait_blocked, t0);
  }
  if (st->next_turn != ticket) throw Cancelled();
  have_turn = true;
}

void EmitterImpl::release_turn() {
  if (!have_turn) acquire_turn();
  {
    std::lock_guard lock(st->turn_mu);
    st->next_turn = ticket + 1;
  }
  have_turn = false;
  st->turn_cv.notify_all();
}

void Emitter::emit_item(Item item) { impl_->emit(std::move(item)); }
bool Emitter::stop_requested() const { return impl_->eng->stop_level_.load(std::memory_order_relaxed) > 0; }
void Emitter::add_device_wait(std::chrono::nanoseconds d) { impl_->st->device_wait_ns.fetch_add(d.count()); }
void Emitter::add_device_busy(const std::string& stage, std::chrono::nanoseconds d) {
  for (auto& p : impl_->eng->stages_)
    if (p->spec.name == stage) p->device_busy_ns.fetch_add(d.count());
}

// ---------------------------------------------------------------------------------------------
// Building: validation with messages that name stages and keys

namespace {

// Checks options set from code against the type's schema, the way Document::resolve does for
// TOML: defaults filled in, unknown keys and wrong types rejected.
config::Section resolve_code_options(const StageSpec& s, const StageType& t, const std::string& where) {
  config::Section out("stages." + s.name, where);
  for (const auto& [key, v] : s.values) {
    const config::OptionSpec* o = t.options.find(key);
    if (!o) {
      std::vector<std::string> keys;
      for (const auto& k : t.options.options()) keys.push_back(k.key);
      throw config::ConfigError(where + " unknown option '" + key + "' for stage type " + t.name +
                                "; expected one of: " + (keys.empty() ? "(none)" : join(keys)));
    }
    bool ok = false;
    config::Value val = v;
    switch (o->type) {
      case config::ValueType::integer: ok = std::holds_alternative<int64_t>(v); break;
      case config::ValueType::floating:
        ok = std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v);
        if (auto p = std::get_if<int64_t>(&v)) val = static_cast<double>(*p);
        break;
      case config::ValueType::boolean: ok = std::holds_alternative<bool>(v); break;
      case config::ValueType::string: ok = std::holds_alternative<std::string>(v); break;
      case config::ValueType::string_list:
        ok = std::holds_alternative<std::vector<std::string>>(v);
        if (auto p = std::get_if<std::string>(&v)) {
          val = std::vector<std::string>{*p};
          ok = true;
        }
        break;
    }
    if (!ok)
      throw config::ConfigError(where + " " + key + ": expected " + config::value_type_name(o->type) + ", got " +
                                config::value_to_string(v));
    double x = 0;
    bool numeric = false;
    if (auto p = std::get_if<int64_t>(&val)) x = static_cast<double>(*p), numeric = true;
    if (auto p = std::get_if<double>(&val)) x = *p, numeric = true;
    if (numeric && ((o->min && x < *o->min) || (o->max && x > *o->max)))
      throw config::ConfigError(where + " " + key + ": value " + config::value_to_string(val) + " is out of range");
    out.set(key, val, config::Location{"code", 0});
  }
  for (const auto& o : t.options.options()) {
    if (out.has(o.key)) continue;
    if (!o.default_value)
      throw config::ConfigError(where + " missing required option '" + o.key + "' (" + o.doc + ")");
    out.set(o.key, *o.default_value, config::Location{"default", 0});
  }
  return out;
}

// Reads `type` of a stage section: it decides which schema validates the rest of the section.
std::string section_type(const config::Document& doc, const std::string& section) {
  auto v = doc.peek(section, "type");
  if (auto s = v ? std::get_if<std::string>(&*v) : nullptr) return *s;
  int line = doc.section_line(section);
  std::string where = doc.file() + (line ? ":" + std::to_string(line) : std::string());
  if (!v)
    throw config::ConfigError(where + ": [" + section +
                              "] missing required key 'type' (a string: registered stage type, see `pipeline stages`)");
  throw config::ConfigError(where + ": [" + section + "] type: expected a string naming a stage type, got " +
                            config::value_to_string(*v));
}

}  // namespace

GraphSpec GraphSpec::from_config(const config::Document& doc, const std::string& prefix) {
  GraphSpec g;
  g.file = doc.file();
  doc.mark_known(prefix);
  auto names = doc.subsections(prefix);
  if (names.empty())
    throw config::ConfigError(doc.file() + ": no stages: expected sections [" + prefix + ".NAME] with a type");
  for (const auto& name : names) {
    std::string section = prefix + "." + name;
    std::string type_name = section_type(doc, section);
    const StageType* t = find_stage_type(type_name);
    int line = doc.section_line(section);
    std::string where = doc.file() + (line ? ":" + std::to_string(line) : std::string());
    if (!t) {
      std::vector<std::string> known;
      for (const StageType* k : stage_types()) known.push_back(k->name);
      config::Section common = doc.resolve(section, [&] {
        // Only to locate the `type` key for the message; the type's own keys are unknown here.
        config::Schema s = common_stage_schema();
        return s;
      }());
      throw common.error("type", "unknown stage type '" + type_name + "'; known types: " + join(known));
    }
    config::Schema schema = common_stage_schema();
    schema.extend(t->options);
    config::Section sec = doc.resolve(section, schema);
    StageSpec s;
    s.name = name;
    s.type = type_name;
    s.inputs = sec.get_string_list("input");
    s.workers = static_cast<int>(sec.get_int("workers"));
    s.capacity = static_cast<int>(sec.get_int("capacity"));
    s.where = where;
    s.resolved = std::move(sec);
    g.stages.push_back(std::move(s));
  }
  return g;
}

EngineImpl::EngineImpl(GraphSpec spec, EngineOptions opts, bool instantiate)
    : spec_(std::move(spec)), opts_(std::move(opts)) {
  build(instantiate);
}

void EngineImpl::build(bool instantiate) {
  const auto& specs = spec_.stages;
  if (specs.empty()) throw config::ConfigError((spec_.file.empty() ? "graph" : spec_.file) + ": the graph has no stages");
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!index.emplace(specs[i].name, i).second)
      throw config::ConfigError(where(specs[i]) + " a stage named '" + specs[i].name + "' is defined twice");
  }
  std::vector<std::string> known;
  for (const StageType* k : stage_types()) known.push_back(k->name);
  std::vector<const StageType*> types(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const StageSpec& s = specs[i];
    types[i] = find_stage_type(s.type);
    if (!types[i])
      throw config::ConfigError(where(s) + " type: unknown stage type '" + s.type + "'; known types: " + join(known));
    const StageType& t = *types[i];
    if (s.workers < 1) throw config::ConfigError(where(s) + " workers: expected >= 1, got " + std::to_string(s.workers));
    if (s.capacity < 1) throw config::ConfigError(where(s) + " capacity: expected >= 1, got " + std::to_string(s.capacity));
    if (t.max_workers > 0 && s.workers > t.max_workers)
      throw config::ConfigError(where(s) + " workers: stage type " + t.name + " allows at most " +
                                std::to_string(t.max_workers) + (t.own_thread ? " (it owns a thread)" : "") + ", got " +
                                std::to_string(s.workers));
    if (t.input.none() && !s.inputs.empty())
      throw config::ConfigError(where(s) + " input: stage type " + t.name + " is a source and takes no input, got " +
                                join(s.inputs));
    if (!t.input.none() && s.inputs.empty())
      throw config::ConfigError(where(s) + " input: stage type " + t.name + " needs an input (a stage producing " +
                                t.input.name + ")");
    if (t.ordered && s.inputs.size() > 1)
      throw config::ConfigError(where(s) + " input: stage type " + t.name +
                                " needs ordered input, which a merge of several inputs cannot give; got " + join(s.inputs));
    std::set<std::string> seen;
    for (const auto& in : s.inputs) {
      if (!index.count(in)) {
        std::vector<std::string> names;
        for (const auto& o : specs) names.push_back(o.name);
        throw config::ConfigError(where(s) + " input: no stage named '" + in + "'; stages: " + join(names));
      }
      if (!seen.insert(in).second) throw config::ConfigError(where(s) + " input: '" + in + "' is listed twice");
      if (in == s.name) throw config::ConfigError(where(s) + " input: the stage feeds itself (a cycle: " + in + " -> " + in + ")");
      if (types[index[in]] && types[index[in]]->output.none() && find_stage_type(specs[index[in]].type))
        throw config::ConfigError(where(s) + " input: '" + in + "' (type " + specs[index[in]].type +
                                  ") is a sink and produces nothing");
    }
  }
  for (size_t i = 0; i < specs.size(); ++i)
    for (const auto& in : specs[i].inputs)
      if (types[index[in]]->output.none())
        throw config::ConfigError(where(specs[i]) + " input: '" + in + "' (type " + specs[index[in]].type +
                                  ") is a sink and produces nothing");

  // Cycles: depth-first search; report the stages on the cycle in data-flow order.
  std::vector<int> state(specs.size(), 0);  // 0 new, 1 on stack, 2 done
  std::vector<size_t> stack, order;
  std::function<void(size_t)> visit = [&](size_t i) {
    state[i] = 1;
    stack.push_back(i);
    for (const auto& in : specs[i].inputs) {
      size_t j = index[in];
      if (state[j] == 1) {
        // stack holds consumers ... ; j is an upstream stage already on the stack.
        auto it = std::find(stack.begin(), stack.end(), j);
        std::vector<std::string> cyc;
        for (auto k = stack.end(); k != it;) cyc.push_back(specs[*--k].name);
        cyc.push_back(specs[i].name);
        throw config::ConfigError(where(specs[j]) + " the graph has a cycle: " + join(cyc, " -> "));
      }
      if (state[j] == 0) visit(j);
    }
    stack.pop_back();
    state[i] = 2;
    order.push_back(i);  // after all its inputs: topological order
  };
  for (size_t i = 0; i < specs.size(); ++i)
    if (state[i] == 0) visit(i);

  // Create runtimes in topological order, resolve port types (any = its input's type).
  std::vector<size_t> pos(specs.size());
  for (size_t k = 0; k < order.size(); ++k) pos[order[k]] = k;
  for (size_t k = 0; k < order.size(); ++k) {
    auto rt = std::make_unique<StageRt>();
    rt->spec = specs[order[k]];
    rt->type = types[order[k]];
    stages_.push_back(std::move(rt));
  }
  for (size_t k = 0; k < stages_.size(); ++k) {
    StageRt& st = *stages_[k];
    for (const auto& in : st.spec.inputs) {
      size_t p = pos[index[in]];
      st.producers.push_back(p);
      stages_[p]->consumers.push_back(k);
    }
    // Input type: every producer must match the declared input port (or each other for any).
    std::type_index in_type = typeid(void);
    std::string in_port;
    for (size_t p : st.producers) {
      StageRt& pr = *stages_[p];
      bool declared_any = st.type->input.any();
      if (!declared_any && pr.out_type != std::type_index(typeid(void)) && pr.out_type != st.type->input.type)
        throw config::ConfigError(where(st.spec) + " input: stage '" + st.spec.name + "' (type " + st.type->name +
                                  ") takes port type '" + st.type->input.name + "' (" + type_name_of(st.type->input.type) +
                                  "), but its input '" + pr.spec.name + "' (type " + pr.type->name + ") produces '" +
                                  pr.out_port + "' (" + type_name_of(pr.out_type) + ")");
      if (in_type != std::type_index(typeid(void)) && pr.out_type != std::type_index(typeid(void)) && pr.out_type != in_type)
        throw config::ConfigError(where(st.spec) + " input: the inputs of '" + st.spec.name + "' carry different types: '" +
                                  in_port + "' and '" + pr.out_port + "' (from '" + pr.spec.name + "')");
      if (pr.out_type != std::type_index(typeid(void))) {
        in_type = pr.out_type;
        in_port = pr.out_port;
      }
    }
    if (st.type->output.any()) {
      st.out_type = in_type;
      st.out_port = in_port.empty() ? "any" : in_port;
    } else if (!st.type->output.none()) {
      st.out_type = st.type->output.type;
      st.out_port = st.type->output.name;
    }
  }

  // Options, instances, queues.
  for (auto& p : stages_) {
    StageRt& st = *p;
    st.options = st.spec.resolved ? *st.spec.resolved : resolve_code_options(st.spec, *st.type, where(st.spec));
    if (!st.source()) st.input = std::make_unique<Queue>(st.spec.capacity, static_cast<int>(st.producers.size()));
  }
  for (auto& p : stages_)
    for (size_t c : p->consumers) p->outputs.push_back(stages_[c]->input.get());

  // Ordered commit: multi-worker stages upstream of an ordered stage.
  std::vector<bool> feeds_ordered(stages_.size(), false);
  for (size_t k = stages_.size(); k-- > 0;) {
    for (size_t c : stages_[k]->consumers)
      if (stages_[c]->type->ordered || feeds_ordered[c]) feeds_ordered[k] = true;
  }
  for (size_t k = 0; k < stages_.size(); ++k)
    stages_[k]->ordered_commit = feeds_ordered[k] && stages_[k]->spec.workers > 1 && !stages_[k]->source();

  tracing_ = opts_.stats && opts_.trace && !opts_.run_dir.empty();
  for (auto& p : stages_) {
    for (int w = 0; w < p->spec.workers; ++w) {
      auto c = std::make_unique<Counters>();
      c->timed = opts_.stats;
      c->trace_cap = tracing_ ? opts_.trace_events_per_worker : 0;
      if (tracing_) c->trace.reserve(std::min<size_t>(c->trace_cap, 4096));
      p->counters.push_back(std::move(c));
    }
  }
  samples_.resize(stages_.size());
  for (size_t k = 0; k < stages_.size(); ++k)
    if (stages_[k]->input) samples_[k].hist.assign(stages_[k]->spec.capacity + 1, 0);

  // Instances last: a stage constructor may be expensive (tokenizer vocab, model weights).
  if (!instantiate) return;
  for (auto& p : stages_) {
    StageContext ctx{p->spec.name, p->type->name, p->spec.workers, p->options};
    try {
      p->stage = p->type->factory(ctx);
    } catch (const config::ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw StageError(p->spec.name, std::string("building: ") + e.what(), std::current_exception());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Running

void EngineImpl::fail(const std::string& stage, std::exception_ptr e) {
  {
    std::lock_guard lock(fail_mu_);
    if (fail_error_) return;
    fail_stage_ = stage;
    fail_error_ = e;
  }
  abort_all();
}

void EngineImpl::abort_all() {
  aborted_.store(true);
  for (auto& p : stages_) {
    if (p->input) p->input->abort();
    { std::lock_guard lock(p->turn_mu); }
    p->turn_cv.notify_all();
  }
}

void EngineImpl::worker(StageRt& st, int w) {
  Counters& c = *st.counters[w];
  EmitterImpl ei;
  ei.eng = this;
  ei.st = &st;
  ei.c = &c;
  ei.ordered = st.ordered_commit;
  Emitter out(&ei, w);
  c.start_ns.store(now_ns(), std::memory_order_relaxed);
  bool discard = st.type->on_stop == OnStop::discard;
  try {
    if (st.own_thread()) st.stage->initialize();
    if (st.source()) {
      while (stop_level_.load(std::memory_order_relaxed) == 0 && !aborted_.load(std::memory_order_relaxed)) {
        bool more;
        if (c.trace.size() < c.trace_cap) {
          int64_t t0 = now_ns();
          more = st.stage->produce(out);
          c.trace.push_back({t0, now_ns() - t0, 0});
        } else {
          more = st.stage->produce(out);
        }
        if (!more) break;
      }
    } else {
      Item item;
      uint64_t ticket = 0;
      while (st.input->pop(item, ticket, &c)) {
        bump<uint64_t>(c.in, 1);
        ei.ticket = ticket;
        ei.have_turn = false;
        if (discard && stop_level_.load(std::memory_order_relaxed) > 0) {
          bump<uint64_t>(c.discarded, 1);
          item = Item();
        } else if (c.trace.size() < c.trace_cap) {
          int64_t t0 = now_ns();
          st.stage->process(std::move(item), out);
          c.trace.push_back({t0, now_ns() - t0, 0});
        } else {
          st.stage->process(std::move(item), out);
        }
        if (ei.ordered) ei.release_turn();
      }
    }
  } catch (const Cancelled&) {
  } catch (...) {
    fail(st.spec.name, std::current_exception());
  }
  ei.ordered = false;  // finalize() emits after every input: nothing to wait for
  finish_worker(st, out);
  c.end_ns.store(now_ns(), std::memory_order_relaxed);
}

void EngineImpl::finish_worker(StageRt& st, Emitter& out) {
  if (st.live_workers.fetch_sub(1) != 1) return;
  if (!aborted_.load()) {
    try {
      st.stage->finalize(out);
    } catch (const Cancelled&) {
    } catch (...) {
      fail(st.spec.name, std::current_exception());
    }
  }
  st.end_ns.store(now_ns(), std::memory_order_relaxed);
  for (Queue* q : st.outputs) q->producer_done();
}

void EngineImpl::run() {
  if (ran_) throw std::logic_error("Engine::run() called twice");
  ran_ = true;
  for (auto& p : stages_) p->live_workers.store(p->spec.workers);
  // CPU stages initialize on the calling thread before anything runs.
  for (auto& p : stages_) {
    if (p->own_thread()) continue;
    try {
      p->stage->initialize();
    } catch (const std::exception& e) {
      throw StageError(p->spec.name, std::string("initialize: ") + e.what(), std::current_exception());
    }
  }
  if (!opts_.run_dir.empty()) {
    std::filesystem::create_directories(opts_.run_dir);
    if (opts_.stats) jsonl_.open(opts_.run_dir / "stats.jsonl", std::ios::trunc);
  }
  t0_ = now_ns();
  last_report_.t = t0_;
  last_report_.items.assign(stages_.size(), 0);
  last_report_.busy.assign(stages_.size(), 0);
  {
    std::lock_guard lock(stats_mu_);
    status_ = "running";
  }
  std::thread mon([this] { monitor(); });

  std::vector<std::thread> own;
  int cpu_workers = 0;
  for (auto& p : stages_) {
    if (p->own_thread())
      own.emplace_back([this, st = p.get()] { worker(*st, 0); });
    else
      cpu_workers += p->spec.workers;
  }
  if (cpu_workers > 0) {
    // See the design note at the top: one thread per worker loop, so blocking cannot starve.
    int threads = cpu_workers + 1;
    int allowed = static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, std::max(threads, allowed));
    tbb::task_arena arena(threads, 1);
    arena.execute([&] {
      tbb::flow::graph g;
      std::vector<std::unique_ptr<tbb::flow::function_node<int, tbb::flow::continue_msg>>> nodes;
      for (auto& p : stages_) {
        if (p->own_thread()) continue;
        StageRt* st = p.get();
        nodes.push_back(std::make_unique<tbb::flow::function_node<int, tbb::flow::continue_msg>>(
            g, static_cast<size_t>(st->spec.workers), [this, st](int w) {
              worker(*st, w);
              return tbb::flow::continue_msg();
            }));
        for (int w = 0; w < st->spec.workers; ++w) nodes.back()->try_put(w);
      }
      g.wait_for_all();
    });
  }
  for (auto& t : own) t.join();
  {
    std::lock_guard lock(monitor_mu_);
    done_.store(true);
  }
  monitor_cv_.notify_all();
  mon.join();

  {
    std::scoped_lock lock(fail_mu_, stats_mu_);
    if (fail_error_) {
      try {
        std::rethrow_exception(fail_error_);
      } catch (const std::exception& e) {
        status_ = "failed: stage '" + fail_stage_ + "': " + e.what();
      } catch (...) {
        status_ = "failed: stage '" + fail_stage_ + "'";
      }
    } else if (aborted_.load()) {
      status_ = "aborted";
    } else if (stop_level_.load() > 0) {
      status_ = "stopped";
    } else {
      status_ = "done";
    }
  }
  Snapshot final_snap = snapshot(true, false);
  if (opts_.stats) {
    Verdict v = analyze(final_snap);
    if (jsonl_.is_open()) {
      jsonl_ << to_json(final_snap, &v) << "\n";
      jsonl_.close();
    }
    if (!opts_.run_dir.empty()) {
      std::ofstream(opts_.run_dir / "stats_summary.json", std::ios::trunc) << to_json(final_snap, &v) << "\n";
      if (tracing_) write_trace();
    }
    notify(final_snap);
  }
  if (fail_error_) {
    try {
      std::rethrow_exception(fail_error_);
    } catch (const std::exception& e) {
      throw StageError(fail_stage_, e.what(), fail_error_);
    } catch (...) {
      throw StageError(fail_stage_, "unknown exception", fail_error_);
    }
  }
}

void EngineImpl::notify(const Snapshot& s) {
  for (auto& fn : observers_) {
    try {
      fn(s);
    } catch (...) {
      // A failing observer (a closed terminal) must not take the run down.
    }
  }
}

void EngineImpl::monitor() {
  using namespace std::chrono;
  int64_t sample_ns = duration_cast<nanoseconds>(opts_.sample_interval).count();
  int64_t report_ns = duration_cast<nanoseconds>(opts_.report_interval).count();
  int64_t grace_ns = duration_cast<nanoseconds>(opts_.stop_grace).count();
  if (sample_ns <= 0) sample_ns = 20'000'000;
  int64_t next_sample = now_ns(), next_report = now_ns() + report_ns;
  std::unique_lock lock(monitor_mu_);
  while (!done_.load()) {
    int64_t now = now_ns();
    int level = stop_level_.load();
    if (level > 0 && stop_at_ == 0) stop_at_ = now;
    if (!aborted_.load() && (level >= 2 || (stop_at_ != 0 && now - stop_at_ > grace_ns))) abort_all();
    if (opts_.stats && now >= next_sample) {
      sample_queues();
      next_sample += sample_ns;
      if (next_sample < now) next_sample = now + sample_ns;  // fell behind: skip, do not burst
    }
    if (opts_.stats && report_ns > 0 && now >= next_report) {
      next_report = now + report_ns;
      Snapshot s = snapshot(false, true);
      if (jsonl_.is_open()) {
        Verdict v = analyze(s);
        jsonl_ << to_json(s, &v) << "\n";
        jsonl_.flush();
      }
      lock.unlock();
      notify(s);
      lock.lock();
    }
    int64_t wake = opts_.stats ? std::min(next_sample, next_report) : now_ns() + sample_ns;
    monitor_cv_.wait_for(lock, nanoseconds(std::max<int64_t>(wake - now_ns(), 100'000)));
  }
}

void EngineImpl::sample_queues() {
  std::lock_guard lock(stats_mu_);
  for (size_t k = 0; k < stages_.size(); ++k) {
    if (!stages_[k]->input) continue;
    int n = std::clamp(stages_[k]->input->size(), 0, stages_[k]->spec.capacity);
    QueueSamples& q = samples_[k];
    q.hist[n]++;
    q.n++;
    q.window_sum += n;
    q.window_n++;
  }
}

Snapshot EngineImpl::snapshot(bool finished, bool advance_window) const {
  Snapshot s;
  int64_t now = now_ns();
  s.t_s = t0_ ? (now - t0_) / 1e9 : 0;
  s.finished = finished;
  std::lock_guard lock(stats_mu_);
  s.status = status_;
  double window_s = (now - last_report_.t) / 1e9;
  for (size_t k = 0; k < stages_.size(); ++k) {
    const StageRt& st = *stages_[k];
    StageStats x;
    x.name = st.spec.name;
    x.type = st.type->name;
    x.workers = st.spec.workers;
    x.source = st.source();
    x.sink = st.sink() || st.consumers.empty();
    x.own_thread = st.own_thread();
    int64_t first = 0, last = 0;
    for (const auto& cp : st.counters) {
      const Counters& c = *cp;
      x.items_in += c.in.load(std::memory_order_relaxed);
      x.items_out += c.out.load(std::memory_order_relaxed);
      x.discarded += c.discarded.load(std::memory_order_relaxed);
      int64_t start = c.start_ns.load(std::memory_order_relaxed);
      if (!start) continue;
      int64_t end = c.end_ns.load(std::memory_order_relaxed);
      if (!end) end = now;
      int64_t starved = c.starved_ns.load(std::memory_order_relaxed), blocked = c.blocked_ns.load(std::memory_order_relaxed);
      uint8_t wk = c.wait_kind.load(std::memory_order_relaxed);
      if (wk != wait_none && !c.end_ns.load(std::memory_order_relaxed)) {
        int64_t since = c.wait_since.load(std::memory_order_relaxed);
        if (since && since < now) (wk == wait_starved ? starved : blocked) += now - since;
      }
      x.starved_s += starved / 1e9;
      x.blocked_s += blocked / 1e9;
      x.busy_s += std::max<int64_t>(0, (end - start) - starved - blocked) / 1e9;
      first = first ? std::min(first, start) : start;
      last = std::max(last, end);
    }
    x.wall_s = first ? (last - first) / 1e9 : 0;
    x.device_wait_s = st.device_wait_ns.load(std::memory_order_relaxed) / 1e9;
    x.device_busy_s = st.device_busy_ns.load(std::memory_order_relaxed) / 1e9;
    uint64_t items = x.source ? x.items_out : x.items_in;
    if (!last_report_.items.empty() && window_s > 0) {
      x.window_items_per_s = (items - last_report_.items[k]) / window_s;
      x.window_busy = std::clamp((x.busy_s - last_report_.busy[k]) / (window_s * x.workers), 0.0, 1.0);
      if (advance_window) {
        last_report_.items[k] = items;
        last_report_.busy[k] = x.busy_s;
      }
    }
    s.stages.push_back(std::move(x));
    if (!st.input) continue;
    QueueStats q;
    q.consumer = st.spec.name;
    for (size_t p : st.producers) q.producers.push_back(stages_[p]->spec.name);
    q.capacity = st.spec.capacity;
    q.current = st.input->size();
    q.high_water = st.input->high_water();
    const QueueSamples& qs = samples_[k];
    q.samples = qs.n;
    if (qs.n) {
      double sum = 0;
      uint64_t acc = 0;
      bool have50 = false, have95 = false;
      for (size_t i = 0; i < qs.hist.size(); ++i) {
        if (!qs.hist[i]) continue;
        sum += static_cast<double>(i) * qs.hist[i];
        acc += qs.hist[i];
        q.max_sampled = static_cast<int>(i);
        if (!have50 && acc * 2 >= qs.n) q.p50 = static_cast<double>(i), have50 = true;
        if (!have95 && acc * 100 >= qs.n * 95) q.p95 = static_cast<double>(i), have95 = true;
      }
      q.mean = sum / qs.n;
      q.full = static_cast<double>(qs.hist.back()) / qs.n;
      q.empty = static_cast<double>(qs.hist.front()) / qs.n;
    }
    q.window_mean = qs.window_n ? qs.window_sum / qs.window_n : qs.last_window_mean;
    s.queues.push_back(std::move(q));
  }
  if (advance_window) {
    last_report_.t = now;
    for (size_t k = 0; k < stages_.size(); ++k) {
      QueueSamples& qs = const_cast<QueueSamples&>(samples_[k]);
      if (qs.window_n) qs.last_window_mean = qs.window_sum / qs.window_n;
      qs.window_sum = 0;
      qs.window_n = 0;
    }
  }
  return s;
}

void EngineImpl::write_trace() const {
  // Chrome trace-event JSON: one track (tid) per worker, complete ("X") events in microseconds.
  std::ofstream os(opts_.run_dir / "trace.json", std::ios::trunc);
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"pipeline\"}}";
  int tid = 0;
  char buf[256];
  for (const auto& p : stages_) {
    std::string name = json_quote(p->spec.name);
    if (name.size() > 200) name = json_quote(p->spec.name.substr(0, 190));
    for (size_t w = 0; w < p->counters.size(); ++w) {
      ++tid;
      os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid << ",\"args\":{\"name\":"
         << json_quote(p->spec.name + " #" + std::to_string(w)) << "}}";
      os << ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid
         << ",\"args\":{\"sort_index\":" << tid << "}}";
      for (const TraceEvent& e : p->counters[w]->trace) {
        std::snprintf(buf, sizeof buf, ",\n{\"name\":%s,\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                      e.kind == 0 ? name.c_str() : "\"blocked\"", e.kind == 0 ? "busy" : "blocked", tid,
                      (e.start_ns - t0_) / 1e3, e.dur_ns / 1e3);
        os << buf;
      }
    }
  }
  os << "\n]}\n";
}

// ---------------------------------------------------------------------------------------------
// Public API

Engine::Engine(GraphSpec spec, EngineOptions opts) : impl_(std::make_unique<EngineImpl>(std::move(spec), std::move(opts))) {}
Engine::~Engine() = default;
void Engine::run() { impl_->run(); }
void Engine::stop() { impl_->stop_level_.fetch_add(1); }
void Engine::abort() { impl_->stop_level_.fetch_add(2); }
bool Engine::stop_requested() const { return impl_->stop_level_.load() > 0; }
Snapshot Engine::snapshot() const { return impl_->snapshot(false, false); }
void Engine::add_observer(std::function<void(const Snapshot&)> fn) { impl_->observers_.push_back(std::move(fn)); }

std::vector<std::string> Engine::stage_names() const {
  std::vector<std::string> out;
  for (const auto& p : impl_->stages_) out.push_back(p->spec.name);
  return out;
}

std::vector<config::Section> Engine::stage_options() const {
  std::vector<config::Section> out;
  for (const auto& p : impl_->stages_) out.push_back(p->options);
  return out;
}

std::string Engine::dot() const { return impl_->dot(); }

void validate(const GraphSpec& spec) { EngineImpl(spec, {}, false); }

std::string to_dot(const GraphSpec& spec) { return EngineImpl(spec, {}, false).dot(); }

std::string EngineImpl::dot() const {
  std::ostringstream os;
  os << "digraph pipeline {\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef3fb\", fontname=\"Helvetica\"];\n"
        "  edge [fontname=\"Helvetica\", fontsize=10];\n";
  for (const auto& p : stages_) {
    const StageRt& st = *p;
    os << "  \"" << st.spec.name << "\" [label=\"" << st.spec.name << "\\n" << st.type->name << "  x" << st.spec.workers;
    if (st.own_thread()) os << "\\n(own thread)";
    if (st.type->ordered) os << "\\n(ordered input)";
    os << "\"";
    if (st.own_thread()) os << ", fillcolor=\"#fde2c8\"";
    if (st.source()) os << ", shape=invhouse";
    if (st.sink()) os << ", shape=house";
    os << "];\n";
  }
  for (const auto& p : stages_) {
    for (size_t pr : p->producers) {
      const StageRt& from = *stages_[pr];
      os << "  \"" << from.spec.name << "\" -> \"" << p->spec.name << "\" [label=\"" << port_label(from.out_port, from.out_type)
         << "\\ncap " << p->spec.capacity << "\"];\n";
    }
  }
  os << "}\n";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// SIGINT: the handler only touches an atomic (async-signal-safe); the monitor acts on it.

namespace {
std::atomic<Engine*> g_sigint_engine{nullptr};
extern "C" void pipeline_on_sigint(int) {
  if (Engine* e = g_sigint_engine.load()) e->stop();
}
}  // namespace

SigintGuard::SigintGuard(Engine& engine) {
  g_sigint_engine.store(&engine);
  auto prev = std::signal(SIGINT, pipeline_on_sigint);
  previous_ = reinterpret_cast<void*>(prev);
}

SigintGuard::~SigintGuard() {
  std::signal(SIGINT, reinterpret_cast<void (*)(int)>(previous_));
  g_sigint_engine.store(nullptr);
}

}  // namespace pipeline::graph
