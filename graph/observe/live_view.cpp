// Live view rendering (see live_view.h). Runs on the engine's monitor thread at each report.
#include "graph/observe/live_view.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "graph/observe/percent.h"

namespace pipeline::graph {

LiveView::LiveView(Engine& engine, std::ostream& os, LiveViewOptions opts) : os_(os), opts_(opts) {
  using Mode = LiveViewOptions::Mode;
  if (opts_.mode == Mode::off) return;
  if (opts_.mode == Mode::automatic) {
    int fd = &os == &std::cout ? 1 : (&os == &std::cerr || &os == &std::clog) ? 2 : -1;
    tty_ = fd >= 0 && isatty(fd);
  } else {
    tty_ = opts_.mode == Mode::tty;
  }
  engine.add_observer([this](const Snapshot& s) { on_snapshot(s); });
}

void LiveView::set_status(std::string line) {
  std::lock_guard lock(mu_);
  status_ = std::move(line);
}

std::string LiveView::render(const Snapshot& s, bool tty) const {
  Verdict v = s.verdict.kind.empty() ? analyze(s) : s.verdict;
  std::string status;
  {
    std::lock_guard lock(mu_);
    status = status_;
  }
  std::ostringstream os;
  char buf[256];
  if (!tty) {
    // One compact line: t, each stage's rate and busy share, each queue's mean/capacity.
    std::snprintf(buf, sizeof buf, "[%6.1fs]", s.t_s);
    os << buf;
    if (!status.empty()) os << " " << status << " |";
    for (const auto& x : s.stages) {
      std::snprintf(buf, sizeof buf, " %s %.0f/s %.0f%%", x.name.c_str(), x.window_items_per_s, 100 * x.window_busy);
      os << buf;
      if (shows_device_wait(x.window_device_wait)) os << " +" << pct(x.window_device_wait) << " device wait";
      if (const QueueStats* q = s.queue_of(x.name)) {
        std::snprintf(buf, sizeof buf, " (q %.1f/%d)", q->window_mean, q->capacity);
        os << buf;
      }
      if (x.side && !x.figures.empty()) os << " (" << figures_text(x) << ")";
      os << ";";
    }
    os << " bottleneck: " << (v.stage.empty() ? "none (" + v.kind + "-limited)" : v.stage);
    os << "\n";
    return os.str();
  }
  const char* bold = "\033[1m";
  const char* red = "\033[1;31m";
  const char* reset = "\033[0m";
  std::snprintf(buf, sizeof buf, "%spipeline%s  %.1f s  %s\n", bold, reset, s.t_s, s.status.c_str());
  os << buf;
  if (!status.empty()) os << status << "\n";
  std::snprintf(buf, sizeof buf, "%-16s %4s %6s %9s %10s   %-*s %s\n", "stage", "wrk", "busy", "dev wait", "items/s",
                opts_.bar_width + 2, "input queue (now # / mean |)", "cur/cap");
  os << buf;
  for (const auto& x : s.stages) {
    bool hot = x.name == v.stage;
    std::string bar;
    std::string occ;
    if (const QueueStats* q = s.queue_of(x.name)) {
      int w = opts_.bar_width;
      int cur = q->capacity ? (q->current * w + q->capacity / 2) / q->capacity : 0;
      int mean = q->capacity ? static_cast<int>(q->window_mean * w / q->capacity + 0.5) : 0;
      bar = "[";
      for (int i = 0; i < w; ++i) bar += i < cur ? '#' : ' ';
      bar += "]";
      if (mean >= 0 && mean <= w) bar[1 + std::min(mean, w - 1)] = '|';
      occ = std::to_string(q->current) + "/" + std::to_string(q->capacity);
    } else if (x.side) {
      bar = figures_text(x);
      bar.resize(std::max<size_t>(bar.size(), static_cast<size_t>(opts_.bar_width + 2)), ' ');
      occ = "(beside)";
    } else {
      bar = std::string(opts_.bar_width + 2, ' ');
      occ = "(source)";
    }
    // "-" for a stage that never slept on the device (every stage of a CPU run).
    const std::string wait = x.device_wait_s > 0 ? pct(x.window_device_wait) : "-";
    std::snprintf(buf, sizeof buf, "%s%-16s %4d %5.0f%% %9s %10.1f   %s %s%s\n", hot ? red : "", x.name.c_str(),
                  x.workers, 100 * x.window_busy, wait.c_str(), x.window_items_per_s, bar.c_str(), occ.c_str(),
                  hot ? reset : "");
    os << buf;
  }
  os << (v.stage.empty() ? "" : red) << "bottleneck: " << v.text << (v.stage.empty() ? "" : reset) << "\n";
  {
    std::lock_guard lock(mu_);
    for (const auto& e : recent_) {
      std::snprintf(buf, sizeof buf, "%7.1f s  ", e.t_s);
      os << buf << e.kind << ": " << e.text << "\n";
    }
  }
  return os.str();
}

bool LiveView::stream_ok() {
  if (lost_) return false;
  if (os_) return true;
  lost_ = true;
  const int err = errno;  // set by the write that failed
  if (opts_.on_write_error) opts_.on_write_error(err);
  return false;
}

void LiveView::on_snapshot(const Snapshot& s) {
  if (lost_) return;
  if (!s.events.empty()) {
    std::lock_guard lock(mu_);
    for (const auto& e : s.events) recent_.push_back(e);
    while (recent_.size() > 4) recent_.erase(recent_.begin());
  }
  if (!tty_ && opts_.mode != LiveViewOptions::Mode::off) {
    // In a log every event is a line of its own, when it happens.
    for (const auto& e : s.events) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "[%6.1fs] ", e.t_s);
      os_ << buf << e.kind << ": " << e.text << "\n";
    }
    os_ << std::flush;
    if (!stream_ok()) return;
  }
  if (!tty_ && !s.finished && s.t_s - last_line_t_ < opts_.line_interval_s) return;  // not due: skip the render
  std::string text = render(s, tty_);
  if (tty_) {
    std::string out;
    if (lines_drawn_ > 0) out += "\033[" + std::to_string(lines_drawn_) + "F\033[J";  // back up and clear
    out += text;
    lines_drawn_ = 0;
    for (char c : text) lines_drawn_ += c == '\n';
    os_ << out << std::flush;
  } else if (s.finished || s.t_s - last_line_t_ >= opts_.line_interval_s) {
    last_line_t_ = s.t_s;
    os_ << text << std::flush;
  }
  stream_ok();
}

}  // namespace pipeline::graph
