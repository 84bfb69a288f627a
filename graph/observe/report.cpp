// The stats as people read them: the summary table `pipeline run` prints at the end and
// `pipeline stats` prints for a run directory, the timeline of events, and the SVG chart of
// edge occupancy over time with the events marked.
#include <algorithm>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "graph/observe/stats.h"

namespace pipeline::graph {

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

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

void print_summary(std::ostream& os, const Snapshot& s, const Verdict& v) {
  const bool steady = s.has_steady();
  char buf[512];
  os << "after " << fmt(s.t_s, 1) << " s (" << s.status << ")";
  if (steady)
    os << "; shares and rates over the steady state (" << fmt(s.steady_from_s, 1) << " s to " << fmt(s.steady_to_s, 1)
       << " s), the whole run's busy share in brackets";
  os << "\n";
  std::snprintf(buf, sizeof buf, "%-16s %-14s %4s %10s %10s %10s %10s %11s %8s %8s %6s %6s %9s\n", "stage", "type", "wrk",
                "in", "out", "items/s", "can do/s", "busy", "starved", "blocked", "order", "ready", "cpu ms/it");
  os << buf;
  for (const auto& x : s.stages) {
    const StageSpan w = steady && x.steady.seconds > 0 ? x.steady : x.whole_run();
    std::string busy = pct(w.busy);
    if (steady) busy += " [" + pct(x.busy()) + "]";
    std::snprintf(buf, sizeof buf, "%-16s %-14s %4d %10llu %10llu %10.1f %10.1f %11s %8s %8s %6s %6s %9.3g%s\n",
                  x.name.c_str(), x.type.c_str(), x.workers, static_cast<unsigned long long>(x.items_in),
                  static_cast<unsigned long long>(x.items_out), x.source ? w.out_per_s : w.in_per_s, w.capacity_per_s,
                  busy.c_str(), pct(w.starved).c_str(), pct(w.blocked).c_str(), pct(w.order_wait).c_str(),
                  pct(w.ready).c_str(), w.cpu_ms_per_item, x.name == v.stage ? "  <- bottleneck" : "");
    os << buf;
  }
  if (s.cores > 0) {
    std::snprintf(buf, sizeof buf, "cores: %d in the arena; the CPU stages kept %.2f busy, the whole process %.2f%s\n",
                  s.cores, s.cpu_cores, s.process_cores, steady ? " (steady state)" : "");
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "\n%-24s %5s %6s %5s %5s %5s %5s %6s %6s%s\n", "queue (consumer <- from)", "cap", "mean",
                "p50", "p95", "max", "hwm", "full", "empty", steady ? "  (full/empty: steady state)" : "");
  os << buf;
  for (const auto& q : s.queues) {
    std::string from;
    for (const auto& p : q.producers) from += (from.empty() ? "" : ",") + p;
    std::string name = q.consumer + " <- " + from;
    std::snprintf(buf, sizeof buf, "%-24s %5d %6.1f %5.0f %5.0f %5d %5d %6s %6s\n", name.c_str(), q.capacity, q.mean, q.p50,
                  q.p95, q.max_sampled, q.high_water, pct(steady ? q.steady_full : q.full).c_str(),
                  pct(steady ? q.steady_empty : q.empty).c_str());
    os << buf;
  }
  os << "\nbottleneck (" << v.span << "): " << v.text << "\n";
  if (!v.suggestion.empty()) os << "suggestion: " << v.suggestion << "\n";
  for (const auto& n : v.notes) os << "note: " << n << "\n";
}

void print_timeline(std::ostream& os, const std::vector<Event>& events) {
  char buf[64];
  for (const auto& e : events) {
    std::snprintf(buf, sizeof buf, "%8.1f s  ", e.t_s);
    os << buf << e.kind << ": " << e.text << "\n";
  }
}

std::string occupancy_svg(const std::vector<Snapshot>& series, const std::vector<Event>& events) {
  const int width = 900, left = 170, right = 20, row = 70, top = 40;
  size_t nq = series.empty() ? 0 : series.back().queues.size();
  int ya = top + static_cast<int>(nq) * row;
  int height = ya + 40 + 16 * static_cast<int>(std::min<size_t>(events.size(), 40));
  double tmax = series.empty() ? 1 : std::max(1e-9, series.back().t_s);
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
     << "\" font-family=\"Helvetica,Arial,sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"10\" y=\"22\" font-size=\"15\">Edge occupancy over time (mean per report, share of capacity)</text>\n";
  int plot_w = width - left - right;
  auto x_of = [&](double t) { return left + plot_w * std::clamp(t / tmax, 0.0, 1.0); };
  for (size_t qi = 0; qi < nq; ++qi) {
    const QueueStats& last = series.back().queues[qi];
    int y0 = top + static_cast<int>(qi) * row;
    int h = row - 20;
    std::string label = last.consumer + (last.producers.empty() ? "" : " <- " + last.producers.front());
    os << "<text x=\"10\" y=\"" << y0 + h / 2 + 4 << "\">" << xml_escape(label) << " (cap " << last.capacity
       << ")</text>\n";
    os << "<rect x=\"" << left << "\" y=\"" << y0 << "\" width=\"" << plot_w << "\" height=\"" << h
       << "\" fill=\"#f6f6f6\" stroke=\"#ccc\"/>\n";
    os << "<polyline fill=\"none\" stroke=\"#2a6fdb\" stroke-width=\"1.5\" points=\"";
    for (const auto& s : series) {
      if (qi >= s.queues.size() || s.queues[qi].capacity <= 0) continue;
      double frac = std::clamp(s.queues[qi].window_mean / s.queues[qi].capacity, 0.0, 1.0);
      os << fmt(x_of(s.t_s), 1) << "," << fmt(y0 + h - h * frac, 1) << " ";
    }
    os << "\"/>\n";
    os << "<text x=\"" << left - 4 << "\" y=\"" << y0 + 10 << "\" text-anchor=\"end\" fill=\"#888\">full</text>\n";
  }
  // Events: a dashed line across the plots at each one's time, numbered, and listed below.
  for (size_t i = 0; i < events.size() && i < 40; ++i) {
    const Event& e = events[i];
    const char* colour = e.kind == "autotune" ? "#d9822b" : "#c0392b";
    double x = x_of(e.t_s);
    os << "<line x1=\"" << fmt(x) << "\" y1=\"" << top << "\" x2=\"" << fmt(x) << "\" y2=\"" << ya - 12
       << "\" stroke=\"" << colour << "\" stroke-dasharray=\"3,3\"/>\n";
    os << "<text x=\"" << fmt(x + 2) << "\" y=\"" << top + 10 << "\" fill=\"" << colour << "\">" << i + 1 << "</text>\n";
    os << "<text x=\"10\" y=\"" << ya + 30 + 16 * static_cast<int>(i) << "\" fill=\"" << colour << "\">" << i + 1 << ". "
       << fmt(e.t_s, 1) << " s " << xml_escape(e.kind) << ": " << xml_escape(e.text.substr(0, 130)) << "</text>\n";
  }
  os << "<text x=\"" << left << "\" y=\"" << ya << "\" fill=\"#888\">0 s</text>\n";
  os << "<text x=\"" << width - right << "\" y=\"" << ya << "\" text-anchor=\"end\" fill=\"#888\">" << fmt(tmax, 1)
     << " s</text>\n</svg>\n";
  return os.str();
}

}  // namespace pipeline::graph
