// The bottleneck rule. In a pipeline of bounded edges the slowest stage is the one that is busy
// all the time: everything upstream of it fills its input and then waits with its output edge
// full, and everything downstream drains and then waits for input. So, over the steady-state
// window (the last few seconds once every stage runs; the whole run when there is no window):
//   1. Each stage's busy share is the time its worker slots spent in an invocation, less the
//      time asleep on the device in it (device wait, a share of its own: rule 7). The rest is
//      idle: starved (nothing on its input), blocked (its output edge full), order wait (its
//      output edge full of items waiting for their turn in order), ready (input and room, but no
//      core ran it).
//   2. The bottleneck is the stage with the highest busy share, if at least `saturated` (80%);
//      ties go to the one whose input edge is full more often. The verdict quotes its busy share
//      and workers, how often its input was full, the consumer that waited longest for input,
//      and its rate: what it can do with its workers (workers / time per item) next to what
//      the stages after it could take.
//   3. CPU-bound: when the CPU stages together keep about all the arena's cores busy (their
//      threads' CPU time), more workers cannot help; the verdict says so and names the stage
//      that spends the most CPU per item.
//   4. Order: with no stage saturated, a stage that is busy or waiting for its turn in order
//      (its finished items held back until an earlier one is done) most of the time limits
//      the graph through the ordered consumer after it.
//   5. A source is named only when it is busy ("limited by source read"), never because it is
//      blocked; with no stage saturated the verdict says where the idle time went.
//   6. A stage that does device work (train: its forward, backward and step are timed with CUDA
//      events, device_busy_s) is judged by the device's time, not its host thread's: a thread
//      that only launches kernels can be idle while the GPU is saturated. Over the steady state
//      where there is one (the device time of the steps completed in it), else the whole run:
//        GPU-bound: the device busy >= `saturated` (on the CPU the host clock stands in, and
//          the verdict says so);
//        launch-bound: the device idles while the host thread is busy (CUDA only): launches,
//          not kernels, are the limit;
//        waiting for input: the device and the thread idle, the input queue empty: the input
//          side's bottleneck (rules 1-5 on the rest) is named, with the device's share.
//   7. Busy is host work only: a stage asleep on the device (Emitter::add_device_wait: train waiting
//      for step N-2, log for a step's values) is not busy then. When a stage's busy share plus its
//      device wait reaches `saturated`, more than any stage's busy share, and rule 6 did not
//      answer (the device events time only part of the device's work, say), the device's work
//      holds the graph: the verdict names the stage whose device time is measured (train), or the
//      waiting stage itself when no stage's is, never the waiting stage for being "busy".
#include "graph/observe/verdict.h"

#include "graph/observe/percent.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

namespace pipeline::graph {

namespace {

std::string rate(double per_s) {
  char buf[32];
  if (per_s >= 100)
    std::snprintf(buf, sizeof buf, "%.0f/s", per_s);
  else
    std::snprintf(buf, sizeof buf, "%.3g/s", per_s);
  return buf;
}

// What every rule judges: the steady state where the snapshot has one, else the whole run.
struct View {
  explicit View(const Snapshot& snap) : s(snap), steady(snap.has_steady()) {
    for (const auto& x : s.stages) whole_.push_back(x.whole_run());
  }
  const Snapshot& s;
  bool steady;
  const StageSpan& span(const StageStats& x) const { return steady && x.steady.seconds > 0 ? x.steady : whole(x); }
  // whole_run() computed once per stage.
  const StageSpan& whole(const StageStats& x) const {
    for (size_t i = 0; i < s.stages.size(); ++i)
      if (&s.stages[i] == &x) return whole_[i];
    return whole_.front();
  }
  double full(const QueueStats& q) const { return steady ? q.steady_full : q.full; }
  double empty(const QueueStats& q) const { return steady ? q.steady_empty : q.empty; }
  std::vector<StageSpan> whole_;
};

// The edges out of stage `name`, and into it.
template <class F>
void each_output(const Snapshot& s, const std::string& name, F f) {
  for (const auto& q : s.queues)
    if (std::find(q.producers.begin(), q.producers.end(), name) != q.producers.end()) f(q);
}

}  // namespace

std::string verdict_key(const Verdict& v) { return v.kind + "|" + v.stage; }

namespace {

// Rules 1-5: the stages' host-side shares.
Verdict analyze_host(const View& view, double saturated) {
  const Snapshot& s = view.s;
  Verdict v;
  if (view.steady) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "steady state, %.1f s (%.1f s to %.1f s)", s.steady_seconds(), s.steady_from_s,
                  s.steady_to_s);
    v.span = buf;
  } else {
    v.span = "whole run";
  }
  auto full_of = [&](const StageStats& st) {
    const QueueStats* q = s.queue_of(st.name);
    return q ? view.full(*q) : 0.0;
  };
  const StageStats* best = nullptr;
  for (const auto& st : s.stages) {
    const StageSpan& w = view.span(st);
    if (w.seconds <= 0) continue;
    if (!best || w.busy > view.span(*best).busy + 1e-9 ||
        (std::abs(w.busy - view.span(*best).busy) <= 1e-9 && full_of(st) > full_of(*best)))
      best = &st;
  }
  // Edges that alternate between a blocked producer and a starved consumer want more slack.
  for (const auto& q : s.queues) {
    const StageStats* c = s.stage(q.consumer);
    for (const auto& pn : q.producers) {
      const StageStats* p = s.stage(pn);
      if (p && c && view.span(*p).blocked > 0.2 && view.span(*c).starved > 0.2)
        v.notes.push_back("edge " + pn + " -> " + q.consumer + " is bursty: " + pn + " blocked " +
                          pct(view.span(*p).blocked) + " while " + q.consumer + " starved " +
                          pct(view.span(*c).starved) + "; try a larger queue (capacity = " +
                          std::to_string(q.capacity * 2) + ")");
    }
  }
  if (!best) {
    v.kind = "none";
    v.text = "no data yet";
    return v;
  }
  // A reader waiting on the network looks busy too: when a side stage's own work (the fetch
  // stage's connections) is saturated, it is the limit, not the reader it holds up.
  if (view.span(*best).busy >= saturated && (best->source || best->side))
    for (const auto& st : s.stages)
      if (st.side && view.span(st).seconds > 0 && view.span(st).busy >= saturated &&
          (!best->side || view.span(st).busy > view.span(*best).busy))
        best = &st;

  // CPU: the arena's cores against what the CPU stages use of them. A stage "computes" over the
  // window when its threads' CPU time is a fair part of its busy time (a sleeping delay stage
  // is busy but does not compute); the cores are used up when the computing stages keep about
  // all of them occupied, or their CPU time alone adds up to about all of them.
  double cpu_cores = 0, computing_slots = 0;
  const StageStats* costliest = nullptr;
  for (const auto& st : s.stages) {
    if (st.own_thread) continue;
    const StageSpan& w = view.span(st);
    if (w.seconds <= 0) continue;
    cpu_cores += w.cpu_cores;
    const double slots = w.busy * st.workers;
    if (slots > 0 && w.cpu_cores >= 0.3 * slots) computing_slots += slots;
    if (w.cpu_ms_per_item > 0 && (!costliest || w.cpu_ms_per_item > view.span(*costliest).cpu_ms_per_item))
      costliest = &st;
  }
  const int cores = s.cores;
  const bool cpu_bound = cores > 0 && (cpu_cores >= 0.85 * cores || computing_slots >= 0.9 * cores);
  char buf[512];
  std::string cpu_text;
  if (cpu_bound) {
    std::snprintf(buf, sizeof buf, "CPU-bound: %.1f of %d core%s busy with the CPU stages (their CPU time: %.1f cores)",
                  std::min<double>(cores, std::max(computing_slots, cpu_cores)), cores, cores == 1 ? "" : "s",
                  cpu_cores);
    cpu_text = buf;
    if (costliest) {
      std::snprintf(buf, sizeof buf, "; %s spends the most CPU per item (%.3g ms)", costliest->name.c_str(),
                    view.span(*costliest).cpu_ms_per_item);
      cpu_text += buf;
    }
  }

  const StageSpan& b = view.span(*best);
  if (b.busy < saturated) {
    if (cpu_bound) {
      v.kind = "cpu";
      v.stage = costliest ? costliest->name : "";
      v.text = cpu_text + "; no stage is saturated: the stages wait for a core";
      v.suggestion = "more workers will not help: a cheaper stage type, fewer workers on competing stages, or more cores";
      return v;
    }
    // A stage whose workers are done but wait for an earlier item's turn (out-of-order results
    // fill the ordered consumer's input) limits the graph as surely as a busy one.
    const StageStats* waiting = nullptr;
    for (const auto& st : s.stages) {
      const StageSpan& w = view.span(st);
      if (w.seconds > 0 && w.busy + w.order_wait >= saturated && w.order_wait > 0.1 &&
          (!waiting || w.order_wait > view.span(*waiting).order_wait))
        waiting = &st;
    }
    if (waiting) {
      const StageSpan& w = view.span(*waiting);
      std::string next;
      int cap = 0;
      each_output(s, waiting->name, [&](const QueueStats& q) {
        if (next.empty()) next = q.consumer, cap = q.capacity;
      });
      if (next.empty()) next = "the next stage";
      v.kind = "order";
      v.stage = waiting->name;
      std::snprintf(buf, sizeof buf,
                    "%s: busy %s and waiting for its turn in order %s with %d worker%s: finished items wait for an "
                    "earlier one before %s can take them in order",
                    waiting->name.c_str(), pct(w.busy).c_str(), pct(w.order_wait).c_str(), waiting->workers,
                    waiting->workers == 1 ? "" : "s", next.c_str());
      v.text = buf;
      v.suggestion = "a larger input queue for " + next + " (capacity = " + std::to_string(std::max(2, cap * 2)) +
                     ") lets more items overtake a slow one; less variable time per item helps too";
      return v;
    }
    double starved = 0, blocked = 0, order = 0, ready = 0, device = 0, n = 0;
    for (const auto& st : s.stages) {
      const StageSpan& w = view.span(st);
      if (w.seconds <= 0) continue;
      starved += w.starved, blocked += w.blocked, order += w.order_wait, ready += w.ready, n += 1;
      device += w.device_wait;
    }
    v.kind = "none";
    std::snprintf(buf, sizeof buf,
                  "no stage is saturated (busiest: %s at %s); idle time across the stages: waiting for input %s, "
                  "on a full output %s, for their turn in order %s, for a core %s",
                  best->name.c_str(), pct(b.busy).c_str(), pct(starved / n).c_str(), pct(blocked / n).c_str(),
                  pct(order / n).c_str(), pct(ready / n).c_str());
    v.text = buf;
    if (shows_device_wait(device / n)) v.text += "; asleep on the device " + pct(device / n);
    v.suggestion = ready > std::max({starved, blocked, order}) ? "the stages wait for a core: other work shares the CPU"
                                                                : "the pipeline has spare capacity at this load";
    return v;
  }

  v.stage = best->name;
  if (best->side) {
    // Beside the graph: no queue of its own; it says what it moves, and what to try.
    v.kind = "side";
    v.text = best->name + ": " + pct(b.busy) + " of its " + std::to_string(best->workers) +
             (best->workers == 1 ? " worker" : " workers") + "' time at work" +
             (best->note.empty() ? std::string() : ", " + best->note);
    v.suggestion = best->suggestion.empty() ? "more " + best->name + " workers" : best->suggestion;
    return v;
  }
  v.kind = best->source ? "source" : best->sink ? "sink" : "stage";
  std::string text = best->name + ": " + busy_text(b.busy, b.device_wait) + " with " + std::to_string(best->workers) +
                     (best->workers == 1 ? " worker" : " workers");
  if (const QueueStats* q = s.queue_of(best->name)) text += "; its input queue full " + pct(view.full(*q)) + " of the time";
  // The consumer right after it that waited longest for input, and how much faster every stage
  // downstream of it could go (the smallest capacity over demand among them). A consumer that
  // took nothing in the span (a routing filter passed it no item: eval between evaluations) says
  // nothing about this stage's pace, so one that took items comes first.
  const StageStats* hungriest = nullptr;
  auto took = [&](const StageStats* c) { return view.span(*c).in_per_s > 0; };
  each_output(s, best->name, [&](const QueueStats& q) {
    const StageStats* c = s.stage(q.consumer);
    if (!c) return;
    if (!hungriest || took(c) > took(hungriest) ||
        (took(c) == took(hungriest) && view.span(*c).starved > view.span(*hungriest).starved))
      hungriest = c;
  });
  double headroom = 0;
  std::vector<std::string> todo{best->name}, seen{best->name};
  while (!todo.empty()) {
    std::string at = todo.back();
    todo.pop_back();
    each_output(s, at, [&](const QueueStats& q) {
      if (std::find(seen.begin(), seen.end(), q.consumer) != seen.end()) return;
      seen.push_back(q.consumer);
      todo.push_back(q.consumer);
      const StageStats* c = s.stage(q.consumer);
      if (!c) return;
      const StageSpan& w = view.span(*c);
      if (w.in_per_s > 0 && w.capacity_per_s > 0) {
        double h = w.capacity_per_s / w.in_per_s;
        headroom = headroom == 0 ? h : std::min(headroom, h);
      }
    });
  }
  if (hungriest) text += "; " + hungriest->name + " waited for input " + pct(view.span(*hungriest).starved) + " of the time";
  const double through = best->source ? b.out_per_s : b.in_per_s;
  if (b.capacity_per_s > 0) {
    text += "; it can do " + rate(b.capacity_per_s) + " with " + std::to_string(best->workers) +
            (best->workers == 1 ? " worker" : " workers");
    if (headroom > 100)
      text += ", the stages after it could take over 100 times that";
    else if (headroom > 0 && through > 0)
      text += ", the stages after it could take " + rate(through * headroom);
  }
  if (v.kind == "source") text = "limited by source " + text;
  if (v.kind == "sink") text = "limited by sink " + text;
  if (cpu_bound && !best->own_thread) {
    v.kind = "cpu";
    v.text = cpu_text + "; " + text;
    v.suggestion = "more " + best->name +
                   " workers will not help: the cores are used up; a cheaper stage type, fewer workers on competing "
                   "stages, or more cores";
    return v;
  }
  v.text = text;
  if (best->source)
    v.suggestion = "the source is the limit, and more workers downstream will not help: a faster source (pre-tokenized "
                   "data with read_tokens, faster storage) or a cheaper one";
  else if (best->own_thread)
    v.suggestion = "it owns a thread, so more workers are not an option: try a faster " + best->name +
                   " stage type or less work per item";
  else
    v.suggestion = "try more " + best->name + " workers (workers = " + std::to_string(best->workers * 2) +
                   ") or a faster stage type";
  return v;
}

// The stage whose device time is measured (the most of it), or null.
const StageStats* device_stage(const Snapshot& s) {
  const StageStats* d = nullptr;
  for (const auto& st : s.stages)
    if (st.device_busy_s > 0 && st.wall_s > 0 && (!d || st.device_busy_s > d->device_busy_s)) d = &st;
  return d;
}

// Rule 6, or nothing when the device stage is neither saturated, launch-bound nor starved (it
// waits on its output, say: the host rules name what holds it).
std::optional<Verdict> analyze_device(const View& view, const StageStats& d, const Verdict& host, double saturated) {
  const Snapshot& s = view.s;
  // Over the steady state, as the host rules judge: the whole run's share counts the start-up
  // (building the model, the first steps' kernel selection, a CUDA graph's capture) as idle
  // device time, which put a GPU-bound run of a few hundred steps under `saturated`.
  const StageSpan& w = view.span(d);
  const double device = std::min(1.0, w.device_busy);
  const QueueStats* in = s.queue_of(d.name);
  const double empty = in ? view.empty(*in) : 0.0;
  const char* clock = d.device_busy_gpu ? "GPU" : "compute";
  const std::string timed = d.device_busy_gpu ? " (device events)" : " (host clock: a CPU run)";
  char buf[512];
  Verdict v = host;
  if (device >= saturated) {
    v.kind = "device";
    v.stage = d.name;
    std::snprintf(buf, sizeof buf, "%s: %s busy %s in forward, backward and step%s; its thread busy %s",
                  d.name.c_str(), clock, pct(device).c_str(), timed.c_str(), pct(w.busy).c_str());
    v.text = buf;
    if (shows_device_wait(w.device_wait)) v.text += ", waiting for the device " + pct(w.device_wait);
    v.text += ", waiting for input " + pct(w.starved);
    v.suggestion = d.device_busy_gpu
                       ? "the GPU is the limit and the input side keeps up: a faster step comes from the model side (bf16, "
                         "CUDA graphs, fused kernels), more throughput from more GPUs"
                       : "the model's compute is the limit and the input side keeps up: more threads ([run] threads), a "
                         "smaller model, or a GPU";
    return v;
  }
  if (d.device_busy_gpu && w.busy >= saturated) {
    v.kind = "launch";
    v.stage = d.name;
    std::snprintf(buf, sizeof buf,
                  "%s: launch-bound: its host thread busy %s while the GPU is busy %s in forward, backward and step "
                  "(device events); the GPU idles %s waiting for kernels to be launched",
                  d.name.c_str(), pct(w.busy).c_str(), pct(device).c_str(), pct(1.0 - device).c_str());
    v.text = buf;
    v.suggestion = "more work per launch: a larger [training] batch_size (with grad_accum lowered to keep the global "
                   "batch), or [training] cuda_graph = true (one launch per step's graph)";
    return v;
  }
  if (w.starved >= 0.5 || empty >= 0.5) {
    std::snprintf(buf, sizeof buf, "%s waits for input: %s busy %s%s, its thread waiting for input %s, its input queue empty %s of the time",
                  d.name.c_str(), clock, pct(device).c_str(), timed.c_str(), pct(w.starved).c_str(), pct(empty).c_str());
    const bool upstream = !host.stage.empty() && host.stage != d.name && host.kind != "none";
    if (upstream) {
      // The input side's own bottleneck is the answer: keep its kind and stage (autotune acts on them).
      v.text = std::string(buf) + "; the input side's limit: " + host.text;
      return v;
    }
    v.kind = "input";
    v.stage = d.name;
    v.text = std::string(buf) + "; " + host.text;
    v.suggestion = "the input side cannot keep up, though none of its stages is saturated: larger queues or more "
                   "buffers in front of " + d.name + ", or pre-tokenized data (read_tokens)";
    return v;
  }
  return std::nullopt;
}

// Rule 7, or nothing when no stage spends most of its time asleep on the device: the stage whose
// busy share plus device wait is the largest, at least `saturated` and above what the host
// verdict's stage is occupied with. The device stage `d` is named unless it is itself held up by
// its output (a consumer that waits on the device for work of its own: eval's forward passes).
std::optional<Verdict> analyze_device_wait(const View& view, const StageStats* d, const Verdict& host,
                                           double saturated) {
  const Snapshot& s = view.s;
  const StageStats* waiting = nullptr;
  double most = 0;
  for (const auto& st : s.stages) {
    const StageSpan& w = view.span(st);
    if (w.seconds <= 0 || !shows_device_wait(w.device_wait) || w.busy >= saturated) continue;
    if (w.busy + w.device_wait > most) waiting = &st, most = w.busy + w.device_wait;
  }
  if (!waiting || most < saturated) return std::nullopt;
  if (const StageStats* named = host.stage.empty() ? nullptr : s.stage(host.stage)) {
    const StageSpan& h = view.span(*named);
    if (h.busy + (host.kind == "order" ? h.order_wait : 0.0) >= most) return std::nullopt;
  }
  const StageSpan& w = view.span(*waiting);
  if (d && d != waiting) {
    const StageSpan& dw = view.span(*d);
    if (dw.blocked + dw.order_wait > dw.busy + dw.device_wait) d = nullptr;  // held by its output
  }
  Verdict v = host;
  const std::string occupied = busy_text(w.busy, w.device_wait) + " with " + std::to_string(waiting->workers) +
                               (waiting->workers == 1 ? " worker" : " workers");
  std::string queue;
  if (const QueueStats* q = s.queue_of(waiting->name)) queue = "; its input queue full " + pct(view.full(*q)) + " of the time";
  std::string text;
  if (d) {
    const StageSpan& dw = view.span(*d);
    v.kind = "device";
    v.stage = d->name;
    text = d->name + ": the device's work is the limit: ";
    if (d == waiting)
      text += "its thread " + occupied + queue;
    else
      text += waiting->name + " waits for it, " + occupied + queue + "; " + d->name + "'s thread " +
              busy_text(dw.busy, dw.device_wait);
    text += std::string("; ") + (d->device_busy_gpu ? "GPU" : "compute") + " busy " +
            pct(std::min(1.0, dw.device_busy)) + " in forward, backward and step" +
            (d->device_busy_gpu ? " (device events: the device's other work is not in that share)"
                                : " (host clock: a CPU run)");
    v.suggestion = "the device is the limit and the input side keeps up: a faster step comes from the model side (bf16, "
                   "CUDA graphs, fused kernels); a profile shows what the device runs besides forward, backward and step";
  } else {
    v.kind = waiting->source ? "source" : waiting->sink ? "sink" : "stage";
    v.stage = waiting->name;
    text = waiting->name + ": " + occupied + ", asleep on the device" + queue;
    v.suggestion = "the device work " + waiting->name + " waits for is the limit: less of it per item, or a faster device";
  }
  v.text = text;
  return v;
}

}  // namespace

Verdict analyze(const Snapshot& s, double saturated) {
  const View view(s);
  Verdict host = analyze_host(view, saturated);
  const StageStats* d = device_stage(s);
  if (d)
    if (auto v = analyze_device(view, *d, host, saturated)) return *v;
  if (auto v = analyze_device_wait(view, d, host, saturated)) return *v;
  return host;
}

Verdict VerdictTracker::update(const Snapshot& s, bool& changed) {
  changed = false;
  Verdict v = analyze(s);
  const std::string key = verdict_key(v);
  if (!any_ || key == shown_key_ || s.finished) {
    changed = any_ && key != shown_key_;
    any_ = true;
    shown_key_ = key;
    pending_n_ = 0;
    return v;
  }
  // A different verdict: shown once it has held for `dwell_` reports in a row.
  pending_n_ = key == pending_key_ ? pending_n_ + 1 : 1;
  pending_key_ = key;
  if (pending_n_ >= dwell_) {
    changed = true;
    shown_key_ = key;
    pending_n_ = 0;
    return v;
  }
  // Keep naming the shown one, with this snapshot's numbers when it is a stage.
  Verdict held = v;
  auto bar = shown_key_.find('|');
  held.kind = shown_key_.substr(0, bar);
  held.stage = shown_key_.substr(bar + 1);
  if (const StageStats* st = s.stage(held.stage)) {
    const StageSpan& w = s.has_steady() && st->steady.seconds > 0 ? st->steady : st->whole_run();
    held.text = held.stage + ": " + busy_text(w.busy, w.device_wait) + " with " + std::to_string(st->workers) +
                (st->workers == 1 ? " worker" : " workers") + " (held; " + v.stage + " may take over: " + v.text + ")";
  } else {
    held.text = v.text;
  }
  return held;
}

}  // namespace pipeline::graph
