// The stats as people read them: the summary table `pipeline run` prints at the end and
// `pipeline stats` prints for a run directory, the timeline of events, and the SVG chart: the
// stage graph at its steady state above each edge's occupancy over time, with the events marked.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "graph/observe/percent.h"
#include "graph/observe/stats.h"

namespace pipeline::graph {

namespace {

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
  std::snprintf(buf, sizeof buf, "%-16s %-14s %4s %10s %10s %10s %10s %11s %8s %8s %8s %6s %6s %9s\n", "stage", "type",
                "wrk", "in", "out", "items/s", "can do/s", "busy", "dev wait", "starved", "blocked", "order", "ready",
                "cpu ms/it");
  os << buf;
  for (const auto& x : s.stages) {
    const StageSpan w = steady && x.steady.seconds > 0 ? x.steady : x.whole_run();
    std::string busy = pct(w.busy);
    if (steady) busy += " [" + pct(x.busy()) + "]";
    // Host work and the time asleep on the device are apart; "-" for a stage that never slept on it.
    const std::string wait = x.device_wait_s > 0 ? pct(w.device_wait) : "-";
    std::snprintf(buf, sizeof buf, "%-16s %-14s %4d %10llu %10llu %10.1f %10.1f %11s %8s %8s %8s %6s %6s %9.3g%s\n",
                  x.name.c_str(), x.type.c_str(), x.workers, static_cast<unsigned long long>(x.items_in),
                  static_cast<unsigned long long>(x.items_out), x.source ? w.out_per_s : w.in_per_s, w.capacity_per_s,
                  busy.c_str(), wait.c_str(), pct(w.starved).c_str(), pct(w.blocked).c_str(),
                  pct(w.order_wait).c_str(), pct(w.ready).c_str(), w.cpu_ms_per_item,
                  x.name == v.stage ? "  <- bottleneck" : "");
    os << buf;
  }
  for (const auto& x : s.stages)
    if (x.side && !x.figures.empty()) os << x.name << " (beside the graph): " << figures_text(x) << "\n";
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

namespace {

// Busy share as a colour: blue (idle) through orange to red (saturated), as the live page draws it.
std::string heat(double x, bool edge) {
  x = std::clamp(x, 0.0, 1.0);
  // HSL to RGB, the page's hues: stages hsl(210(1-b)^2, 70%, 88-26b%), edges hsl(210-210o, 25+55o%, 50%).
  const double h = edge ? 210 - 210 * x : 210 * (1 - x) * (1 - x);
  const double sat = edge ? 0.25 + 0.55 * x : 0.7, light = edge ? 0.5 : 0.88 - 0.26 * x;
  const double c = (1 - std::abs(2 * light - 1)) * sat, hp = h / 60, xx = c * (1 - std::abs(std::fmod(hp, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  if (hp < 1) r = c, g = xx;
  else if (hp < 2) r = xx, g = c;
  else if (hp < 3) g = c, b = xx;
  else if (hp < 4) g = xx, b = c;
  else r = xx, b = c;
  const double m = light - c / 2;
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(std::lround((r + m) * 255)),
                static_cast<int>(std::lround((g + m) * 255)), static_cast<int>(std::lround((b + m) * 255)));
  return buf;
}

// A round step for about `n` ticks over `span`: 1, 2 or 5 times a power of ten.
double tick_step(double span, int n) {
  const double raw = span / n, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// Lines of at most `width` characters, broken at spaces.
std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> out;
  std::string line;
  std::istringstream words(text);
  std::string w;
  while (words >> w) {
    if (!line.empty() && line.size() + 1 + w.size() > width) out.push_back(std::move(line)), line.clear();
    line += (line.empty() ? "" : " ") + w;
  }
  if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace

std::string occupancy_svg(const std::vector<Snapshot>& series, const std::vector<Event>& events) {
  const int width = 1000, left = 190, right = 24;
  const int plot_w = width - left - right;
  std::ostringstream os;
  if (series.empty()) {
    os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"400\" height=\"40\"><text x=\"10\" y=\"24\">no reports</text></svg>\n";
    return os.str();
  }
  // The graph at its steady state: the last report that has one (the final report's window ends
  // where the drain began), else the last report over the whole run.
  const Snapshot* at = &series.back();
  for (auto it = series.rbegin(); it != series.rend(); ++it)
    if (it->has_steady()) {
      at = &*it;
      break;
    }
  const Verdict& verdict = !series.back().verdict.kind.empty() ? series.back().verdict : at->verdict;
  const bool steady = at->has_steady();

  // Columns by depth from the sources, rows in graph order (as `pipeline graph` and the page).
  const int box_w = 150, box_h = 62, gap_x = 60, gap_y = 18, top = 58;
  std::vector<const StageStats*> stages;
  for (const auto& st : at->stages)
    if (st.rank <= 0) stages.push_back(&st);
  std::vector<int> depth(stages.size(), 0), row(stages.size(), 0), per_col;
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < stages.size(); ++i)
      if (stages[i]->name == name) return static_cast<int>(i);
    return -1;
  };
  for (size_t i = 0; i < stages.size(); ++i) {
    for (const auto& q : at->queues)
      if (q.consumer == stages[i]->name)
        for (const auto& p : q.producers)
          if (int k = index_of(p); k >= 0 && static_cast<size_t>(k) < i) depth[i] = std::max(depth[i], depth[static_cast<size_t>(k)] + 1);
    if (per_col.size() <= static_cast<size_t>(depth[i])) per_col.resize(static_cast<size_t>(depth[i]) + 1, 0);
    row[i] = per_col[static_cast<size_t>(depth[i])]++;
  }
  const int cols = static_cast<int>(per_col.size());
  const int rows = per_col.empty() ? 1 : *std::max_element(per_col.begin(), per_col.end());
  // Wider graphs than the page are scaled down to fit.
  const double graph_w = cols * box_w + (cols - 1) * gap_x;
  const double scale = std::min(1.0, (width - 20.0) / std::max(1.0, graph_w));
  auto bx = [&](size_t i) { return 10 + scale * depth[i] * (box_w + gap_x); };
  auto by = [&](size_t i) { return top + scale * row[i] * (box_h + gap_y); };
  const int graph_h = static_cast<int>(scale * (rows * box_h + (rows - 1) * gap_y));
  const auto verdict_lines = wrap(verdict.text + (verdict.suggestion.empty() ? "" : " | suggestion: " + verdict.suggestion), 150);
  const int verdict_y = top + graph_h + 26;
  const int series_top = verdict_y + 16 * static_cast<int>(verdict_lines.size()) + 44;
  const size_t nq = series.back().queues.size();
  const int row_h = 56;
  const int axis_y = series_top + static_cast<int>(nq) * row_h;
  const int height = axis_y + 52 + 16 * static_cast<int>(std::min<size_t>(events.size(), 40));
  const double tmax = std::max(1e-9, series.back().t_s);

  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
     << "\" font-family=\"Helvetica,Arial,sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">The stage graph "
     << (steady ? "at its steady state (" + fmt(at->steady_from_s, 1) + " s to " + fmt(at->steady_to_s, 1) + " s)"
                : std::string("over the whole run"))
     << "</text>\n<text x=\"10\" y=\"40\" fill=\"#555\">stages coloured by busy share (host work; blue idle, red "
        "saturated), edges by mean occupancy; the bottleneck outlined in red</text>\n";
  for (const auto& q : at->queues) {
    int c = index_of(q.consumer), p = q.producers.empty() ? -1 : index_of(q.producers.front());
    if (c < 0 || p < 0) continue;
    const double occ = q.capacity > 0 ? (steady ? q.steady_mean : q.mean) / q.capacity : 0;
    const double x1 = bx(static_cast<size_t>(p)) + scale * box_w, y1 = by(static_cast<size_t>(p)) + scale * box_h / 2;
    const double x2 = bx(static_cast<size_t>(c)), y2 = by(static_cast<size_t>(c)) + scale * box_h / 2, mx = (x1 + x2) / 2;
    os << "<path d=\"M" << fmt(x1) << "," << fmt(y1) << " C" << fmt(mx) << "," << fmt(y1) << " " << fmt(mx) << "," << fmt(y2)
       << " " << fmt(x2) << "," << fmt(y2) << "\" fill=\"none\" stroke=\"" << heat(occ, true) << "\" stroke-width=\""
       << fmt(2 + 6 * std::clamp(occ, 0.0, 1.0)) << "\"><title>" << xml_escape(q.producers.front() + " -> " + q.consumer)
       << "</title></path>\n";
    os << "<text x=\"" << fmt(mx) << "\" y=\"" << fmt((y1 + y2) / 2 - 6) << "\" text-anchor=\"middle\" font-size=\"11\">"
       << fmt(steady ? q.steady_mean : q.mean, 1) << "/" << q.capacity << "</text>\n";
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageStats& st = *stages[i];
    const StageSpan w = steady && st.steady.seconds > 0 ? st.steady : st.whole_run();
    const bool limit = st.name == verdict.stage;
    os << "<g transform=\"translate(" << fmt(bx(i)) << "," << fmt(by(i)) << ") scale(" << fmt(scale, 3) << ")\">"
       << "<rect width=\"" << box_w << "\" height=\"" << box_h << "\" rx=\"5\" fill=\"" << heat(w.busy, false)
       << "\" stroke=\"" << (limit ? "#d1242f" : "#8c959f") << "\" stroke-width=\"" << (limit ? 4 : 1) << "\"/>"
       << "<text x=\"7\" y=\"16\" font-weight=\"bold\">" << xml_escape(st.name) << "</text>"
       << "<text x=\"" << box_w - 7 << "\" y=\"16\" text-anchor=\"end\" font-size=\"10\" fill=\"#333\">" << xml_escape(st.type)
       << "</text><text x=\"7\" y=\"36\" font-size=\"15\" font-weight=\"bold\">" << pct(w.busy) << "</text>"
       << "<text x=\"50\" y=\"35\" font-size=\"10\">busy, " << st.workers << (st.workers == 1 ? " worker" : " workers")
       << "</text><text x=\"7\" y=\"54\" font-size=\"10\">" << fmt(st.source ? w.out_per_s : w.in_per_s, 1)
       << " items/s, "
       << (shows_device_wait(w.device_wait) ? "device wait " + pct(w.device_wait) : "starved " + pct(w.starved))
       << "</text></g>\n";
  }
  for (size_t i = 0; i < verdict_lines.size(); ++i)
    os << "<text x=\"10\" y=\"" << verdict_y + 16 * static_cast<int>(i) << "\" fill=\"#a40e26\">"
       << (i == 0 ? "bottleneck: " : "") << xml_escape(verdict_lines[i]) << "</text>\n";

  // Each edge's occupancy over time.
  os << "<text x=\"10\" y=\"" << series_top - 18 << "\" font-size=\"15\" font-weight=\"bold\">Edge occupancy over time "
     << "(mean over each report, share of capacity)</text>\n";
  auto x_of = [&](double t) { return left + plot_w * std::clamp(t / tmax, 0.0, 1.0); };
  for (size_t qi = 0; qi < nq; ++qi) {
    const QueueStats& last = series.back().queues[qi];
    const int y0 = series_top + static_cast<int>(qi) * row_h, h = row_h - 14;
    std::string label = (last.producers.empty() ? "" : last.producers.front() + " -> ") + last.consumer;
    os << "<text x=\"10\" y=\"" << y0 + h / 2 + 4 << "\">" << xml_escape(label) << " (cap " << last.capacity << ")</text>\n";
    os << "<rect x=\"" << left << "\" y=\"" << y0 << "\" width=\"" << plot_w << "\" height=\"" << h
       << "\" fill=\"#f6f6f6\" stroke=\"#ccc\"/>\n";
    os << "<polyline fill=\"none\" stroke=\"#2a6fdb\" stroke-width=\"1.5\" points=\"";
    for (const auto& s : series) {
      if (qi >= s.queues.size() || s.queues[qi].capacity <= 0) continue;
      double frac = std::clamp(s.queues[qi].window_mean / s.queues[qi].capacity, 0.0, 1.0);
      os << fmt(x_of(s.t_s), 1) << "," << fmt(y0 + h - h * frac, 1) << " ";
    }
    os << "\"/>\n";
    os << "<text x=\"" << left - 4 << "\" y=\"" << y0 + 9 << "\" text-anchor=\"end\" font-size=\"10\" fill=\"#888\">full</text>"
       << "<text x=\"" << left - 4 << "\" y=\"" << y0 + h << "\" text-anchor=\"end\" font-size=\"10\" fill=\"#888\">empty</text>\n";
  }
  // The time axis: round ticks, labelled.
  const double step = tick_step(tmax, 10);
  os << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\"" << left + plot_w << "\" y2=\"" << axis_y
     << "\" stroke=\"#888\"/>\n";
  for (double t = 0; t <= tmax + 1e-9; t += step)
    os << "<line x1=\"" << fmt(x_of(t)) << "\" y1=\"" << axis_y << "\" x2=\"" << fmt(x_of(t)) << "\" y2=\"" << axis_y + 5
       << "\" stroke=\"#888\"/><text x=\"" << fmt(x_of(t)) << "\" y=\"" << axis_y + 18
       << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555\">" << fmt(t, step < 1 ? 1 : 0) << "</text>\n";
  os << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << axis_y + 34
     << "\" text-anchor=\"middle\" fill=\"#555\">seconds since the run started</text>\n";
  // Events: a dashed line across the plots at each one's time, numbered, and listed below.
  for (size_t i = 0; i < events.size() && i < 40; ++i) {
    const Event& e = events[i];
    const char* colour = e.kind == "autotune" ? "#d9822b" : "#c0392b";
    double x = x_of(e.t_s);
    os << "<line x1=\"" << fmt(x) << "\" y1=\"" << series_top << "\" x2=\"" << fmt(x) << "\" y2=\"" << axis_y
       << "\" stroke=\"" << colour << "\" stroke-dasharray=\"3,3\"/>\n";
    os << "<text x=\"" << fmt(x + 2) << "\" y=\"" << series_top + 10 << "\" fill=\"" << colour << "\">" << i + 1 << "</text>\n";
    os << "<text x=\"10\" y=\"" << axis_y + 56 + 16 * static_cast<int>(i) << "\" fill=\"" << colour << "\">" << i + 1 << ". "
       << fmt(e.t_s, 1) << " s " << xml_escape(e.kind) << ": " << xml_escape(e.text.substr(0, 140)) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace pipeline::graph
