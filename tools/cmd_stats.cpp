// `pipeline stats RUN_DIR`: the summary table and bottleneck verdict of a finished or running
// run (from its stats files), its evaluations, the hashes of its steps' rows and what the spike
// guard did (metrics.jsonl), plus a chart written as SVG (the graph at its steady state above each
// edge's occupancy over time) and, with --html, the live page standing alone for the run.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "base/atomic_file.h"
#include "base/json.h"
#include "graph/observe/live_page.h"
#include "graph/observe/stats.h"
#include "runner/rank_stats.h"

namespace {

// At most `most` reports, evenly spread, the last one kept: a day-long run still makes a page a
// browser opens at once.
std::vector<pipeline::graph::Snapshot> thin(const std::vector<pipeline::graph::Snapshot>& series, size_t most) {
  if (series.size() <= most) return series;
  std::vector<pipeline::graph::Snapshot> out;
  const double stride = static_cast<double>(series.size() - 1) / static_cast<double>(most - 1);
  for (size_t i = 0; i + 1 < most; ++i) out.push_back(series[static_cast<size_t>(static_cast<double>(i) * stride)]);
  out.push_back(series.back());
  return out;
}

// Each record of the run's metrics.jsonl whose text holds one of `marks`, parsed, in order; a
// line cut short by a crash is passed over (the others still count).
template <typename Fn>
void each_record(const std::filesystem::path& dir, std::initializer_list<const char*> marks, Fn&& fn) {
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (std::none_of(marks.begin(), marks.end(), [&](const char* m) { return line.find(m) != std::string::npos; }))
      continue;
    pipeline::JsonValue v;
    try {
      v = pipeline::json_parse(line);
    } catch (const pipeline::JsonParseError&) {
      continue;
    }
    fn(v);
  }
}

// The run's evaluations from its metrics.jsonl (the validation loss, HellaSwag's accuracy), the
// last `most` of them, one line each; nothing when it has none.
void print_evaluations(std::ostream& os, const std::filesystem::path& dir, size_t most = 20) {
  std::vector<std::string> rows;
  char buf[256];
  each_record(dir, {"\"val_loss\"", "\"hellaswag_acc_norm\""}, [&](const pipeline::JsonValue& v) {
    int n = std::snprintf(buf, sizeof buf, "  step %8.0f", v.number("step"));
    if (v.find("val_loss")) n += std::snprintf(buf + n, sizeof buf - n, "  val loss %.4f", v.number("val_loss"));
    if (v.find("hellaswag_acc_norm"))
      std::snprintf(buf + n, sizeof buf - n, "  hellaswag acc_norm %.4f acc %.4f (%.0f items)", v.number("hellaswag_acc_norm"),
                    v.number("hellaswag_acc"), v.number("hellaswag_items"));
    rows.emplace_back(buf);
  });
  if (rows.empty()) return;
  os << "\nevaluations (metrics.jsonl"
     << (rows.size() > most ? ", the last " + std::to_string(most) + " of " + std::to_string(rows.size()) : "") << "):\n";
  for (size_t i = rows.size() > most ? rows.size() - most : 0; i < rows.size(); ++i) os << rows[i] << "\n";
}

// The hashes of the steps' rows ("windows" in metrics.jsonl, docs/data_order.md): how many steps
// have one, and the first and the last, so that two runs of one data order can be told apart or
// alike at a glance; nothing for a run written before them.
void print_windows(std::ostream& os, const std::filesystem::path& dir) {
  std::string first, last;
  size_t steps = 0;
  each_record(dir, {"\"windows\""}, [&](const pipeline::JsonValue& v) {
    const auto* w = v.find("windows");
    if (!w) return;
    last = "step " + std::to_string(static_cast<long long>(v.number("step"))) + " " + w->text;
    if (first.empty()) first = last;
    ++steps;
  });
  if (steps == 0) return;
  os << "\ndata: the rows of " << steps << " steps hashed (\"windows\" in metrics.jsonl): " << first
     << (steps > 1 ? ", ..., " + last : "") << "\n";
}

// What the spike guard did ([training.guard]), from metrics.jsonl: the steps it skipped, its
// rollbacks and a stop; nothing when it did nothing.
void print_guard(std::ostream& os, const std::filesystem::path& dir, size_t most = 40) {
  std::vector<long long> skipped;
  std::vector<std::string> events;
  char buf[256];
  each_record(dir, {"\"skipped\":1", "\"event\":\"guard_"}, [&](const pipeline::JsonValue& v) {
    if (v.find("skipped") && v.number("skipped") == 1) skipped.push_back(static_cast<long long>(v.number("step")));
    if (v.string("event") == "guard_rollback") {
      std::snprintf(buf, sizeof buf, "  step %8.0f  rollback %.0f: back to step %.0f after steps %s were skipped; data steps %s skipped",
                    v.number("step"), v.number("guard_rollbacks"), v.number("to_step"), v.string("streak").c_str(),
                    v.string("skipped_steps").c_str());
      events.emplace_back(buf);
    } else if (v.string("event") == "guard_stop") {
      std::snprintf(buf, sizeof buf, "  step %8.0f  the guard stopped the run (after %.0f rollbacks; run.log says why)",
                    v.number("step"), v.number("guard_rollbacks"));
      events.emplace_back(buf);
    }
  });
  if (skipped.empty() && events.empty()) return;
  os << "\nspike guard (metrics.jsonl): " << skipped.size() << " step" << (skipped.size() == 1 ? "" : "s") << " skipped";
  if (!skipped.empty()) {
    os << " (";
    for (size_t i = skipped.size() > most ? skipped.size() - most : 0, n = 0; i < skipped.size(); ++i, ++n)
      os << (n ? ", " : skipped.size() > most ? "... " : "") << skipped[i];
    os << ")";
  }
  os << "\n";
  for (const auto& e : events) os << e << "\n";
}

// "gpt2-20261122-120000" for "runs/gpt2-20261122-120000/".
std::string run_name(const std::string& dir) {
  auto p = std::filesystem::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

int stats_main(const std::vector<std::string>& args) {
  std::string dir, svg, html;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--svg" && i + 1 < args.size())
      svg = args[++i];
    else if (args[i] == "--html" && i + 1 < args.size())
      html = args[++i];
    else if (dir.empty() && args[i].rfind("--", 0) != 0)
      dir = args[i];
    else {
      std::cerr << "pipeline stats: unexpected argument " << args[i] << "\n";
      return 2;
    }
  }
  if (dir.empty()) {
    std::cerr << "usage: pipeline stats RUN_DIR [--svg FILE] [--html FILE]\n";
    return 2;
  }
  namespace graph = pipeline::graph;
  graph::Snapshot s = graph::load_run_snapshot(dir);
  // A data-parallel run's summary holds every rank's stages: one row per rank for the device
  // stages, and a verdict that names a straggler rank (stored with the summary; computed again
  // for a run still going).
  graph::print_summary(std::cout, pipeline::stages::rank_rows(s),
                       s.verdict.kind.empty() ? pipeline::stages::analyze_ranks(s) : s.verdict);
  print_evaluations(std::cout, dir);
  print_windows(std::cout, dir);
  print_guard(std::cout, dir);
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
  if (!html.empty()) {
    if (series.empty()) {
      std::cerr << "pipeline stats: " << dir << ": no reports in stats.jsonl to draw\n";
      return 1;
    }
    // A data-parallel run's summary holds every rank's rows: it stands in for the last report.
    if (s.finished && series.back().finished) series.back() = s;
    pipeline::write_file_atomic(html, graph::run_page_html(thin(series, 2000), events,
                                                           run_name(dir)));
    std::cout << "page: " << html << " (open it in a browser; the slider picks the time)\n";
  }
  return 0;
}

PIPELINE_COMMAND({"stats", "summary table, bottleneck and occupancy chart of a run directory",
                  "usage: pipeline stats RUN_DIR [--svg FILE] [--html FILE]\n"
                  "Reads RUN_DIR/stats_summary.json (finished run) or the last line of RUN_DIR/stats.jsonl\n"
                  "(running run), prints per-stage and per-queue numbers and the bottleneck verdict,\n"
                  "the evaluations of RUN_DIR/metrics.jsonl (validation loss, HellaSwag accuracy) and what the\n"
                  "spike guard skipped and rolled back,\n"
                  "the timeline of verdict changes and autotune decisions, and writes the edges' occupancy\n"
                  "over time, with those events marked, to RUN_DIR/occupancy.svg (or FILE).\n"
                  "--html FILE writes the page `pipeline run --serve` shows live, standing alone, for this run:\n"
                  "the stage graph, edges, bottleneck, training figures and timeline, with a time slider.",
                  &stats_main});

}  // namespace
