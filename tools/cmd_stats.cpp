// `pipeline stats RUN_DIR`: the summary table and bottleneck verdict of a finished or running
// run (from its stats files), plus an occupancy-over-time chart written as SVG.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "base/atomic_file.h"
#include "graph/observe/stats.h"
#include "runner/rank_stats.h"

namespace {

int stats_main(const std::vector<std::string>& args) {
  std::string dir, svg;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--svg" && i + 1 < args.size())
      svg = args[++i];
    else if (dir.empty() && args[i].rfind("--", 0) != 0)
      dir = args[i];
    else {
      std::cerr << "pipeline stats: unexpected argument " << args[i] << "\n";
      return 2;
    }
  }
  if (dir.empty()) {
    std::cerr << "usage: pipeline stats RUN_DIR [--svg FILE]\n";
    return 2;
  }
  namespace graph = pipeline::graph;
  graph::Snapshot s = graph::load_run_snapshot(dir);
  // A data-parallel run's summary holds every rank's stages: one row per rank for the device
  // stages, and a verdict that names a straggler rank (stored with the summary; computed again
  // for a run still going).
  graph::print_summary(std::cout, pipeline::stages::rank_rows(s),
                       s.verdict.kind.empty() ? pipeline::stages::analyze_ranks(s) : s.verdict);
  auto series = graph::load_run_series(dir);
  auto events = graph::load_run_events(dir);
  if (!events.empty()) {
    std::cout << "\ntimeline (verdict changes and autotune decisions):\n";
    graph::print_timeline(std::cout, events);
  }
  if (!series.empty()) {
    if (svg.empty()) svg = (std::filesystem::path(dir) / "occupancy.svg").string();
    pipeline::write_file_atomic(svg, graph::occupancy_svg(series, events));
    std::cout << "\noccupancy chart: " << svg << " (" << series.size() << " samples, " << events.size()
              << " events marked)\n";
  }
  return 0;
}

PIPELINE_COMMAND({"stats", "summary table, bottleneck and occupancy chart of a run directory",
                  "usage: pipeline stats RUN_DIR [--svg FILE]\n"
                  "Reads RUN_DIR/stats_summary.json (finished run) or the last line of RUN_DIR/stats.jsonl\n"
                  "(running run), prints per-stage and per-queue numbers and the bottleneck verdict,\n"
                  "the timeline of verdict changes and autotune decisions, and writes the edges' occupancy\n"
                  "over time, with those events marked, to RUN_DIR/occupancy.svg (or FILE).",
                  &stats_main});

}  // namespace
