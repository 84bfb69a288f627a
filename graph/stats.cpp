// Bottleneck analysis, the summary table, the JSON form of snapshots and the occupancy chart.
//
// THE BOTTLENECK RULE. In a pipeline of bounded queues the slowest stage is the one that is
// busy all the time: everything upstream of it fills its input queue and then blocks, and
// everything downstream drains and then starves. So:
//   1. For each stage, busy share = time its workers spent neither waiting for input (starved)
//      nor waiting on a full output queue or their ordering turn (blocked), over its workers'
//      wall time. (Sleeping or waiting on a device inside process() counts as busy: that is
//      the stage's own cost.)
//   2. The bottleneck is the stage with the highest busy share, if it is at least 80%
//      (ties: the one whose input queue is full more often). Its supporting numbers are its
//      busy share and workers, how often its input queue was full, and how long the most
//      starved of its consumers waited for input.
//   3. A source bottleneck reads "limited by source X"; a stage with no consumers, "limited
//      by sink X". When no stage reaches 80%, queues that are empty most of the time mean the
//      pipeline is limited by its source(s) (work arrives slower than the stages could take
//      it); otherwise by its sink(s).
//   4. Suggestion: more workers (double them) for a stage that may have several; for an
//      own-thread or single-worker stage, a faster stage type or less work per item. A note
//      is added for any edge whose producer is often blocked while its consumer is often
//      starved (bursty): a larger queue smooths it.
#include "graph/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "graph/json.h"

namespace pipeline::graph {

const StageStats* Snapshot::stage(const std::string& name) const {
  for (const auto& s : stages)
    if (s.name == name) return &s;
  return nullptr;
}

const QueueStats* Snapshot::queue_of(const std::string& consumer) const {
  for (const auto& q : queues)
    if (q.consumer == consumer) return &q;
  return nullptr;
}

namespace {

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * x);
  return buf;
}

std::string fmt(double x, int prec = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, x);
  return buf;
}

}  // namespace

Verdict analyze(const Snapshot& s, double saturated) {
  Verdict v;
  const StageStats* best = nullptr;
  auto full_of = [&](const StageStats& st) {
    const QueueStats* q = s.queue_of(st.name);
    return q ? q->full : 0.0;
  };
  for (const auto& st : s.stages) {
    if (st.wall_s <= 0) continue;
    if (!best || st.busy() > best->busy() + 1e-9 ||
        (std::abs(st.busy() - best->busy()) <= 1e-9 && full_of(st) > full_of(*best)))
      best = &st;
  }
  // Edges that alternate between blocked producers and starved consumers want more slack.
  for (const auto& q : s.queues) {
    const StageStats* c = s.stage(q.consumer);
    for (const auto& pn : q.producers) {
      const StageStats* p = s.stage(pn);
      if (p && c && p->blocked() > 0.2 && c->starved() > 0.2)
        v.notes.push_back("edge " + pn + " -> " + q.consumer + " is bursty: " + pn + " blocked " + pct(p->blocked()) +
                          " while " + q.consumer + " starved " + pct(c->starved()) + "; try a larger queue (capacity = " +
                          std::to_string(q.capacity * 2) + ")");
    }
  }
  if (!best) {
    v.kind = "none";
    v.text = "no data yet";
    return v;
  }
  if (best->busy() < saturated) {
    double empty = 0, full = 0;
    for (const auto& q : s.queues) empty += q.empty, full += q.full;
    size_t n = std::max<size_t>(1, s.queues.size());
    v.kind = "none";
    std::string busiest = "busiest stage " + best->name + " at " + pct(best->busy());
    if (empty / n >= full / n) {
      v.kind = "source";
      v.text = "no stage is saturated (" + busiest + "); queues are empty " + pct(empty / n) +
               " of the time on average: the pipeline is limited by its source(s)";
      v.suggestion = "feed it faster: a faster source or more source workers; the stages have spare capacity";
    } else {
      v.kind = "sink";
      v.text = "no stage is saturated (" + busiest + "); queues are full " + pct(full / n) +
               " of the time on average: the pipeline is limited by its sink(s)";
      v.suggestion = "speed up the final stage(s)";
    }
    return v;
  }
  v.stage = best->name;
  v.kind = best->source ? "source" : best->sink ? "sink" : "stage";
  std::string text = best->name + ": busy " + pct(best->busy()) + " with " + std::to_string(best->workers) +
                     (best->workers == 1 ? " worker" : " workers");
  if (const QueueStats* q = s.queue_of(best->name))
    text += "; its input queue full " + pct(q->full) + " of the time";
  const StageStats* hungriest = nullptr;
  for (const auto& q : s.queues) {
    if (std::find(q.producers.begin(), q.producers.end(), best->name) == q.producers.end()) continue;
    const StageStats* c = s.stage(q.consumer);
    if (c && (!hungriest || c->starved() > hungriest->starved())) hungriest = c;
  }
  if (hungriest) text += "; " + hungriest->name + " waited for input " + pct(hungriest->starved()) + " of the time";
  if (v.kind == "source") text = "limited by source " + text;
  if (v.kind == "sink") text = "limited by sink " + text;
  v.text = text;
  if (best->own_thread)
    v.suggestion = "it owns a thread, so more workers are not an option: try a faster " + best->name +
                   " stage type or less work per item";
  else
    v.suggestion = "try more " + best->name + " workers (workers = " + std::to_string(best->workers * 2) +
                   ") or a faster stage type";
  return v;
}

std::string to_json(const Snapshot& s, const Verdict* v) {
  std::ostringstream os;
  os << std::setprecision(6);
  os << "{\"t\":" << s.t_s << ",\"finished\":" << (s.finished ? "true" : "false") << ",\"status\":" << json_quote(s.status)
     << ",\"stages\":[";
  for (size_t i = 0; i < s.stages.size(); ++i) {
    const auto& x = s.stages[i];
    os << (i ? "," : "") << "{\"name\":" << json_quote(x.name) << ",\"type\":" << json_quote(x.type)
       << ",\"workers\":" << x.workers << ",\"source\":" << (x.source ? "true" : "false")
       << ",\"sink\":" << (x.sink ? "true" : "false") << ",\"own_thread\":" << (x.own_thread ? "true" : "false")
       << ",\"items_in\":" << x.items_in << ",\"items_out\":" << x.items_out << ",\"discarded\":" << x.discarded
       << ",\"busy_s\":" << x.busy_s << ",\"starved_s\":" << x.starved_s << ",\"blocked_s\":" << x.blocked_s
       << ",\"wall_s\":" << x.wall_s << ",\"device_wait_s\":" << x.device_wait_s
       << ",\"device_busy_s\":" << x.device_busy_s << ",\"window_items_per_s\":" << x.window_items_per_s
       << ",\"window_busy\":" << x.window_busy << ",\"busy\":" << x.busy() << ",\"items_per_s\":" << x.items_per_s();
    if (x.rank >= 0) os << ",\"rank\":" << x.rank;
    os << "}";
  }
  os << "],\"queues\":[";
  for (size_t i = 0; i < s.queues.size(); ++i) {
    const auto& q = s.queues[i];
    os << (i ? "," : "") << "{\"consumer\":" << json_quote(q.consumer) << ",\"producers\":[";
    for (size_t j = 0; j < q.producers.size(); ++j) os << (j ? "," : "") << json_quote(q.producers[j]);
    os << "],\"capacity\":" << q.capacity << ",\"current\":" << q.current << ",\"high_water\":" << q.high_water
       << ",\"samples\":" << q.samples << ",\"mean\":" << q.mean << ",\"p50\":" << q.p50 << ",\"p95\":" << q.p95
       << ",\"max\":" << q.max_sampled << ",\"full\":" << q.full << ",\"empty\":" << q.empty
       << ",\"window_mean\":" << q.window_mean << "}";
  }
  os << "]";
  if (v) {
    os << ",\"verdict\":{\"stage\":" << json_quote(v->stage) << ",\"kind\":" << json_quote(v->kind)
       << ",\"text\":" << json_quote(v->text) << ",\"suggestion\":" << json_quote(v->suggestion) << ",\"notes\":[";
    for (size_t j = 0; j < v->notes.size(); ++j) os << (j ? "," : "") << json_quote(v->notes[j]);
    os << "]}";
  }
  os << "}";
  return os.str();
}

Snapshot snapshot_from_json(const std::string& text) {
  JsonValue root;
  try {
    root = json_parse(text);
  } catch (const JsonParseError& e) {
    throw std::runtime_error(std::string("stats JSON: ") + e.what());
  }
  if (root.type != JsonValue::Type::object) throw std::runtime_error("stats JSON: expected an object");
  Snapshot s;
  s.t_s = root.number("t");
  s.finished = root.flag("finished");
  s.status = root.string("status");
  for (const auto& x : root.array("stages")) {
    StageStats st;
    st.name = x.string("name");
    st.type = x.string("type");
    st.workers = static_cast<int>(x.number("workers", 1));
    st.source = x.flag("source");
    st.sink = x.flag("sink");
    st.own_thread = x.flag("own_thread");
    st.items_in = static_cast<uint64_t>(x.number("items_in"));
    st.items_out = static_cast<uint64_t>(x.number("items_out"));
    st.discarded = static_cast<uint64_t>(x.number("discarded"));
    st.busy_s = x.number("busy_s");
    st.starved_s = x.number("starved_s");
    st.blocked_s = x.number("blocked_s");
    st.wall_s = x.number("wall_s");
    st.device_wait_s = x.number("device_wait_s");
    st.device_busy_s = x.number("device_busy_s");
    st.window_items_per_s = x.number("window_items_per_s");
    st.window_busy = x.number("window_busy");
    st.rank = static_cast<int>(x.number("rank", -1));
    s.stages.push_back(std::move(st));
  }
  for (const auto& x : root.array("queues")) {
    QueueStats q;
    q.consumer = x.string("consumer");
    for (const auto& p : x.array("producers")) q.producers.push_back(p.text);
    q.capacity = static_cast<int>(x.number("capacity"));
    q.current = static_cast<int>(x.number("current"));
    q.high_water = static_cast<int>(x.number("high_water"));
    q.samples = static_cast<uint64_t>(x.number("samples"));
    q.mean = x.number("mean");
    q.p50 = x.number("p50");
    q.p95 = x.number("p95");
    q.max_sampled = static_cast<int>(x.number("max"));
    q.full = x.number("full");
    q.empty = x.number("empty");
    q.window_mean = x.number("window_mean");
    s.queues.push_back(std::move(q));
  }
  return s;
}

void print_summary(std::ostream& os, const Snapshot& s, const Verdict& v) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-16s %-16s %4s %10s %10s %10s %6s %8s %8s\n", "stage", "type", "wrk", "in", "out",
                "items/s", "busy", "starved", "blocked");
  os << "after " << fmt(s.t_s, 1) << " s (" << s.status << ")\n" << buf;
  for (const auto& x : s.stages) {
    std::snprintf(buf, sizeof buf, "%-16s %-16s %4d %10llu %10llu %10.1f %6s %8s %8s%s\n", x.name.c_str(), x.type.c_str(),
                  x.workers, static_cast<unsigned long long>(x.items_in), static_cast<unsigned long long>(x.items_out),
                  x.items_per_s(), pct(x.busy()).c_str(), pct(x.starved()).c_str(), pct(x.blocked()).c_str(),
                  x.name == v.stage ? "  <- bottleneck" : "");
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "\n%-24s %5s %6s %5s %5s %5s %5s %6s %6s\n", "queue (consumer <- from)", "cap", "mean",
                "p50", "p95", "max", "hwm", "full", "empty");
  os << buf;
  for (const auto& q : s.queues) {
    std::string from;
    for (const auto& p : q.producers) from += (from.empty() ? "" : ",") + p;
    std::string name = q.consumer + " <- " + from;
    std::snprintf(buf, sizeof buf, "%-24s %5d %6.1f %5.0f %5.0f %5d %5d %6s %6s\n", name.c_str(), q.capacity, q.mean, q.p50,
                  q.p95, q.max_sampled, q.high_water, pct(q.full).c_str(), pct(q.empty).c_str());
    os << buf;
  }
  os << "\nbottleneck: " << v.text << "\n";
  if (!v.suggestion.empty()) os << "suggestion: " << v.suggestion << "\n";
  for (const auto& n : v.notes) os << "note: " << n << "\n";
}

namespace {
std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

Snapshot load_run_snapshot(const std::filesystem::path& run_dir) {
  auto summary = run_dir / "stats_summary.json";
  if (std::filesystem::exists(summary)) {
    try {
      return snapshot_from_json(read_file(summary));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(summary.string() + ": " + e.what());
    }
  }
  auto series = load_run_series(run_dir);
  if (series.empty())
    throw std::runtime_error(run_dir.string() + ": no stats yet (expected stats_summary.json or lines in stats.jsonl)");
  return series.back();
}

std::vector<Snapshot> load_run_series(const std::filesystem::path& run_dir) {
  auto path = run_dir / "stats.jsonl";
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot open (is this a run directory?)");
  std::vector<Snapshot> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      out.push_back(snapshot_from_json(line));
    } catch (const std::runtime_error& e) {
      if (in.peek() == EOF) break;  // a running run may be writing its last line
      throw std::runtime_error(path.string() + ":" + std::to_string(n) + ": " + e.what());
    }
  }
  return out;
}

std::string occupancy_svg(const std::vector<Snapshot>& series) {
  const int width = 900, left = 170, right = 20, row = 70, top = 40;
  size_t nq = series.empty() ? 0 : series.back().queues.size();
  int height = top + static_cast<int>(nq) * row + 40;
  double tmax = series.empty() ? 1 : std::max(1e-9, series.back().t_s);
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
     << "\" font-family=\"Helvetica,Arial,sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"10\" y=\"22\" font-size=\"15\">Queue occupancy over time (mean per report, share of capacity)</text>\n";
  int plot_w = width - left - right;
  for (size_t qi = 0; qi < nq; ++qi) {
    const QueueStats& last = series.back().queues[qi];
    int y0 = top + static_cast<int>(qi) * row;
    int h = row - 20;
    os << "<text x=\"10\" y=\"" << y0 + h / 2 + 4 << "\">" << last.consumer << " (cap " << last.capacity << ")</text>\n";
    os << "<rect x=\"" << left << "\" y=\"" << y0 << "\" width=\"" << plot_w << "\" height=\"" << h
       << "\" fill=\"#f6f6f6\" stroke=\"#ccc\"/>\n";
    os << "<polyline fill=\"none\" stroke=\"#2a6fdb\" stroke-width=\"1.5\" points=\"";
    for (const auto& s : series) {
      if (qi >= s.queues.size() || s.queues[qi].capacity <= 0) continue;
      double frac = std::clamp(s.queues[qi].window_mean / s.queues[qi].capacity, 0.0, 1.0);
      os << fmt(left + plot_w * s.t_s / tmax, 1) << "," << fmt(y0 + h - h * frac, 1) << " ";
    }
    os << "\"/>\n";
    os << "<text x=\"" << left - 4 << "\" y=\"" << y0 + 10 << "\" text-anchor=\"end\" fill=\"#888\">full</text>\n";
  }
  int ya = top + static_cast<int>(nq) * row;
  os << "<text x=\"" << left << "\" y=\"" << ya << "\" fill=\"#888\">0 s</text>\n";
  os << "<text x=\"" << width - right << "\" y=\"" << ya << "\" text-anchor=\"end\" fill=\"#888\">" << fmt(tmax, 1)
     << " s</text>\n</svg>\n";
  return os.str();
}

}  // namespace pipeline::graph
