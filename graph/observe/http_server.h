// The live server of a running graph (`pipeline run --serve PORT`, `[logging] http`): a small
// read-only HTTP server (cpp-httplib) that serves
//   /              the live page (graph/observe/live_page.h): the stage graph, redrawn each second;
//   /api/snapshot  the latest stats snapshot as JSON, the schema of a stats.jsonl line;
//   /api/history   each edge's occupancy over the last minutes, for the page's sparklines;
//   /api/events    the verdict changes and autotune decisions so far;
//   /metrics       the snapshot in Prometheus' text format (graph/observe/prometheus.h).
//
// It never slows the graph: the monitor thread hands it each report (publish), which is turned
// into finished response bodies off any lock and swapped in under a short one; requests are
// answered from those bodies on the server's own threads. Its threads, its queue of accepted
// connections and the time a request may take are all bounded, so a slow or vanished client
// costs one of its threads while it sends (each read and write waits at most the request
// timeout), and never the run. Only GET and HEAD are answered; any other method gets 405, an
// unknown path 404, a malformed or oversized request head 400 or 414.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graph/observe/listen_address.h"
#include "graph/observe/stats.h"

namespace httplib {
class Server;
}

namespace pipeline::graph {


struct LiveServerOptions {
  ListenAddress address;
  int threads = 2;                // requests served at once
  int queue = 16;                 // accepted connections waiting for a thread (more wait in the kernel)
  int request_timeout_ms = 5000;  // the longest one read or write of a request may wait (whole seconds)
  size_t history = 300;           // reports kept for the sparklines (5 minutes at one a second)
};

class LiveServer {
 public:
  /// Binds and starts serving (before the run starts, so that a port in use is an error then):
  /// throws std::runtime_error naming the address and the reason.
  explicit LiveServer(LiveServerOptions opts);
  ~LiveServer();
  LiveServer(const LiveServer&) = delete;
  LiveServer& operator=(const LiveServer&) = delete;

  /// The port it listens on (the one the system chose for port 0).
  int port() const { return port_; }
  /// "http://127.0.0.1:PORT/".
  std::string url() const;

  /// A new report: the snapshot (with its verdict and train figures) and every event so far.
  /// Cheap for the caller's thread only in the sense that it never waits for a client: the
  /// bodies are built here, and swapped in under a lock held for a pointer copy.
  void publish(const Snapshot& s, const std::vector<Event>& events);

  /// Requests answered so far (any status), for tests.
  uint64_t requests() const { return requests_.load(); }

  struct Bodies;  // the response bodies of one report (immutable once published)

 private:
  class Pool;
  std::shared_ptr<const Bodies> current() const;

  LiveServerOptions opts_;
  std::unique_ptr<httplib::Server> http_;
  std::mutex pool_mu_;
  Pool* pool_ = nullptr;  // owned by http_ while it listens; null once it is gone
  std::thread listener_;
  int port_ = 0;
  std::atomic<uint64_t> requests_{0};
  // The history of edge occupancy, appended by publish() (one thread).
  struct Point {
    double t = 0;
    std::vector<double> occupancy;  // window mean / capacity, per edge
  };
  std::deque<Point> history_;
  mutable std::mutex mu_;  // guards bodies_ only
  std::shared_ptr<const Bodies> bodies_;
};

}  // namespace pipeline::graph
