// Run statistics: per-stage counters and per-queue occupancy, the bottleneck verdict computed
// from them, and their JSON form (stats.jsonl lines, stats_summary.json) so `pipeline stats`
// can re-read a finished or running run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

namespace pipeline::graph {

struct StageStats {
  std::string name, type;
  int workers = 1;
  bool source = false, sink = false, own_thread = false;
  uint64_t items_in = 0, items_out = 0, discarded = 0;
  double busy_s = 0, starved_s = 0, blocked_s = 0;  // summed over workers
  double wall_s = 0;                                // seconds the stage's workers have existed (per worker)
  double device_wait_s = 0;  // part of busy_s spent waiting on the device (Emitter::add_device_wait)
  double device_busy_s = 0;  // GPU time spent for this stage (Emitter::add_device_busy)
  // Over the last report window (live view): rate and busy share.
  double window_items_per_s = 0, window_busy = 0;
  int rank = -1;  // data parallel: the rank whose stage this is (-1: a single process)

  /// Shares of worker time, in [0, 1].
  double busy() const { return wall_s > 0 ? busy_s / (wall_s * workers) : 0; }
  double starved() const { return wall_s > 0 ? starved_s / (wall_s * workers) : 0; }
  double blocked() const { return wall_s > 0 ? blocked_s / (wall_s * workers) : 0; }
  /// Items per second through the stage: outputs for sources, inputs otherwise.
  double items_per_s() const { return wall_s > 0 ? static_cast<double>(source ? items_out : items_in) / wall_s : 0; }
};

/// A stage's input queue (one per consuming stage; every producer feeding it pushes there).
struct QueueStats {
  std::string consumer;                // the stage that pops from it
  std::vector<std::string> producers;  // the stages that push into it
  int capacity = 0;
  int current = 0;     // occupancy at the snapshot
  int high_water = 0;  // exact maximum ever held (counted at every push)
  uint64_t samples = 0;
  double mean = 0, p50 = 0, p95 = 0;
  int max_sampled = 0;
  double full = 0, empty = 0;  // share of samples at capacity / at zero
  double window_mean = 0;      // mean over the last report window
};

struct Snapshot {
  double t_s = 0;          // seconds since run() started
  bool finished = false;   // the final snapshot
  std::string status;      // "running", "done", "stopped", "failed: ..."
  std::vector<StageStats> stages;  // in graph (topological) order
  std::vector<QueueStats> queues;

  const StageStats* stage(const std::string& name) const;
  const QueueStats* queue_of(const std::string& consumer) const;
};

/// Which stage limits throughput, with the numbers that say so and what to try.
struct Verdict {
  std::string stage;       // "" when no single stage is named
  std::string kind;        // "stage", "source", "sink" or "none"
  std::string text;        // "tokenize: busy 99% with 4 workers; its input queue full 97% ..."
  std::string suggestion;  // "try more tokenize workers (workers = 8)"
  std::vector<std::string> notes;  // secondary observations (a bursty edge that wants a larger queue)
};

/// The bottleneck rule (documented in stats.cpp): the stage whose workers are busy the largest
/// share of their time, if that share is at least `saturated` (0.8), is the bottleneck; the
/// supporting numbers are its input queue's full share and how long its consumers starved.
/// A source or sink bottleneck is reported as "limited by source/sink". When no stage is
/// saturated, queues mostly empty mean source-limited and mostly full mean sink-limited.
Verdict analyze(const Snapshot& s, double saturated = 0.8);

/// JSON forms: one object per snapshot (a stats.jsonl line, or stats_summary.json).
std::string to_json(const Snapshot& s, const Verdict* v = nullptr);
Snapshot snapshot_from_json(const std::string& text);  // throws std::runtime_error naming the problem

/// Summary table plus verdict, as `pipeline stats` and the end of `pipeline run` print it.
void print_summary(std::ostream& os, const Snapshot& s, const Verdict& v);

/// Reads RUN_DIR/stats_summary.json, or the last line of RUN_DIR/stats.jsonl for a running run.
Snapshot load_run_snapshot(const std::filesystem::path& run_dir);
/// Every line of RUN_DIR/stats.jsonl (the time series), for charts.
std::vector<Snapshot> load_run_series(const std::filesystem::path& run_dir);
/// An SVG chart of each queue's occupancy (share of capacity, window mean) over time.
std::string occupancy_svg(const std::vector<Snapshot>& series);

}  // namespace pipeline::graph
