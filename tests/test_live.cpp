// Tests for the live server (graph/observe/http_server.h), its Prometheus text
// (graph/observe/prometheus.h) and its page (graph/observe/live_page.h), against running graphs
// of synthetic stages whose bottleneck is known by construction (a 20 ms stage between faster
// ones). Requests go over loopback sockets with bounded waits. Three CTest tests run this
// program: test_live (everything but the two below), test_live_prometheus (/metrics through the
// prometheus-client parser; skipped, exit 77, without it) and test_live_browser (headless
// Chromium loads the live page and a finished run's page; skipped without Chromium).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/json.h"
#include "graph/engine.h"
#include "graph/observe/http_server.h"
#include "graph/observe/live_page.h"
#include "graph/observe/prometheus.h"
#include "test_util.h"

using namespace pipeline::graph;
using namespace std::chrono_literals;
using test_util::contains;

namespace {

using Clock = std::chrono::steady_clock;

// ---- A minimal HTTP client over a loopback socket, every wait bounded.

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

bool send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the server closes the connection or `timeout` passes.
std::string read_all(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  const auto end = Clock::now() + timeout;
  char buf[8192];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Response {
  int status = 0;  // 0: no answer
  std::string head, body;
};

Response parse_response(const std::string& raw) {
  Response r;
  const auto split = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || split == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  r.head = raw.substr(0, split);
  r.body = raw.substr(split + 4);
  return r;
}

Response request(int port, const std::string& raw, std::chrono::milliseconds timeout = 20s) {
  int fd = connect_to(port);
  Response r;
  if (send_all(fd, raw)) r = parse_response(read_all(fd, timeout));
  ::close(fd);
  return r;
}

Response get(int port, const std::string& path) {
  return request(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
}

// ---- A running graph with the server fed by its reports.

GraphSpec slow_middle() {
  GraphSpec g;
  g.add("src", "test_source").set("count", int64_t{1'000'000'000}).set("ms", 2.0);
  g.add("slow", "delay", {"src"}, 1, 4).set("ms", 20.0);
  g.add("fast", "delay", {"slow"}, 1, 8).set("ms", 1.0);
  g.add("sink", "test_sink", {"fast"}, 1, 8);
  return g;
}

struct LiveGraph {
  test_util::TempDir dir{"live"};
  Engine engine;
  LiveServer server;
  std::thread runner;

  explicit LiveGraph(LiveServerOptions so = {}, GraphSpec g = slow_middle())
      : engine(std::move(g), options(dir.path)), server(so) {
    server.publish(engine.snapshot(), {});
    engine.add_observer([this](const Snapshot& s) { server.publish(s, engine.events()); });
    runner = std::thread([this] { engine.run(); });
  }
  ~LiveGraph() { finish(); }
  void finish() {
    if (!runner.joinable()) return;
    engine.stop();
    runner.join();
  }
  static EngineOptions options(const std::filesystem::path& dir) {
    EngineOptions o;
    o.run_dir = dir;
    o.sample_interval = 5ms;
    o.report_interval = 200ms;
    o.steady_window = 1500ms;
    o.trace = false;
    // The runner's own figures, as a training run adds its loss: here a counter of reports.
    o.annotate = [n = 0](Snapshot& s) mutable { s.train = {{"step", ++n}, {"loss", 1.0 / n}}; };
    return o;
  }
  // The served snapshot, once its report is at least `t` seconds into the run (bounded wait).
  Snapshot snapshot_after(double t) {
    const auto end = Clock::now() + 60s;
    while (Clock::now() < end) {
      Response r = get(server.port(), "/api/snapshot");
      REQUIRE(r.status == 200);
      Snapshot s = snapshot_from_json(r.body);
      if (s.t_s >= t && s.status == "running") return s;
      std::this_thread::sleep_for(50ms);
    }
    FAIL("no report " << t << " s into the run within 60 s");
    return {};
  }
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    auto nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

// The samples of a Prometheus text: "name{labels}" -> value; checks every line's shape.
std::map<std::string, double> samples_of(const std::string& text) {
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEInfNa]+)$)");
  static const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::map<std::string, double> out;
  for (const auto& line : lines_of(text)) {
    if (line.empty()) continue;
    std::smatch m;
    if (line[0] == '#') {
      CHECK_MESSAGE(std::regex_match(line, comment), line);
      continue;
    }
    REQUIRE_MESSAGE(std::regex_match(line, m, sample), line);
    CHECK_MESSAGE(out.count(m[1].str() + m[2].str()) == 0, "duplicate series " << line);
    out[m[1].str() + m[2].str()] = std::strtod(m[3].str().c_str(), nullptr);
  }
  return out;
}

}  // namespace

TEST_CASE("listen addresses: a port alone is 127.0.0.1, anything else is explicit") {
  auto a = parse_listen_address("8080");
  CHECK(a.host == "127.0.0.1");
  CHECK(a.port == 8080);
  CHECK(a.loopback());
  CHECK(a.str() == "127.0.0.1:8080");
  a = parse_listen_address("0.0.0.0:9000");
  CHECK(a.host == "0.0.0.0");
  CHECK_FALSE(a.loopback());
  CHECK(parse_listen_address("localhost:0").str() == "127.0.0.1:0");
  a = parse_listen_address("[::1]:8080");
  CHECK(a.loopback());
  CHECK(a.str() == "[::1]:8080");
  CHECK(contains(test_util::error_of([] { parse_listen_address("80800"); }), "0 to 65535"));
  CHECK(contains(test_util::error_of([] { parse_listen_address("example.com:80"); }), "not an IPv4 address"));
  CHECK(contains(test_util::error_of([] { parse_listen_address(""); }), "expected PORT"));
  CHECK(contains(test_util::error_of([] { parse_listen_address("[::1]8080"); }), ":PORT"));
}

TEST_CASE("Prometheus text: conventions, labels escaped, every stage and edge") {
  Snapshot s;
  s.t_s = 12;
  StageStats a;
  a.name = "tok\"en\\ize";
  a.type = "delay";
  a.workers = 4;
  a.busy_s = 12.5;
  a.items_in = 300;
  StageStats b = a;
  b.name = "train";
  b.rank = 1;
  b.busy_s = 2.5;  // host work; asleep on the device apart
  b.device_wait_s = 10;
  b.window_busy = 0.2;
  b.window_device_wait = 0.75;
  s.stages = {a, b};
  QueueStats q;
  q.consumer = "train";
  q.producers = {"pack"};
  q.capacity = 8;
  q.current = 3;
  q.high_water = 8;
  s.queues = {q};
  s.train = {{"step", 40}, {"loss", 4.25}, {"ms_per_step", 250}, {"hellaswag_acc_norm", 0.295},
             {"guard_skips", 3}, {"guard_rollbacks", 1}};
  s.verdict.kind = "stage";
  s.verdict.stage = "train";
  const std::string text = prometheus_text(s);
  auto m = samples_of(text);
  CHECK(contains(text, "# TYPE pipeline_stage_busy_seconds_total counter\n"));
  CHECK(contains(text, "# TYPE pipeline_edge_occupancy gauge\n"));
  CHECK(m.at(R"(pipeline_stage_busy_seconds_total{stage="tok\"en\\ize",rank="0"})") == 12.5);
  CHECK(m.at(R"(pipeline_stage_busy_seconds_total{stage="train",rank="1"})") == 2.5);
  CHECK(contains(text, "# TYPE pipeline_stage_device_wait_seconds_total counter\n"));
  CHECK(m.at(R"(pipeline_stage_device_wait_seconds_total{stage="train",rank="1"})") == 10);
  CHECK(m.at(R"(pipeline_stage_device_wait_seconds_total{stage="tok\"en\\ize",rank="0"})") == 0);
  CHECK(m.at(R"(pipeline_stage_busy_ratio{stage="train",rank="1"})") == doctest::Approx(0.2));
  CHECK(m.at(R"(pipeline_stage_device_wait_ratio{stage="train",rank="1"})") == doctest::Approx(0.75));
  CHECK(m.at(R"(pipeline_stage_items_in_total{stage="train",rank="1"})") == 300);
  CHECK(m.at(R"(pipeline_stage_workers{stage="train",rank="1"})") == 4);
  CHECK(m.at(R"(pipeline_edge_occupancy{edge="pack->train",rank="0"})") == 3);
  CHECK(m.at(R"(pipeline_edge_capacity{edge="pack->train",rank="0"})") == 8);
  CHECK(m.at(R"(pipeline_edge_high_water{edge="pack->train",rank="0"})") == 8);
  CHECK(m.at(R"(pipeline_train_step{rank="0"})") == 40);
  CHECK(m.at(R"(pipeline_train_step_seconds{rank="0"})") == doctest::Approx(0.25));
  CHECK(m.at(R"(pipeline_bottleneck_info{stage="train",kind="stage",rank="0"})") == 1);
  CHECK(m.at(R"(pipeline_train_hellaswag_acc_norm_ratio{rank="0"})") == doctest::Approx(0.295));
  CHECK(contains(text, "# TYPE pipeline_train_hellaswag_acc_norm_ratio gauge\n"));
  // The spike guard's events are counters (runner/train_figures.h takes them from metrics.jsonl).
  CHECK(contains(text, "# TYPE pipeline_train_guard_skips_total counter\n"));
  CHECK(contains(text, "# TYPE pipeline_train_guard_rollbacks_total counter\n"));
  CHECK(m.at(R"(pipeline_train_guard_skips_total{rank="0"})") == 3);
  CHECK(m.at(R"(pipeline_train_guard_rollbacks_total{rank="0"})") == 1);
  CHECK(m.count(R"(pipeline_train_mfu_ratio{rank="0"})") == 0);  // not given: not invented
  CHECK(m.count(R"(pipeline_train_hellaswag_acc_ratio{rank="0"})") == 0);
  for (const auto& sample : m)
    if (sample.first.find("_total{") != std::string::npos) CHECK_MESSAGE(sample.second >= 0, sample.first);
}

TEST_CASE("train figures survive the stats.jsonl round trip") {
  Snapshot s;
  s.t_s = 3;
  s.train = {{"step", 7}, {"loss", 5.5}, {"tokens_per_s", 1234.5}};
  Snapshot back = snapshot_from_json(to_json(s));
  CHECK(back.train == s.train);
  CHECK(back.train_figure("loss") == 5.5);
  CHECK(back.train_figure("mfu", -1) == -1);
  s.train = {{"loss", std::nan("")}};
  back = snapshot_from_json(to_json(s));  // a diverged loss is null in JSON, NaN again here
  REQUIRE(back.train.size() == 1);
  CHECK(std::isnan(back.train[0].second));
}

TEST_CASE("the live server serves a running graph: its snapshots are stats.jsonl lines") {
  LiveGraph g;
  const int port = g.server.port();
  CHECK(port > 0);
  CHECK(g.server.url() == "http://127.0.0.1:" + std::to_string(port) + "/");

  Response page = get(port, "/");
  REQUIRE(page.status == 200);
  CHECK(contains(page.head, "text/html"));
  CHECK(page.body == live_page_html());
  CHECK(contains(page.body, "<svg id=\"graph\""));
  // Self-contained: no script, style, image or fetch from anywhere else.
  CHECK_FALSE(std::regex_search(page.body, std::regex(R"((src|href)\s*=\s*["']?(https?:)?//)")));
  CHECK_FALSE(std::regex_search(page.body, std::regex(R"(fetch\(\s*["'`]https?:)")));

  // Several reports while the graph runs, each kept as served.
  std::vector<std::string> served;
  std::set<double> times;
  const auto end = Clock::now() + 60s;
  Response metrics1;
  while (times.size() < 4 && Clock::now() < end) {
    Response r = get(port, "/api/snapshot");
    REQUIRE(r.status == 200);
    CHECK(contains(r.head, "application/json"));
    Snapshot s = snapshot_from_json(r.body);
    if (s.status == "running" && times.insert(s.t_s).second) served.push_back(r.body);
    if (times.size() == 1 && metrics1.status == 0) metrics1 = get(port, "/metrics");
    std::this_thread::sleep_for(60ms);
  }
  REQUIRE(times.size() >= 4);
  Response metrics2 = get(port, "/metrics");
  Response history = get(port, "/api/history");
  Response events = get(port, "/api/events");
  g.finish();

  // Byte for byte the lines the engine wrote to stats.jsonl: the same report, the same numbers.
  const auto jsonl = lines_of(test_util::read_file(g.dir / "stats.jsonl"));
  const std::set<std::string> written(jsonl.begin(), jsonl.end());
  for (const auto& body : served) CHECK_MESSAGE(written.count(body) == 1, body.substr(0, 200));
  const Snapshot last = snapshot_from_json(served.back());
  const std::vector<std::string> names = g.engine.stage_names();
  REQUIRE(last.stages.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) CHECK(last.stages[i].name == names[i]);
  CHECK(last.stage("sink")->items_in > 0);
  CHECK(last.train_figure("step") >= 4);  // EngineOptions::annotate reached the report
  CHECK(contains(jsonl.back().empty() ? jsonl[jsonl.size() - 2] : jsonl.back(), "\"finished\":true"));

  // /metrics: well formed, every stage and edge, counters that only grow.
  REQUIRE(metrics1.status == 200);
  REQUIRE(metrics2.status == 200);
  CHECK(contains(metrics2.head, "text/plain; version=0.0.4"));
  auto m1 = samples_of(metrics1.body), m2 = samples_of(metrics2.body);
  for (const auto& name : names) {
    const std::string key = "pipeline_stage_busy_seconds_total{stage=\"" + name + "\",rank=\"0\"}";
    REQUIRE_MESSAGE(m2.count(key) == 1, key);
    CHECK(m2.at(key) >= m1.at(key));
    CHECK(m2.count("pipeline_stage_starved_seconds_total{stage=\"" + name + "\",rank=\"0\"}") == 1);
    CHECK(m2.count("pipeline_stage_device_wait_seconds_total{stage=\"" + name + "\",rank=\"0\"}") == 1);
    CHECK(m2.count("pipeline_stage_items_out_total{stage=\"" + name + "\",rank=\"0\"}") == 1);
  }
  const std::string sink_in = R"(pipeline_stage_items_in_total{stage="sink",rank="0"})";
  CHECK(m2.at(sink_in) > m1.at(sink_in));
  for (const char* edge : {"src->slow", "slow->fast", "fast->sink"}) {
    CHECK(m2.count("pipeline_edge_occupancy{edge=\"" + std::string(edge) + "\",rank=\"0\"}") == 1);
    CHECK(m2.count("pipeline_edge_capacity{edge=\"" + std::string(edge) + "\",rank=\"0\"}") == 1);
  }
  CHECK(m2.at(R"(pipeline_edge_capacity{edge="src->slow",rank="0"})") == 4);
  CHECK(m2.at(R"(pipeline_train_step{rank="0"})") >= 2);

  // The sparklines' history: one point per report, one value per edge.
  REQUIRE(history.status == 200);
  auto h = pipeline::json_parse(history.body);
  REQUIRE(h.array("edges").size() == 3);
  CHECK(h.array("edges")[0].text == "src->slow");
  CHECK(h.array("points").size() >= 4);
  CHECK(h.array("points").back().items.size() == 4);  // t and three edges
  REQUIRE(events.status == 200);
  CHECK(pipeline::json_parse(events.body).type == pipeline::JsonValue::Type::array);
}

TEST_CASE("bad requests get clean errors and never stop the run") {
  LiveServerOptions so;
  so.request_timeout_ms = 1000;
  so.queue = 4;
  LiveGraph g(so);
  const int port = g.server.port();
  g.snapshot_after(0.2);

  CHECK(get(port, "/nothing/here").status == 404);
  CHECK(get(port, "/metrics/extra").status == 404);
  CHECK(get(port, "/../../etc/passwd").status / 100 == 4);
  Response post = request(port, "POST /api/snapshot HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
  CHECK(post.status == 405);
  CHECK(contains(post.head, "Allow: GET, HEAD"));
  CHECK(request(port, "DELETE / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").status == 405);
  Response head = request(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(head.status == 200);
  CHECK(head.body.empty());
  CHECK(request(port, "garbage\r\n\r\n").status / 100 == 4);

  // A head far beyond the limit: refused, or the connection closed, never served.
  Response huge = request(port, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(200'000, 'a') + "\r\n\r\n");
  CHECK(huge.status != 200);
  Response long_uri = request(port, "GET /" + std::string(20'000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(long_uri.status != 200);

  // A client that asks for the page and vanishes before reading it (reset, not closed).
  for (int i = 0; i < 20; ++i) {
    int fd = connect_to(port);
    send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd);
  }

  // Many connections at once that send nothing (more than threads and queue): each is dropped
  // after the read timeout, and a request after them is answered.
  std::vector<int> idle;
  for (int i = 0; i < 30; ++i) idle.push_back(connect_to(port));
  CHECK(request(port, "GET /api/snapshot HTTP/1.1\r\nHost: x\r\n\r\n", 90s).status == 200);
  for (int fd : idle) ::close(fd);

  // A slow client, one byte of its head every 200 ms, holds one thread; the others still answer.
  std::atomic<bool> trickling{true};
  std::thread slow([&] {
    int fd = connect_to(port);
    for (char c : std::string("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ") + std::string(100, 'z'))
      if (!trickling || !send_all(fd, std::string(1, c))) break;
      else std::this_thread::sleep_for(200ms);
    ::close(fd);
  });
  std::this_thread::sleep_for(500ms);
  CHECK(get(port, "/metrics").status == 200);
  trickling = false;
  slow.join();

  // Still serving, and the graph still running: items keep flowing.
  Snapshot before = g.snapshot_after(0);
  Snapshot after = g.snapshot_after(before.t_s + 0.5);
  CHECK(after.stage("sink")->items_in > before.stage("sink")->items_in);
  CHECK(get(port, "/").status == 200);
  CHECK(g.server.requests() > 20);
}

TEST_CASE("a request without a body that is not GET or HEAD is refused at once") {
  // No Content-Length and not chunked: no body (RFC 9112, 6.3). The client keeps its side open,
  // as curl -X POST does, so the answer must not wait for the end of a body or the read timeout.
  LiveServerOptions so;
  so.request_timeout_ms = 10000;
  LiveGraph g(so);
  const int port = g.server.port();
  for (const char* method : {"POST", "PUT", "PATCH", "DELETE"}) {
    INFO(method);
    const auto t0 = Clock::now();
    Response r = request(port, std::string(method) + " /api/snapshot HTTP/1.1\r\nHost: x\r\n\r\n", 30s);
    const auto waited = Clock::now() - t0;
    CHECK(r.status == 405);
    CHECK(contains(r.head, "Allow: GET, HEAD"));
    CHECK(waited < 5s);  // the read timeout is 10 s
  }
  // With a body, the body is read first (within payload_max_length), then refused the same way.
  CHECK(request(port, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 30s).status == 405);
  CHECK(get(port, "/metrics").status == 200);
}

TEST_CASE("a port in use is a clear error, before anything runs") {
  LiveServer first(LiveServerOptions{});
  LiveServerOptions so;
  so.address.port = first.port();
  const std::string error = test_util::error_of([&] { LiveServer second(so); });
  INFO(error);
  CHECK(contains(error, "cannot serve the live page on 127.0.0.1:" + std::to_string(first.port())));
  CHECK(contains(error, "choose another port"));
}

TEST_CASE("the finished run's page carries every report and event, safely quoted") {
  Snapshot s;
  s.t_s = 1;
  StageStats st;
  st.name = "</script><script>alert(1)</script>";
  s.stages = {st};
  Event e{0.5, "autotune", "tokenize workers 2 -> 3 </script>"};
  const std::string html = run_page_html({s, s}, {e}, "run <1>");
  const auto at = html.find("<script id=\"run-data\" type=\"application/json\">");
  REQUIRE(at != std::string::npos);
  const auto start = at + std::string("<script id=\"run-data\" type=\"application/json\">").size();
  const auto end = html.find("</script>", start);
  const std::string data = html.substr(start, end - start);
  auto v = pipeline::json_parse(data);  // the data is whole: no "</script>" inside it cut it short
  CHECK(v.array("series").size() == 2);
  CHECK(v.array("series")[0].array("stages")[0].string("name") == st.name);
  CHECK(v.array("events")[0].string("text") == e.text);
  CHECK(v.string("title") == "run <1>");
}

// ---- Checks with outside tools, each a CTest test of its own that is skipped without them.

#ifndef PIPELINE_PROMETHEUS_PYTHON
#define PIPELINE_PROMETHEUS_PYTHON ""
#endif

TEST_CASE("prometheus parser: /metrics of a running graph") {
  const std::string python = PIPELINE_PROMETHEUS_PYTHON;
  if (python.empty() || test_util::shell("'" + python + "' -c 'import prometheus_client.parser'").code != 0) {
    std::printf("skipped: no Python with prometheus_client (tools/setup.sh installs it into the torch venv)\n");
    std::exit(77);
  }
  LiveGraph g;
  g.snapshot_after(0.5);
  Response r = get(g.server.port(), "/metrics");
  REQUIRE(r.status == 200);
  test_util::TempDir tmp("live_prom");
  test_util::write_file(tmp / "metrics.txt", r.body);
  test_util::write_file(tmp / "check.py", R"(
import sys
from prometheus_client.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
for name, f in sorted(families.items()):
    for s in f.samples:
        print(f.type, s.name, ",".join(k + "=" + v for k, v in sorted(s.labels.items())), float(s.value))
)");
  auto out = test_util::shell("'" + python + "' " + (tmp / "check.py").string() + " " + (tmp / "metrics.txt").string());
  INFO(out.out);
  REQUIRE(out.code == 0);
  for (const char* stage : {"src", "slow", "fast", "sink"}) {
    CHECK(contains(out.out, std::string("counter pipeline_stage_busy_seconds_total rank=0,stage=") + stage + " "));
    CHECK(contains(out.out, std::string("counter pipeline_stage_device_wait_seconds_total rank=0,stage=") + stage + " "));
    CHECK(contains(out.out, std::string("gauge pipeline_stage_device_wait_ratio rank=0,stage=") + stage + " "));
    CHECK(contains(out.out, std::string("counter pipeline_stage_items_in_total rank=0,stage=") + stage + " "));
    CHECK(contains(out.out, std::string("gauge pipeline_stage_workers rank=0,stage=") + stage + " "));
  }
  CHECK(contains(out.out, "gauge pipeline_edge_occupancy edge=slow->fast,rank=0 "));
  CHECK(contains(out.out, "gauge pipeline_edge_capacity edge=src->slow,rank=0 4.0"));
}

namespace {

std::string chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (test_util::shell(std::string("command -v ") + name + " >/dev/null").code == 0) return name;
  return "";
}

// The DOM after the page's script ran for `budget_ms` of virtual time (timers run at once,
// fetches take their real time).
std::string dump_dom(const std::string& browser, const std::string& url, int budget_ms) {
  test_util::TempDir profile("live_chromium");
  auto r = test_util::shell("timeout 180 " + browser + " --headless --no-sandbox --disable-gpu --no-first-run " +
                            "--disable-extensions --disable-background-networking --user-data-dir=" +
                            profile.path.string() + " --virtual-time-budget=" + std::to_string(budget_ms) +
                            " --dump-dom '" + url + "' 2>/dev/null | cat");
  REQUIRE_MESSAGE(r.code == 0, r.out.substr(0, 2000));
  return r.out;
}

// Attribute `name` of the first element in the body with `marker` in its start tag.
std::string attribute(const std::string& dom, const std::string& marker, const std::string& name) {
  const auto at = dom.find(marker, dom.find("<body"));  // not in the style sheet
  if (at == std::string::npos) return "";
  const auto tag_start = dom.rfind('<', at);
  const auto tag_end = dom.find('>', at);
  const std::string tag = dom.substr(tag_start, tag_end - tag_start);
  const auto a = tag.find(" " + name + "=\"");
  if (a == std::string::npos) return "";
  const auto v = a + name.size() + 3;
  return tag.substr(v, tag.find('"', v) - v);
}

bool has_edge(const std::string& dom, const std::string& producer, const std::string& consumer) {
  return contains(dom, "data-edge=\"" + producer + "-&gt;" + consumer + "\"") ||
         contains(dom, "data-edge=\"" + producer + "->" + consumer + "\"");
}

}  // namespace

TEST_CASE("browser: the live page draws the running graph, and a finished run's page too") {
  const std::string browser = chromium();
  if (browser.empty()) {
    std::printf("skipped: no chromium (tools/setup.sh installs Debian's)\n");
    std::exit(77);
  }
  LiveGraph g;
  g.snapshot_after(2.5);  // past the steady-state window: the verdict names the slow stage
  const std::string url = g.server.url();
  const std::string dom1 = dump_dom(browser, url, 3000);
  std::this_thread::sleep_for(1500ms);
  const std::string dom2 = dump_dom(browser, url, 3000);
  const Snapshot now = g.snapshot_after(0);
  g.finish();
  // Once the run has ended, the live page shows the steady state the verdict judged, and says so.
  const std::string ended = dump_dom(browser, url, 1500);

  INFO(dom1.substr(0, 4000));
  for (const char* stage : {"src", "slow", "fast", "sink"})
    CHECK_MESSAGE(contains(dom1, "class=\"stage\" data-stage=\"" + std::string(stage) + "\""), stage);
  CHECK(has_edge(dom1, "src", "slow"));
  CHECK(has_edge(dom1, "slow", "fast"));
  CHECK(has_edge(dom1, "fast", "sink"));
  // The outlined stage is the verdict's, which is the slow one.
  REQUIRE(now.verdict.stage == "slow");
  CHECK(attribute(dom1, "data-bottleneck=\"true\"", "data-stage") == "slow");
  CHECK(attribute(dom1, "id=\"verdict\"", "data-stage") == "slow");
  CHECK(std::atoi(attribute(dom1, "id=\"status\"", "data-polls").c_str()) >= 2);
  CHECK(contains(dom1, "class=\"spark\""));
  // Two polls apart, the numbers moved.
  const std::string t1 = attribute(dom1, "id=\"status\"", "data-t"), t2 = attribute(dom2, "id=\"status\"", "data-t");
  CHECK(std::stod(t2) > std::stod(t1));
  const std::string items1 = attribute(dom1, "data-stage=\"sink\"", "data-items");
  const std::string items2 = attribute(dom2, "data-stage=\"sink\"", "data-items");
  CHECK(std::stoll(items2) > std::stoll(items1));

  CHECK(contains(ended, "finished"));
  CHECK(attribute(ended, "id=\"judged\"", "data-judged") == "true");
  CHECK(contains(ended, "Shown: each stage and edge over the steady state the verdict judged."));

  // The same page for the finished run, from its stats.jsonl, standing alone: it opens at the
  // end of the steady state the verdict judged and says so; the slider goes anywhere, and
  // #t=SECONDS picks another report.
  auto series = load_run_series(g.dir.path);
  auto events = load_run_events(g.dir.path);
  REQUIRE(series.size() >= 5);
  REQUIRE(series.back().finished);
  REQUIRE(series.back().has_steady());
  test_util::write_file(g.dir / "run.html", run_page_html(series, events, "live test"));
  const std::string file = "file://" + (g.dir / "run.html").string();
  const std::string opened = dump_dom(browser, file, 500);
  const std::string end = dump_dom(browser, file + "#t=100000", 500);
  const std::string early = dump_dom(browser, file + "#t=1", 500);
  INFO(opened.substr(0, 4000));
  CHECK(attribute(opened, "id=\"judged\"", "data-judged") == "true");
  CHECK(contains(opened, "Shown: the end of the steady state the verdict judged."));
  const double opened_t = std::stod(attribute(opened, "id=\"status\"", "data-t"));
  CHECK(opened_t <= series.back().steady_to_s + 1e-6);
  CHECK(opened_t > series.back().steady_to_s - 0.5);  // the last report inside the window (every 0.2 s)
  CHECK(attribute(end, "id=\"judged\"", "data-judged") == "false");
  CHECK(contains(end, "The verdict judged the steady state"));
  INFO(end.substr(0, 4000));
  for (const char* stage : {"src", "slow", "fast", "sink"})
    CHECK(contains(end, "class=\"stage\" data-stage=\"" + std::string(stage) + "\""));
  CHECK(has_edge(end, "slow", "fast"));
  CHECK(attribute(end, "data-bottleneck=\"true\"", "data-stage") == series.back().verdict.stage);
  CHECK(attribute(end, "id=\"verdict\"", "data-stage") == series.back().verdict.stage);
  CHECK(contains(end, "finished run"));
  CHECK(std::stoll(attribute(end, "data-stage=\"sink\"", "data-items")) >
        std::stoll(attribute(early, "data-stage=\"sink\"", "data-items")));

  // A stage asleep on the device shows its device wait on its box and in its bar; one that never
  // slept on it shows none.
  Snapshot dev = series.back();
  for (auto& st : dev.stages)
    if (st.name == "fast") {
      st.device_wait_s = 3;
      st.window_device_wait = 0.75;
      st.steady.device_wait = 0.6;
      st.steady.busy = 0.1;
    }
  dev.finished = false;  // the report as it was: not the steady-state view of a finished run
  test_util::write_file(g.dir / "dev.html", run_page_html({dev}, {}, "device wait"));
  const std::string waits = dump_dom(browser, "file://" + (g.dir / "dev.html").string(), 500);
  INFO(waits.substr(0, 4000));
  CHECK(attribute(waits, "class=\"stage\" data-stage=\"fast\"", "data-device-wait") == "0.750");
  CHECK(attribute(waits, "class=\"stage\" data-stage=\"slow\"", "data-stage") == "slow");
  CHECK(attribute(waits, "class=\"stage\" data-stage=\"slow\"", "data-device-wait").empty());
  CHECK(contains(waits, "device wait 75%"));
  CHECK(contains(waits, "class=\"split-device-wait\""));
}
