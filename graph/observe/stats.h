// Run statistics: per-stage counters and per-edge occupancy, over the whole run and over the
// steady-state window, the bottleneck verdict computed from them (graph/observe/verdict.cpp), events
// (verdict changes, autotune decisions), their JSON form (stats.jsonl lines,
// stats_summary.json) so `pipeline stats` can re-read a finished or running run, and the
// summary table and chart (graph/observe/report.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace pipeline::graph {

/// One stage over a span of time: shares of its worker time, and rates.
struct StageSpan {
  double seconds = 0;  // the span's length (0: no data)
  // Shares of worker time, summing to 1: busy is host work only; device_wait the time asleep on the
  // device (Emitter::add_device_wait: train waiting for step N-2, log for a step's values); the
  // other four are idle, by cause.
  double busy = 0, device_wait = 0, starved = 0, blocked = 0, order_wait = 0, ready = 0;
  double in_per_s = 0, out_per_s = 0;  // items taken and emitted per second
  double cpu_cores = 0;                // cores its code kept busy on average (thread CPU time)
  double cpu_ms_per_item = 0;          // CPU time per item (taken; emitted, for a source)
  double capacity_per_s = 0;           // items/s it could take: workers / (host work + device wait) per item
  double device_busy = 0;  // share of the span the device spent on the stage's work (device_busy_s)
};

struct StageStats {
  std::string name, type;
  int workers = 1;
  bool source = false, sink = false, own_thread = false;
  uint64_t items_in = 0, items_out = 0, discarded = 0;
  // Worker seconds, summed over workers. busy_s is host work: the time in an invocation less
  // its device waits (device_wait_s), so busy_s + device_wait_s + the four idle causes = wall_s * workers.
  double busy_s = 0, starved_s = 0, blocked_s = 0;
  double order_wait_s = 0;  // idle, output edge full of items waiting for their turn in order
  double ready_s = 0;       // idle with input waiting and room downstream: waiting for a CPU core
  double cpu_s = 0;         // CPU time of the stage's own code (thread CPU clock, sampled)
  double wall_s = 0;        // seconds the stage has existed (per worker)
  double device_wait_s = 0;  // asleep on the device (Emitter::add_device_wait), apart from busy_s
  double device_busy_s = 0;  // GPU time spent for this stage (Emitter::add_device_busy)
  bool device_busy_gpu = false;  // device_busy_s from GPU events (false: the host clock stood in)
  // Over the last report window (live view): rate, busy share (host work) and device-wait share.
  double window_items_per_s = 0, window_busy = 0, window_device_wait = 0;
  int rank = -1;  // data parallel: the rank whose stage this is (-1: a single process)
  // A side stage (StageType::side: the fetch stage): beside the graph, with no queues; its own
  // figures ("bytes_per_s", "hit_rate", ...), what the verdict says of it when it is the limit,
  // and what to try then.
  bool side = false;
  std::vector<std::pair<std::string, double>> figures;
  std::string note, suggestion;
  /// A figure of `figures`, or `fallback`.
  double figure(const std::string& name, double fallback = 0) const {
    for (const auto& [k, v] : figures)
      if (k == name) return v;
    return fallback;
  }
  /// Over the steady-state window (see Snapshot::steady_from_s).
  StageSpan steady;

  /// Shares of worker time over the whole run, in [0, 1].
  double busy() const { return wall_s > 0 ? busy_s / (wall_s * workers) : 0; }
  double device_wait() const { return wall_s > 0 ? device_wait_s / (wall_s * workers) : 0; }
  double starved() const { return wall_s > 0 ? starved_s / (wall_s * workers) : 0; }
  double blocked() const { return wall_s > 0 ? blocked_s / (wall_s * workers) : 0; }
  double order_wait() const { return wall_s > 0 ? order_wait_s / (wall_s * workers) : 0; }
  double ready() const { return wall_s > 0 ? ready_s / (wall_s * workers) : 0; }
  /// Items per second through the stage: outputs for sources, inputs otherwise.
  double items_per_s() const { return wall_s > 0 ? static_cast<double>(source ? items_out : items_in) / wall_s : 0; }
  /// The whole run as a span (the same fields as `steady`).
  StageSpan whole_run() const;
};

/// An edge: the items between a producer and a consumer.
struct QueueStats {
  std::string consumer;                // the stage that takes from it
  std::vector<std::string> producers;  // the stage that puts into it
  int capacity = 0;
  int current = 0;     // occupancy at the snapshot
  int high_water = 0;  // exact maximum ever held (counted at every put)
  uint64_t samples = 0;
  double mean = 0, p50 = 0, p95 = 0;
  int max_sampled = 0;
  double full = 0, empty = 0;  // share of samples at capacity / at zero
  double window_mean = 0;      // mean over the last report window
  double steady_mean = 0, steady_full = 0, steady_empty = 0;  // over the steady-state window
};

/// Which stage limits throughput, with the numbers that say so and what to try.
struct Verdict {
  std::string stage;       // "" when no single stage is named
  std::string kind;        // "stage", "source", "sink", "side" (a side stage: the fetch stage's network),
                           // "cpu" (the cores are used up), "order" (waiting for
                           // the turn of a slow item), "device" (the device's work), "launch" (kernel
                           // launches), "input" (a device stage short of input), "straggler" or "none"
  std::string text;        // "tokenize: busy 99% with 4 workers; its input queue full 97% ..."
  std::string suggestion;  // "try more tokenize workers (workers = 8)"
  std::vector<std::string> notes;  // secondary observations (a bursty edge that wants a larger queue)
  std::string span;        // what it was judged over: "steady state, last 10.0 s" or "whole run"
};

/// Something that happened during a run, for the timeline: the verdict changed, or autotune
/// moved a knob (with its reason and the rates before and after).
struct Event {
  double t_s = 0;
  std::string kind;  // "verdict" or "autotune"
  std::string text;
};

struct Snapshot {
  double t_s = 0;          // seconds since run() started
  bool finished = false;   // the final snapshot
  std::string status;      // "running", "done", "stopped", "failed: ..."
  std::vector<StageStats> stages;  // in graph (topological) order
  std::vector<QueueStats> queues;
  /// The steady-state window: [steady_from_s, steady_to_s], the last few seconds once every
  /// stage was running (the start, with its filling queues, is left out) and before the drain
  /// began (the tail after a source ended). steady_from_s < 0: no window.
  double steady_from_s = -1, steady_to_s = -1;
  int cores = 0;             // threads of the arena the CPU stages share
  double cpu_cores = 0;      // cores the CPU stages kept busy over the window (thread CPU time)
  double process_cores = 0;  // cores the whole process kept busy over the window (torch's own threads too)
  /// The engine's verdict for this snapshot (steady state, held for a few reports before it
  /// changes so that it does not flicker); empty `kind` when the snapshot was not made by an engine.
  Verdict verdict;
  /// Events since the previous report (for the live view; stats.jsonl has them as lines of
  /// their own).
  std::vector<Event> events;
  /// The figures of whatever the graph computes, added by its runner (EngineOptions::annotate):
  /// for a training run step, loss, tokens_per_s, ms_per_step, mfu, device_busy. "train" in JSON.
  std::vector<std::pair<std::string, double>> train;

  const StageStats* stage(const std::string& name) const;
  const QueueStats* queue_of(const std::string& consumer) const;
  /// A figure of `train`, or `fallback` when the runner gave none of that name.
  double train_figure(const std::string& name, double fallback = 0) const;
  bool has_steady() const { return steady_from_s >= 0 && steady_to_s > steady_from_s; }
  double steady_seconds() const { return has_steady() ? steady_to_s - steady_from_s : 0; }
};

/// A side stage's figures in words, as the tables and the live view print them: bytes_per_s (or a
/// name ending in _bytes_per_s) is a rate of bytes ("41.2 MB/s"), _bytes a size, _rate a share ("hit rate 97%"),
/// anything else a number with its name ("3 retries"). "" for a stage without figures.
std::string figures_text(const StageStats& st);

/// The bottleneck rule (graph/observe/verdict.cpp, README "How the verdict is reached"), over the
/// steady-state window when the snapshot has one, else over the whole run.
Verdict analyze(const Snapshot& s, double saturated = 0.8);

/// The version of the JSON below, written as "stats_format". 2: busy_s and the busy shares are host
/// work only, the device wait apart (device_wait_s, "device_wait", "window_device_wait"). 1 (no
/// "stats_format"; runs before it): busy_s included device_wait_s, which snapshot_from_json
/// subtracts; that format's window and steady-state busy shares include the wait and are read as
/// written.
inline constexpr int kStatsFormat = 2;

/// JSON forms: one object per snapshot (a stats.jsonl line, or stats_summary.json; with
/// `v`, or else the snapshot's own verdict), and one per event (a stats.jsonl line).
std::string to_json(const Snapshot& s, const Verdict* v = nullptr);
std::string to_json(const Event& e);
Snapshot snapshot_from_json(const std::string& text);  // throws std::runtime_error naming the problem

/// Summary table plus verdict, as `pipeline stats` and the end of `pipeline run` print it.
void print_summary(std::ostream& os, const Snapshot& s, const Verdict& v);
/// The events, one line each ("  12.0 s  verdict: ...").
void print_timeline(std::ostream& os, const std::vector<Event>& events);

/// Reads RUN_DIR/stats_summary.json, or the last line of RUN_DIR/stats.jsonl for a running run.
Snapshot load_run_snapshot(const std::filesystem::path& run_dir);
/// Every snapshot line of RUN_DIR/stats.jsonl (the time series), for charts.
std::vector<Snapshot> load_run_series(const std::filesystem::path& run_dir);
/// Every event line of RUN_DIR/stats.jsonl.
std::vector<Event> load_run_events(const std::filesystem::path& run_dir);
/// An SVG picture of a run: the stage graph at its steady state (stages coloured by busy share,
/// edges by mean occupancy, the verdict's bottleneck outlined, with its sentence), above each
/// edge's occupancy (share of capacity, window mean) over time on a labelled time axis, with
/// the events (verdict changes, autotune decisions) marked.
std::string occupancy_svg(const std::vector<Snapshot>& series, const std::vector<Event>& events = {});

}  // namespace pipeline::graph
