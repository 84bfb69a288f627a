// See monitor.h.
#include "graph/observe/monitor.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <sys/resource.h>

#include "base/atomic_file.h"
#include "base/thread_name.h"
#include "graph/observe/autotune.h"
#include "base/json.h"

namespace pipeline::graph {

namespace {

double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

Monitor::Monitor(Runtime& rt) : rt_(rt) {}

Monitor::~Monitor() { stop(); }

void Monitor::start() {
  autotuner_ = std::make_unique<Autotuner>(rt_);
  if (!rt_.opts.run_dir.empty() && rt_.opts.stats) {
    jsonl_.open(rt_.opts.run_dir / "stats.jsonl", std::ios::trunc);
    if (!jsonl_) throw std::runtime_error((rt_.opts.run_dir / "stats.jsonl").string() + ": cannot open for writing");
  }
  {
    std::lock_guard lock(mu_);
    status_ = "running";
    window_.t = rt_.t0;
    window_.items.assign(rt_.stages.size(), 0);
    window_.busy.assign(rt_.stages.size(), 0);
    window_.wait.assign(rt_.stages.size(), 0);
    last_sample_ = rt_.t0;
  }
  thread_ = std::thread([this] {
    name_this_thread("monitor");
    main();
  });
}

void Monitor::stop() {
  {
    std::lock_guard lock(wake_mu_);
    done_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Monitor::set_status(std::string status) {
  std::lock_guard lock(mu_);
  status_ = std::move(status);
}

void Monitor::annotate(Snapshot& s) {
  if (!rt_.opts.annotate) return;
  try {
    rt_.opts.annotate(s);
  } catch (...) {
    // The caller's figures are extras: the run goes on without them.
  }
}

void Monitor::notify(const Snapshot& s) {
  for (auto& fn : observers_) {
    try {
      fn(s);
    } catch (...) {
      // A failing observer (a closed terminal) must not take the run down.
    }
  }
}

void Monitor::main() {
  using namespace std::chrono;
  const int64_t sample_ns = std::max<int64_t>(duration_cast<nanoseconds>(rt_.opts.sample_interval).count(), 100'000);
  const int64_t report_ns = duration_cast<nanoseconds>(rt_.opts.report_interval).count();
  const int64_t grace_ns = duration_cast<nanoseconds>(rt_.opts.stop_grace).count();
  int64_t next_sample = now_ns(), next_report = now_ns() + report_ns, stop_at = 0;
  std::unique_lock lock(wake_mu_);
  while (!done_) {
    int64_t now = now_ns();
    int level = rt_.stop_level.load();
    if (level > 0 && stop_at == 0) stop_at = now;
    if (!rt_.failing() && (level >= 2 || (grace_ns > 0 && stop_at != 0 && now - stop_at > grace_ns))) rt_.abort();
    if (rt_.opts.stats && now >= next_sample) {
      sample(now);
      next_sample += sample_ns;
      if (next_sample < now) next_sample = now + sample_ns;  // fell behind: skip, do not burst
    }
    if (rt_.opts.stats && report_ns > 0 && now >= next_report) {
      next_report = now + report_ns;
      lock.unlock();
      report();
      lock.lock();
    }
    int64_t wake = rt_.opts.stats ? std::min(next_sample, next_report) : now_ns() + sample_ns;
    wake_.wait_for(lock, nanoseconds(std::max<int64_t>(wake - now_ns(), 100'000)));
  }
}

void Monitor::report() {
  Snapshot s = snapshot(false, true);
  bool changed = false;
  s.verdict = tracker_.update(s, changed);
  if (changed) log_event({s.t_s, "verdict", s.verdict.stage.empty() ? s.verdict.text : s.verdict.text});
  for (Event& e : autotuner_->step(s)) log_event(std::move(e));
  if (autotuner_->moved()) steady_floor_ = now_ns();  // a changed graph: its steady state starts again
  {
    std::lock_guard lock(mu_);
    s.events = std::move(fresh_events_);
    fresh_events_.clear();
  }
  annotate(s);
  if (jsonl_.is_open()) {
    jsonl_ << to_json(s) << "\n";
    jsonl_.flush();
  }
  notify(s);
}

void Monitor::log_event(Event e) {
  if (jsonl_.is_open()) {
    jsonl_ << to_json(e) << "\n";
    jsonl_.flush();
  }
  std::lock_guard lock(mu_);
  events_.push_back(e);
  fresh_events_.push_back(std::move(e));
}

std::vector<Event> Monitor::events() const {
  std::lock_guard lock(mu_);
  return events_;
}

void Monitor::sample(int64_t now) {
  std::lock_guard lock(mu_);
  const double dt = (now - last_sample_) / 1e9;
  last_sample_ = now;
  for (auto& e : rt_.edges) {
    int64_t load = e->load.load(std::memory_order_relaxed);
    int64_t n = std::clamp<int64_t>(load, 0, static_cast<int64_t>(e->hist.size()) - 1);
    e->hist[static_cast<size_t>(n)]++;
    e->samples++;
    e->sum += static_cast<double>(n);
    e->full_n += load >= e->capacity();
    e->empty_n += load <= 0;
    e->window_sum += static_cast<double>(n);
    e->window_n++;
  }
  if (dt <= 0) return;
  for (auto& stp : rt_.stages) {
    StageRt& st = *stp;
    if (st.done.load(std::memory_order_relaxed)) continue;
    int64_t workers = st.is_source() ? 1 : st.worker_slots.bound();
    // An invocation waiting for a place on an on-demand edge is idle (blocked), not busy.
    const int64_t working = st.running.load(std::memory_order_relaxed) - st.placing.load(std::memory_order_relaxed);
    double idle = static_cast<double>(std::max<int64_t>(0, workers - working)) * dt;
    if (idle <= 0) continue;
    bool input = false, full = false, in_order = false;
    for (EdgeRt* e : st.inputs)
      if (e->load.load(std::memory_order_relaxed) - e->held.load(std::memory_order_relaxed) > 0) input = true;
    // A place held by an input admitted that has not started yet is that input's: not blocked on it.
    int64_t held = 0;
    if (!st.is_source()) {
      held = st.admission.sent() - st.admission.used_count();
      for (const auto& c : st.counters) held -= static_cast<int64_t>(c->started.load(std::memory_order_relaxed));
      held = std::max<int64_t>(held, 0);
    }
    for (EdgeRt* e : st.outputs)
      if (e->credits.full(e->on_demand ? 0 : held)) {
        full = true;
        in_order |= e->in_order.load(std::memory_order_relaxed) > 0;
      }
    if (!st.is_source() && !input)
      st.idle_starved_w += idle;
    else if (full && in_order)
      st.idle_order_w += idle;
    else if (full)
      st.idle_blocked_w += idle;
    else
      st.idle_ready_w += idle;
  }
}

Monitor::Mark Monitor::mark_now(int64_t now) const {
  Mark m;
  m.t = now;
  m.process_cpu_s = process_cpu_s();
  for (const auto& stp : rt_.stages) {
    const StageRt& st = *stp;
    StageMark x;
    for (const auto& cp : st.counters) {
      x.in += cp->in.load(std::memory_order_relaxed);
      x.out += cp->out.load(std::memory_order_relaxed);
      x.busy_ns += cp->busy_ns.load(std::memory_order_relaxed);
      int64_t since = cp->busy_since.load(std::memory_order_relaxed);
      if (since && since < now) x.busy_ns += now - since;
      x.cpu_ns += cp->cpu_ns.load(std::memory_order_relaxed);
      x.wait_ns += cp->device_wait_ns.load(std::memory_order_relaxed);
    }
    x.device_ns = st.device_busy_ns.load(std::memory_order_relaxed);
    x.starved = st.idle_starved_w, x.blocked = st.idle_blocked_w, x.order = st.idle_order_w, x.ready = st.idle_ready_w;
    m.stages.push_back(x);
  }
  for (const auto& e : rt_.edges) m.edges.push_back({e->samples, e->full_n, e->empty_n, e->sum});
  return m;
}

void Monitor::fill_steady(Snapshot& s, const Mark& now) {
  // The window starts once every stage that takes all its input has started (stages that only
  // take some items, eval and checkpoint, start late by design), and spans at most the last
  // steady_window seconds: the first mark at or after that.
  int64_t started = 0;
  for (const auto& st : rt_.stages) {
    if (st->is_side()) continue;  // beside the graph: it takes no input
    int64_t first = st->first_ns.load(std::memory_order_relaxed);
    bool occasional = !st->inputs.empty() && st->inputs.front()->accepts;
    if (!occasional) started = first ? std::max(started, first) : INT64_MAX;
  }
  // It ends where the drain begins: once a source has ended (end of input, a stop, or train
  // done with its steps), what follows is the tail of the run (the last items, a final eval),
  // not its steady state.
  int64_t drain = 0;
  for (const auto& st : rt_.stages)
    if (st->is_source()) {
      int64_t end = st->end_ns.load(std::memory_order_relaxed);
      if (end && (!drain || end < drain)) drain = end;
    }
  if (rt_.stop_level.load() > 0 && !drain) drain = now.t;
  const Mark* end = &now;
  if (drain && drain < now.t) {
    end = nullptr;
    for (const auto& m : marks_)
      if (m.t <= drain) end = &m;
    if (!end) return;
  }
  const int64_t span_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(rt_.opts.steady_window).count();
  const int64_t from = std::max({started, end->t - span_ns, steady_floor_.load()});
  const Mark* start = nullptr;
  for (const auto& m : marks_)
    if (m.t >= from) {
      start = &m;
      break;
    }
  if (started == INT64_MAX || !start || end->t - start->t < 500'000'000) return;  // no steady state yet
  const Mark& at = *end;
  const double seconds = (at.t - start->t) / 1e9;
  s.steady_from_s = (start->t - rt_.t0) / 1e9;
  s.steady_to_s = (at.t - rt_.t0) / 1e9;
  s.process_cores = (at.process_cpu_s - start->process_cpu_s) / seconds;
  for (size_t k = 0; k < rt_.stages.size(); ++k) {
    const StageRt& st = *rt_.stages[k];
    const StageMark& a = start->stages[k];
    const StageMark& b = at.stages[k];
    StageStats& x = s.stages[k];
    StageSpan& w = x.steady;
    w.seconds = seconds;
    const double wait_s = (b.wait_ns - a.wait_ns) / 1e9;
    const double busy_s = std::max(0.0, (b.busy_ns - a.busy_ns) / 1e9 - wait_s);  // host work
    w.busy = std::clamp(busy_s / (seconds * x.workers), 0.0, 1.0);
    w.device_wait = std::clamp(wait_s / (seconds * x.workers), 0.0, 1.0 - w.busy);
    const double rest = 1 - w.busy - w.device_wait;
    const double starved = b.starved - a.starved, blocked = b.blocked - a.blocked, order = b.order - a.order,
                 ready = b.ready - a.ready, idle = starved + blocked + order + ready;
    if (idle > 0) {
      w.starved = rest * starved / idle;
      w.blocked = rest * blocked / idle;
      w.order_wait = rest * order / idle;
      w.ready = rest * ready / idle;
    } else if (x.source) {
      w.ready = rest;
    } else {
      w.starved = rest;
    }
    const double in = static_cast<double>(b.in - a.in), out = static_cast<double>(b.out - a.out);
    const double items = x.source ? out : in;
    w.in_per_s = in / seconds;
    w.out_per_s = out / seconds;
    w.cpu_cores = (b.cpu_ns - a.cpu_ns) / 1e9 / seconds;
    w.cpu_ms_per_item = items > 0 ? (b.cpu_ns - a.cpu_ns) / 1e6 / items : 0;
    w.capacity_per_s = busy_s + wait_s > 0 ? items / (busy_s + wait_s) * x.workers : 0;
    // Reported as each step completes (log waits for its events): the steps done in the window.
    w.device_busy = std::clamp((b.device_ns - a.device_ns) / 1e9 / seconds, 0.0, 1.0);
    if (st.kind == StageKind::cpu || st.kind == StageKind::source) s.cpu_cores += w.cpu_cores;
  }
  for (size_t i = 0; i < rt_.edges.size(); ++i) {
    const EdgeMark& a = start->edges[i];
    const EdgeMark& b = at.edges[i];
    QueueStats& q = s.queues[i];
    if (b.samples <= a.samples) continue;
    const double n = static_cast<double>(b.samples - a.samples);
    q.steady_mean = (b.sum - a.sum) / n;
    q.steady_full = static_cast<double>(b.full - a.full) / n;
    q.steady_empty = static_cast<double>(b.empty - a.empty) / n;
  }
}

Snapshot Monitor::snapshot(bool finished, bool report) {
  Snapshot s;
  const int64_t now = now_ns();
  s.t_s = rt_.t0 ? (now - rt_.t0) / 1e9 : 0;
  s.finished = finished;
  s.cores = rt_.threads;
  std::lock_guard lock(mu_);
  s.status = status_;
  const double window_s = (now - window_.t) / 1e9;
  // Side stages count their own work: their reports go into their counters, where the windows
  // and the steady state read every stage's.
  std::vector<SideReport> side(rt_.stages.size());
  for (size_t k = 0; k < rt_.stages.size(); ++k) {
    StageRt& st = *rt_.stages[k];
    if (!st.is_side() || !st.stage || st.counters.empty()) continue;
    try {
      side[k] = st.stage->side_report();
    } catch (...) {
      continue;  // a report that failed is skipped: the figures stay as they were
    }
    st.start_workers = std::max(1, side[k].workers);
    st.side_knobs = side[k].knobs;
    SlotCounters& c = *st.counters.front();
    // Never more than its workers' whole time since the run began (a stage counting from before).
    const double most_s = rt_.t0 ? (now - rt_.t0) / 1e9 * st.start_workers : 0;
    c.busy_ns.store(static_cast<int64_t>(std::min(side[k].busy_s, most_s) * 1e9), std::memory_order_relaxed);
    c.in.store(side[k].items, std::memory_order_relaxed);
    c.out.store(side[k].items, std::memory_order_relaxed);
  }
  for (size_t k = 0; k < rt_.stages.size(); ++k) {
    const StageRt& st = *rt_.stages[k];
    StageStats x;
    x.name = st.spec.name;
    x.type = st.type->name;
    int64_t slots = st.is_source() ? 0 : st.worker_slots.bound();  // 0 before the flow graph is built
    x.workers = slots > 0 ? static_cast<int>(slots) : (st.is_source() ? 1 : st.start_workers);
    x.source = st.is_source();
    x.sink = !st.is_side() && (st.is_sink() || st.outputs.empty());
    x.own_thread = st.kind == StageKind::own_thread;
    if (st.is_side()) {
      x.side = true;
      x.figures = std::move(side[k].figures);
      x.note = std::move(side[k].note);
      x.suggestion = std::move(side[k].suggestion);
    }
    int64_t busy_ns = 0, device_wait_ns = 0, cpu_ns = 0;
    for (const auto& cp : st.counters) {
      const SlotCounters& c = *cp;
      x.items_in += c.in.load(std::memory_order_relaxed);
      x.items_out += c.out.load(std::memory_order_relaxed);
      x.discarded += c.discarded.load(std::memory_order_relaxed);
      busy_ns += c.busy_ns.load(std::memory_order_relaxed);
      int64_t since = c.busy_since.load(std::memory_order_relaxed);
      if (since && since < now) busy_ns += now - since;
      device_wait_ns += c.device_wait_ns.load(std::memory_order_relaxed);
      cpu_ns += c.cpu_ns.load(std::memory_order_relaxed);
    }
    if (rt_.t0) {
      int64_t end = st.end_ns.load(std::memory_order_relaxed);
      x.wall_s = ((end ? end : now) - rt_.t0) / 1e9;
    }
    // Host work: the invocations' time less the device waits reported in them.
    x.busy_s = std::max<int64_t>(0, busy_ns - device_wait_ns) / 1e9;
    x.cpu_s = cpu_ns / 1e9;
    x.device_wait_s = device_wait_ns / 1e9;
    x.device_busy_s = st.device_busy_ns.load(std::memory_order_relaxed) / 1e9;
    x.device_busy_gpu = st.device_busy_gpu.load(std::memory_order_relaxed);
    // Idle worker time, split in the proportions the samples saw.
    double idle = std::max(0.0, x.wall_s * x.workers - x.busy_s - x.device_wait_s);
    double seen = st.idle_starved_w + st.idle_blocked_w + st.idle_order_w + st.idle_ready_w;
    if (seen > 0) {
      x.starved_s = idle * st.idle_starved_w / seen;
      x.blocked_s = idle * st.idle_blocked_w / seen;
      x.order_wait_s = idle * st.idle_order_w / seen;
      x.ready_s = idle * st.idle_ready_w / seen;
    } else if (x.source) {
      x.ready_s = idle;
    } else {
      x.starved_s = idle;
    }
    uint64_t items = x.source ? x.items_out : x.items_in;
    if (!window_.items.empty() && window_s > 0) {
      x.window_items_per_s = static_cast<double>(items - window_.items[k]) / window_s;
      x.window_busy = std::clamp((x.busy_s - window_.busy[k]) / (window_s * x.workers), 0.0, 1.0);
      x.window_device_wait =
          std::clamp((x.device_wait_s - window_.wait[k]) / (window_s * x.workers), 0.0, 1.0 - x.window_busy);
      if (report) {
        window_.items[k] = items;
        window_.busy[k] = x.busy_s;
        window_.wait[k] = x.device_wait_s;
      }
    }
    s.stages.push_back(std::move(x));
  }
  for (auto& ep : rt_.edges) {
    EdgeRt& e = *ep;
    QueueStats q;
    q.consumer = rt_.stages[e.consumer]->spec.name;
    q.producers.push_back(rt_.stages[e.producer]->spec.name);
    q.capacity = e.capacity() > 0 ? e.capacity() : rt_.stages[e.consumer]->spec.capacity;
    q.current = static_cast<int>(e.load.load(std::memory_order_relaxed));
    q.high_water = static_cast<int>(e.high_water.load(std::memory_order_relaxed));
    q.samples = e.samples;
    if (e.samples) {
      uint64_t acc = 0;
      bool have50 = false, have95 = false;
      for (size_t i = 0; i < e.hist.size(); ++i) {
        if (!e.hist[i]) continue;
        acc += e.hist[i];
        q.max_sampled = static_cast<int>(i);
        if (!have50 && acc * 2 >= e.samples) q.p50 = static_cast<double>(i), have50 = true;
        if (!have95 && acc * 100 >= e.samples * 95) q.p95 = static_cast<double>(i), have95 = true;
      }
      q.mean = e.sum / static_cast<double>(e.samples);
      q.full = static_cast<double>(e.full_n) / static_cast<double>(e.samples);
      q.empty = static_cast<double>(e.empty_n) / static_cast<double>(e.samples);
    }
    q.window_mean = e.window_n ? e.window_sum / static_cast<double>(e.window_n) : e.last_window_mean;
    if (report) {
      if (e.window_n) e.last_window_mean = e.window_sum / static_cast<double>(e.window_n);
      e.window_sum = 0;
      e.window_n = 0;
    }
    s.queues.push_back(std::move(q));
  }
  if (rt_.t0 && rt_.opts.stats) {
    Mark m = mark_now(now);
    fill_steady(s, m);
    if (report) {
      window_.t = now;
      marks_.push_back(std::move(m));
      const int64_t keep = std::chrono::duration_cast<std::chrono::nanoseconds>(rt_.opts.steady_window).count() +
                           4 * std::chrono::duration_cast<std::chrono::nanoseconds>(rt_.opts.report_interval).count();
      while (marks_.size() > 2 && marks_.front().t < now - keep) marks_.pop_front();
    }
  }
  return s;
}

void Monitor::finish(Snapshot final_snapshot) {
  if (!rt_.opts.stats) return;
  // The final verdict is the plain analysis (nothing left to flicker), logged if it differs.
  final_snapshot.verdict = analyze(final_snapshot);
  bool changed = false;
  tracker_.update(final_snapshot, changed);
  if (changed) log_event({final_snapshot.t_s, "verdict", final_snapshot.verdict.text});
  {
    std::lock_guard lock(mu_);
    final_snapshot.events = std::move(fresh_events_);
    fresh_events_.clear();
  }
  std::string line = to_json(final_snapshot);
  if (jsonl_.is_open()) {
    jsonl_ << line << "\n";
    jsonl_.close();
    if (!jsonl_) throw std::runtime_error((rt_.opts.run_dir / "stats.jsonl").string() + ": write failed");
  }
  if (!rt_.opts.run_dir.empty()) {
    write_file_atomic(rt_.opts.run_dir / "stats_summary.json", line + "\n");
    if (rt_.tracing) write_trace();
  }
  notify(final_snapshot);
}

void Monitor::write_trace() const {
  // Chrome trace-event JSON: one track (tid) per worker slot, complete ("X") events in µs.
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"pipeline\"}}";
  int tid = 0;
  char buf[256];
  for (const auto& p : rt_.stages) {
    std::string name = json_quote(p->spec.name.size() > 190 ? p->spec.name.substr(0, 190) : p->spec.name);
    for (size_t w = 0; w < p->counters.size(); ++w) {
      ++tid;
      os << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid << ",\"args\":{\"name\":"
         << json_quote(p->spec.name + " #" + std::to_string(w)) << "}}";
      os << ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid
         << ",\"args\":{\"sort_index\":" << tid << "}}";
      for (const auto& e : p->counters[w]->trace) {
        std::snprintf(buf, sizeof buf, ",\n{\"name\":%s,\"cat\":\"busy\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                      name.c_str(), tid, (e.start_ns - rt_.t0) / 1e3, e.dur_ns / 1e3);
        os << buf;
      }
    }
  }
  os << "\n]}\n";
  write_file_atomic(rt_.opts.run_dir / "trace.json", os.str());
}

}  // namespace pipeline::graph
