// See live_server.h.
#include "runner/live_server.h"

#include <iostream>

#include "runner/rank_stats.h"

namespace pipeline::stages {

std::unique_ptr<graph::LiveServer> start_live_server(const RunContext& ctx, const std::string& serve) {
  const std::string& where = serve.empty() ? ctx.cfg.logging.http : serve;
  if (where.empty() || !ctx.writer()) return nullptr;
  graph::LiveServerOptions opts;
  try {
    opts.address = graph::parse_listen_address(where);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string(serve.empty() ? "[logging] http" : "--serve") + ": " + e.what());
  }
  if (!opts.address.loopback())
    std::cout << "warning: the live server listens on " << opts.address.str()
              << ", so other machines may read this run's statistics (read-only, without authentication); "
                 "--serve PORT alone keeps it on 127.0.0.1\n";
  auto server = std::make_unique<graph::LiveServer>(opts);
  std::cout << "live page: " << server->url() << " (Prometheus metrics: " << server->url() << "metrics)\n";
  std::cout.flush();
  return server;
}

void feed_live_server(graph::LiveServer& server, graph::Engine& engine, std::optional<RankSession>& rank) {
  server.publish(engine.snapshot(), {});
  engine.add_observer([&server, &engine, &rank](const graph::Snapshot& s) {
    if (!rank) {
      server.publish(s, engine.events());
      return;
    }
    graph::Snapshot merged = rank->merged_now(s);
    merged.verdict = analyze_ranks(merged);
    server.publish(merged, engine.events());
  });
}

}  // namespace pipeline::stages
