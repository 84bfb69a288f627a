// Run statistics as data: the JSON form of snapshots and events (stats.jsonl lines,
// stats_summary.json) and reading a run directory back. The verdict is in verdict.cpp, the
// table and chart in report.cpp.
#include "graph/observe/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "base/json.h"

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

double Snapshot::train_figure(const std::string& name, double fallback) const {
  for (const auto& [key, value] : train)
    if (key == name) return value;
  return fallback;
}

StageSpan StageStats::whole_run() const {
  StageSpan w;
  w.seconds = wall_s;
  if (wall_s <= 0) return w;
  const double worker_s = wall_s * workers;
  w.busy = busy_s / worker_s;
  w.device_wait = device_wait_s / worker_s;
  w.starved = starved_s / worker_s;
  w.blocked = blocked_s / worker_s;
  w.order_wait = order_wait_s / worker_s;
  w.ready = ready_s / worker_s;
  w.in_per_s = static_cast<double>(items_in) / wall_s;
  w.out_per_s = static_cast<double>(items_out) / wall_s;
  w.cpu_cores = cpu_s / wall_s;
  uint64_t items = source ? items_out : items_in;
  w.cpu_ms_per_item = items ? 1000 * cpu_s / static_cast<double>(items) : 0;
  // An item occupies a worker for its host work and for the device waits inside it.
  const double occupied_s = busy_s + device_wait_s;
  w.capacity_per_s = occupied_s > 0 ? static_cast<double>(items) / occupied_s * workers : 0;
  w.device_busy = device_busy_s / wall_s;
  return w;
}

namespace {

void span_json(std::ostream& os, const StageSpan& w) {
  os << "{\"seconds\":" << w.seconds << ",\"busy\":" << w.busy << ",\"device_wait\":" << w.device_wait
     << ",\"starved\":" << w.starved
     << ",\"blocked\":" << w.blocked << ",\"order_wait\":" << w.order_wait << ",\"ready\":" << w.ready
     << ",\"in_per_s\":" << w.in_per_s << ",\"out_per_s\":" << w.out_per_s << ",\"cpu_cores\":" << w.cpu_cores
     << ",\"cpu_ms_per_item\":" << w.cpu_ms_per_item << ",\"capacity_per_s\":" << w.capacity_per_s
     << ",\"device_busy\":" << w.device_busy << "}";
}

StageSpan span_from_json(const JsonValue* x) {
  StageSpan w;
  if (!x) return w;
  w.seconds = x->number("seconds");
  w.busy = x->number("busy");
  w.device_wait = x->number("device_wait");  // absent before format 2: 0, the wait inside busy
  w.starved = x->number("starved");
  w.blocked = x->number("blocked");
  w.order_wait = x->number("order_wait");
  w.ready = x->number("ready");
  w.in_per_s = x->number("in_per_s");
  w.out_per_s = x->number("out_per_s");
  w.cpu_cores = x->number("cpu_cores");
  w.cpu_ms_per_item = x->number("cpu_ms_per_item");
  w.capacity_per_s = x->number("capacity_per_s");
  w.device_busy = x->number("device_busy");
  return w;
}

void verdict_json(std::ostream& os, const Verdict& v) {
  os << "{\"stage\":" << json_quote(v.stage) << ",\"kind\":" << json_quote(v.kind) << ",\"text\":" << json_quote(v.text)
     << ",\"suggestion\":" << json_quote(v.suggestion) << ",\"span\":" << json_quote(v.span) << ",\"notes\":[";
  for (size_t j = 0; j < v.notes.size(); ++j) os << (j ? "," : "") << json_quote(v.notes[j]);
  os << "]}";
}

}  // namespace

std::string figures_text(const StageStats& st) {
  auto bytes = [](double b) {
    static const char* units[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (b >= 1000 && u < 4) b /= 1000, ++u;
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
    return std::string(buf);
  };
  auto words = [](std::string name) {
    for (auto& c : name)
      if (c == '_') c = ' ';
    return name;
  };
  std::string out;
  char buf[64];
  for (const auto& [name, value] : st.figures) {
    std::string one;
    if (name == "bytes_per_s" || name.ends_with("_bytes_per_s")) {
      one = bytes(value) + "/s";
    } else if (name.ends_with("_bytes")) {
      one = words(name.substr(0, name.size() - 6)) + " " + bytes(value);
    } else if (name.ends_with("_rate")) {
      std::snprintf(buf, sizeof buf, "%.0f%%", 100 * value);
      one = words(name) + " " + buf;
    } else {
      std::snprintf(buf, sizeof buf, "%.4g", value);
      one = std::string(buf) + " " + words(name);
    }
    out += (out.empty() ? "" : ", ") + one;
  }
  return out;
}

std::string to_json(const Snapshot& s, const Verdict* v) {
  std::ostringstream os;
  os << std::setprecision(6);
  os << "{\"t\":" << s.t_s << ",\"stats_format\":" << kStatsFormat << ",\"finished\":" << (s.finished ? "true" : "false")
     << ",\"status\":" << json_quote(s.status)
     << ",\"steady_from\":" << s.steady_from_s << ",\"steady_to\":" << s.steady_to_s << ",\"cores\":" << s.cores << ",\"cpu_cores\":" << s.cpu_cores
     << ",\"process_cores\":" << s.process_cores << ",\"stages\":[";
  for (size_t i = 0; i < s.stages.size(); ++i) {
    const auto& x = s.stages[i];
    os << (i ? "," : "") << "{\"name\":" << json_quote(x.name) << ",\"type\":" << json_quote(x.type)
       << ",\"workers\":" << x.workers << ",\"source\":" << (x.source ? "true" : "false")
       << ",\"sink\":" << (x.sink ? "true" : "false") << ",\"own_thread\":" << (x.own_thread ? "true" : "false")
       << ",\"items_in\":" << x.items_in << ",\"items_out\":" << x.items_out << ",\"discarded\":" << x.discarded
       << ",\"busy_s\":" << x.busy_s << ",\"starved_s\":" << x.starved_s << ",\"blocked_s\":" << x.blocked_s
       << ",\"order_wait_s\":" << x.order_wait_s << ",\"ready_s\":" << x.ready_s << ",\"cpu_s\":" << x.cpu_s
       << ",\"wall_s\":" << x.wall_s << ",\"device_wait_s\":" << x.device_wait_s
       << ",\"device_busy_s\":" << x.device_busy_s << ",\"device_busy_gpu\":" << (x.device_busy_gpu ? "true" : "false")
       << ",\"window_items_per_s\":" << x.window_items_per_s
       << ",\"window_busy\":" << x.window_busy << ",\"window_device_wait\":" << x.window_device_wait
       << ",\"busy\":" << x.busy() << ",\"device_wait\":" << x.device_wait() << ",\"items_per_s\":" << x.items_per_s()
       << ",\"steady\":";
    span_json(os, x.steady);
    if (x.rank >= 0) os << ",\"rank\":" << x.rank;
    if (x.side) {
      os << ",\"side\":true,\"note\":" << json_quote(x.note) << ",\"suggestion\":" << json_quote(x.suggestion)
         << ",\"figures\":{";
      for (size_t f = 0; f < x.figures.size(); ++f)
        os << (f ? "," : "") << json_quote(x.figures[f].first) << ":"
           << (std::isfinite(x.figures[f].second) ? x.figures[f].second : 0.0);
      os << "}";
    }
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
       << ",\"window_mean\":" << q.window_mean << ",\"steady_mean\":" << q.steady_mean
       << ",\"steady_full\":" << q.steady_full << ",\"steady_empty\":" << q.steady_empty << "}";
  }
  os << "]";
  if (!s.train.empty()) {
    os << ",\"train\":{";
    for (size_t i = 0; i < s.train.size(); ++i) {
      const double x = s.train[i].second;
      os << (i ? "," : "") << json_quote(s.train[i].first) << ":" << json_number(x);
    }
    os << "}";
  }
  const Verdict* verdict = v ? v : (s.verdict.kind.empty() ? nullptr : &s.verdict);
  if (verdict) {
    os << ",\"verdict\":";
    verdict_json(os, *verdict);
  }
  os << "}";
  return os.str();
}

std::string to_json(const Event& e) {
  std::ostringstream os;
  os << std::setprecision(6) << "{\"event\":" << json_quote(e.kind) << ",\"t\":" << e.t_s
     << ",\"text\":" << json_quote(e.text) << "}";
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
  if (root.find("event")) throw std::runtime_error("stats JSON: an event line, not a snapshot");
  Snapshot s;
  s.t_s = root.number("t");
  s.finished = root.flag("finished");
  s.status = root.string("status");
  s.steady_from_s = root.number("steady_from", -1);
  s.steady_to_s = root.number("steady_to", s.steady_from_s >= 0 ? s.t_s : -1);
  s.cores = static_cast<int>(root.number("cores"));
  s.cpu_cores = root.number("cpu_cores");
  s.process_cores = root.number("process_cores");
  const int format = static_cast<int>(root.number("stats_format", 1));
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
    st.order_wait_s = x.number("order_wait_s");
    st.ready_s = x.number("ready_s");
    st.cpu_s = x.number("cpu_s");
    st.wall_s = x.number("wall_s");
    st.device_wait_s = x.number("device_wait_s");
    // Format 1 counted the device waits inside busy_s; both were recorded over the whole run, so
    // the split is exact. Its window and steady-state shares had no device wait of their own: they
    // are read as written (their busy includes the wait, their device_wait share is 0).
    if (format < 2) st.busy_s = std::max(0.0, st.busy_s - st.device_wait_s);
    st.device_busy_s = x.number("device_busy_s");
    st.device_busy_gpu = x.flag("device_busy_gpu");
    st.window_items_per_s = x.number("window_items_per_s");
    st.window_busy = x.number("window_busy");
    st.window_device_wait = x.number("window_device_wait");
    st.rank = static_cast<int>(x.number("rank", -1));
    st.steady = span_from_json(x.find("steady"));
    st.side = x.flag("side");
    st.note = x.string("note");
    st.suggestion = x.string("suggestion");
    if (const JsonValue* f = x.find("figures"); f && f->type == JsonValue::Type::object)
      for (const auto& [key, value] : f->members)
        if (value.type == JsonValue::Type::number) st.figures.emplace_back(key, std::strtod(value.text.c_str(), nullptr));
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
    q.steady_mean = x.number("steady_mean");
    q.steady_full = x.number("steady_full");
    q.steady_empty = x.number("steady_empty");
    s.queues.push_back(std::move(q));
  }
  if (const JsonValue* t = root.find("train"); t && t->type == JsonValue::Type::object)
    for (const auto& [key, value] : t->members)
      s.train.emplace_back(key, value.type == JsonValue::Type::number ? std::strtod(value.text.c_str(), nullptr) : NAN);
  if (const JsonValue* v = root.find("verdict")) {
    s.verdict.stage = v->string("stage");
    s.verdict.kind = v->string("kind");
    s.verdict.text = v->string("text");
    s.verdict.suggestion = v->string("suggestion");
    s.verdict.span = v->string("span");
    for (const auto& n : v->array("notes")) s.verdict.notes.push_back(n.text);
  }
  return s;
}

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Calls `line_fn(line, number, is_last)` for each non-empty line of RUN_DIR/stats.jsonl.
template <class F>
void each_stats_line(const std::filesystem::path& run_dir, F line_fn) {
  auto path = run_dir / "stats.jsonl";
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot open (is this a run directory?)");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      line_fn(line);
    } catch (const std::runtime_error& e) {
      if (in.peek() == EOF) break;  // a running run may be writing its last line
      throw std::runtime_error(path.string() + ":" + std::to_string(n) + ": " + e.what());
    }
  }
}

bool is_event_line(const std::string& line) { return line.rfind("{\"event\":", 0) == 0; }

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
  std::vector<Snapshot> out;
  each_stats_line(run_dir, [&](const std::string& line) {
    if (!is_event_line(line)) out.push_back(snapshot_from_json(line));
  });
  return out;
}

std::vector<Event> load_run_events(const std::filesystem::path& run_dir) {
  std::vector<Event> out;
  each_stats_line(run_dir, [&](const std::string& line) {
    if (!is_event_line(line)) return;
    JsonValue v;
    try {
      v = json_parse(line);
    } catch (const JsonParseError& e) {
      throw std::runtime_error(std::string("stats JSON: ") + e.what());
    }
    out.push_back(Event{v.number("t"), v.string("event"), v.string("text")});
  });
  return out;
}

}  // namespace pipeline::graph
