// See http_server.h.
#include "graph/observe/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <functional>
#include <thread>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include <httplib.h>

#include "base/json.h"
#include "base/thread_name.h"
#include "graph/observe/live_page.h"
#include "graph/observe/prometheus.h"

namespace pipeline::graph {

// The response bodies of one report. Built by publish(), read by any number of requests.
struct LiveServer::Bodies {
  std::string snapshot, metrics, history, events;
};

namespace {

std::string history_json(const std::vector<std::string>& edges, const auto& points) {
  std::ostringstream os;
  os.precision(4);
  os << "{\"edges\":[";
  for (size_t i = 0; i < edges.size(); ++i) os << (i ? "," : "") << json_quote(edges[i]);
  os << "],\"points\":[";
  bool first = true;
  for (const auto& p : points) {
    os << (first ? "" : ",") << "[" << p.t;
    for (double x : p.occupancy) os << "," << x;
    os << "]";
    first = false;
  }
  os << "]}";
  return os.str();
}

std::string events_json(const std::vector<Event>& events) {
  constexpr size_t kMost = 500;  // the newest; a run rarely has more than a few dozen
  std::string out = "[";
  for (size_t i = events.size() > kMost ? events.size() - kMost : 0; i < events.size(); ++i) {
    if (out.size() > 1) out += ",";
    out += to_json(events[i]);
  }
  return out + "]";
}

// Why binding `a` fails, as the system says it ("Address already in use"), or "" when it does
// not: the server library only says that it could not.
std::string bind_problem(const ListenAddress& a) {
  const bool v6 = a.host.find(':') != std::string::npos;
  int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // as the server binds
  int rc = -1;
  if (v6) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(static_cast<uint16_t>(a.port));
    inet_pton(AF_INET6, a.host.c_str(), &sa.sin6_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  } else {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(a.port));
    inet_pton(AF_INET, a.host.c_str(), &sa.sin_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  }
  const std::string why = rc == 0 ? "" : std::strerror(errno);
  ::close(fd);
  return why;
}

// Blocks SIGPIPE in the calling thread: a write to a client that went away then fails with
// EPIPE in this thread instead of raising a signal, whatever the process does with SIGPIPE.
void block_sigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace

// The server's threads and its queue of accepted connections, both bounded: when every thread
// is busy and the queue is full, the accepting thread waits, and further clients wait in the
// kernel's backlog (or are refused) instead of piling up here.
class LiveServer::Pool : public httplib::TaskQueue {
 public:
  Pool(int threads, int queue, std::function<void()> gone)
      : most_(static_cast<size_t>(std::max(1, queue))), gone_(std::move(gone)) {
    for (int i = 0; i < std::max(1, threads); ++i)
      threads_.emplace_back([this] {
        name_this_thread("live-worker");
        work();
      });
  }
  ~Pool() override {
    shutdown();
    gone_();
  }
  void enqueue(std::function<void()> fn) override {
    std::unique_lock lock(mu_);
    room_.wait(lock, [&] { return jobs_.size() < most_ || closing_; });
    jobs_.push_back(std::move(fn));  // while closing, still run: the job closes its socket
    ready_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (closing_ && threads_.empty()) return;
      closing_ = true;
    }
    ready_.notify_all();
    room_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }
  /// Lets a waiting enqueue() through at once (the server is stopping).
  void close() {
    std::lock_guard lock(mu_);
    closing_ = true;
    room_.notify_all();
    ready_.notify_all();
  }

 private:
  void work() {
    block_sigpipe();
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mu_);
        ready_.wait(lock, [&] { return !jobs_.empty() || closing_; });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        room_.notify_one();
      }
      job();
    }
  }
  const size_t most_;
  std::function<void()> gone_;  // tells the server the pool is gone (httplib owns and deletes it)
  std::mutex mu_;
  std::condition_variable ready_, room_;
  std::deque<std::function<void()>> jobs_;
  bool closing_ = false;
  std::vector<std::thread> threads_;
};

LiveServer::LiveServer(LiveServerOptions opts) : opts_(std::move(opts)) {
  const std::string where = opts_.address.str();
  // httplib's server sets SIGPIPE to "ignore" for the whole process when it is made; the rest of
  // the program keeps the disposition it had, and the server's own threads block the signal.
  struct sigaction previous {};
  sigaction(SIGPIPE, nullptr, &previous);
  http_ = std::make_unique<httplib::Server>();
  sigaction(SIGPIPE, &previous, nullptr);
  auto& svr = *http_;
  const int threads = opts_.threads, queue = opts_.queue;
  svr.new_task_queue = [this, threads, queue] {
    auto* pool = new Pool(threads, queue, [this] {
      std::lock_guard lock(pool_mu_);
      pool_ = nullptr;
    });
    std::lock_guard lock(pool_mu_);
    pool_ = pool;
    return pool;
  };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second run on the same
  // port would share it silently instead of hearing that it is in use.
  svr.set_socket_options([](int sock) {
    int on = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  });
  const time_t secs = std::max(1, opts_.request_timeout_ms / 1000);
  svr.set_read_timeout(secs, 0);
  svr.set_write_timeout(secs, 0);
  svr.set_keep_alive_max_count(1);  // no keep-alive: an idle browser never holds a thread
  svr.set_keep_alive_timeout(1);
  svr.set_payload_max_length(4096);  // read-only: nothing larger is read before it is refused
  auto reply = [](httplib::Response& res, int status, const std::string& body, const char* type) {
    res.status = status;
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content(body, type);
  };
  auto body_of = [this](std::string Bodies::*field) {
    return [this, field](const httplib::Request&, httplib::Response& res) {
      requests_.fetch_add(1, std::memory_order_relaxed);
      const auto bodies = current();  // a copy of the pointer: the lock is not held while sending
      res.set_header("Cache-Control", "no-store");
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_content(bodies.get()->*field, field == &Bodies::metrics ? "text/plain; version=0.0.4; charset=utf-8"
                                                                         : "application/json");
    };
  };
  svr.Get("/", [this, reply](const httplib::Request&, httplib::Response& res) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    reply(res, 200, live_page_html(), "text/html; charset=utf-8");
  });
  svr.Get("/api/snapshot", body_of(&Bodies::snapshot));
  svr.Get("/api/history", body_of(&Bodies::history));
  svr.Get("/api/events", body_of(&Bodies::events));
  svr.Get("/metrics", body_of(&Bodies::metrics));
  svr.Get(".*", [this, reply](const httplib::Request&, httplib::Response& res) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    reply(res, 404, "404: no such page (try /, /metrics, /api/snapshot, /api/history or /api/events)\n",
          "text/plain; charset=utf-8");
  });
  auto refuse = [this, reply](const httplib::Request&, httplib::Response& res) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    res.set_header("Allow", "GET, HEAD");
    reply(res, 405, "405: this server is read-only (GET and HEAD)\n", "text/plain; charset=utf-8");
  };
  // A request that declares no body (no Content-Length, not chunked) has none (RFC 9112, 6.3),
  // but httplib reads a POST's, PUT's, PATCH's or DELETE's until the client closes or the read
  // times out: such a request is answered before that, at once. One that sends a body (at most
  // payload_max_length) is read whole, then refused by the handlers below.
  svr.set_pre_routing_handler([refuse](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD" || req.has_header("Content-Length") ||
        req.has_header("Transfer-Encoding"))
      return httplib::Server::HandlerResponse::Unhandled;
    refuse(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.Post(".*", refuse);
  svr.Put(".*", refuse);
  svr.Patch(".*", refuse);
  svr.Delete(".*", refuse);
  svr.Options(".*", refuse);
  svr.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    // What httplib refused before any handler (a malformed or oversized request, a body).
    requests_.fetch_add(1, std::memory_order_relaxed);
    if (res.body.empty()) res.set_content("error " + std::to_string(res.status) + "\n", "text/plain; charset=utf-8");
  });

  if (opts_.address.port == 0) {
    port_ = svr.bind_to_any_port(opts_.address.host);
  } else if (svr.bind_to_port(opts_.address.host, opts_.address.port)) {
    port_ = opts_.address.port;
  }
  if (port_ <= 0) {
    std::string why = bind_problem(opts_.address);
    if (why.empty()) why = "the address cannot be bound";
    if (why.find("in use") != std::string::npos)
      why += " (another program, or another run, serves on port " + std::to_string(opts_.address.port) +
             ": choose another port, or 0 for any free one)";
    throw std::runtime_error("cannot serve the live page on " + where + ": " + why);
  }
  {
    auto empty = std::make_shared<Bodies>();
    empty->snapshot = "{\"t\":0,\"finished\":false,\"status\":\"starting\",\"stages\":[],\"queues\":[]}";
    empty->metrics = prometheus_text(Snapshot{});
    empty->history = history_json({}, history_);
    empty->events = "[]";
    std::lock_guard lock(mu_);
    bodies_ = std::move(empty);
  }
  listener_ = std::thread([this] {
    name_this_thread("live-listener");
    block_sigpipe();
    http_->listen_after_bind();
  });
  // stop() only stops a server that runs: wait until it does, so that a server destroyed at once
  // (a run that fails right after) still ends.
  for (int i = 0; i < 5000 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

LiveServer::~LiveServer() {
  {
    std::lock_guard lock(pool_mu_);
    if (pool_) pool_->close();  // an accept waiting for room goes through, and sees the stop
  }
  http_->stop();
  if (listener_.joinable()) listener_.join();  // the pool's threads finish their requests (timeouts bound them)
}

std::string LiveServer::url() const {
  ListenAddress a = opts_.address;
  a.port = port_;
  return "http://" + a.str() + "/";
}

void LiveServer::publish(const Snapshot& s, const std::vector<Event>& events) {
  auto next = std::make_shared<Bodies>();
  next->snapshot = to_json(s);
  next->metrics = prometheus_text(s);
  std::vector<std::string> edges;
  Point p;
  p.t = s.t_s;
  for (const auto& q : s.queues) {
    edges.push_back((q.producers.empty() ? std::string() : q.producers.front()) + "->" + q.consumer);
    p.occupancy.push_back(q.capacity > 0 ? q.window_mean / q.capacity : 0);
  }
  if (!history_.empty() && history_.back().occupancy.size() != p.occupancy.size()) history_.clear();
  history_.push_back(std::move(p));
  while (history_.size() > opts_.history) history_.pop_front();
  next->history = history_json(edges, history_);
  next->events = events_json(events);
  std::lock_guard lock(mu_);
  bodies_ = std::move(next);
}

std::shared_ptr<const LiveServer::Bodies> LiveServer::current() const {
  std::lock_guard lock(mu_);
  return bodies_;
}

}  // namespace pipeline::graph
