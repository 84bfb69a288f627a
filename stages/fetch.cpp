// The fetch stage (catalog.cpp declares it): the remote stores' fetching, seen as a stage. The
// work itself is the stores' (datasets/io/fetcher.h: threads of their own, blocking on the
// network, never on a TBB worker); this stage sums what every store of the run has done
// (RunContext::remote_stores) into the engine's figures: its connections' busy share, units
// fetched, and bytes/s, requests in flight, retries, cache bytes and hit rate, which the stats,
// the verdict ("fetch: ... 41.2 MB/s from s3://...") and the live views show.
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>

#include "graph/stage.h"
#include "stages/types.h"

namespace pipeline::stages {
namespace {

class Fetch : public graph::Stage {
 public:
  explicit Fetch(const graph::StageContext& ctx)
      : rc_(run_context(ctx)),
        name_(ctx.name),
        connections_(static_cast<int>(ctx.options.get_int("connections"))),
        prefetch_(ctx.options.get_int("prefetch")) {}

  graph::SideReport side_report() override {
    const datasets::io::FetchStats f = rc_.remote_stores->total();
    graph::SideReport r;
    r.workers = connections_;
    // From the first report on: what the stores did before the run began (the catalogue's reads)
    // is not the run's.
    if (busy_base_ < 0) busy_base_ = f.busy_s;
    r.busy_s = f.busy_s - busy_base_;
    r.items = f.units;
    const double rate = bytes_per_s(f.bytes);
    const double read = static_cast<double>(f.hit_bytes + f.miss_bytes);
    r.figures = {{"bytes_per_s", rate},
                 {"in_flight", static_cast<double>(f.in_flight)},
                 {"retries", static_cast<double>(f.retries)},
                 {"cache_bytes", static_cast<double>(f.cache_bytes)},
                 {"hit_rate", read > 0 ? static_cast<double>(f.hit_bytes) / read : 0.0},
                 {"reader_wait_s", f.wait_s}};
    std::string sources;
    for (const auto& s : rc_.remote_stores->sources()) sources += (sources.empty() ? "" : ", ") + s;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f MB/s", rate / 1e6);
    r.note = std::string(buf) + (sources.empty() ? "" : " from " + sources);
    const int connections = f.connections > 0 ? f.connections : connections_;
    const int prefetch = f.prefetch > 0 ? f.prefetch : static_cast<int>(prefetch_);
    r.workers = connections;
    r.knobs = {{"connections", connections}, {"prefetch", prefetch}};
    r.suggestion = "the network is the limit: more connections ([stages." + name_ + "] connections = " +
                   std::to_string(2 * connections) + "), a deeper prefetch (prefetch = " + std::to_string(2 * prefetch) +
                   ", with cache_bytes to hold it), or an endpoint nearer this machine";
    return r;
  }

  void side_tune(const std::string& knob, int value) override {
    if (knob == "connections") rc_.remote_stores->set_fetch_limits(value, 0);
    if (knob == "prefetch") rc_.remote_stores->set_fetch_limits(0, value);
  }

 private:
  // Over the last few seconds: a rate that follows the network, not the run's average.
  double bytes_per_s(uint64_t bytes) {
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    std::lock_guard<std::mutex> l(mu_);
    samples_.emplace_back(now, bytes);
    while (samples_.size() > 2 && samples_.front().first < now - 3.0) samples_.pop_front();
    const auto& [t0, b0] = samples_.front();
    return now - t0 > 0.05 ? static_cast<double>(bytes - b0) / (now - t0) : 0.0;
  }

  RunContext& rc_;
  std::string name_;
  int connections_;
  int64_t prefetch_;
  double busy_base_ = -1;
  std::mutex mu_;
  std::deque<std::pair<double, uint64_t>> samples_;
};

}  // namespace

PIPELINE_STAGE_IMPL(fetch, {.name = "fetch", .factory = graph::make_factory<Fetch>()});

}  // namespace pipeline::stages
