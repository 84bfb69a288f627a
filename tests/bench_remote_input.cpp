// Benchmark of our input side reading from S3 (a program to run and report, not a test; run by
// tools/bench_remote.sh, which makes the files and runs the Python reference beside it). It lives
// in tests/ for the servers and the fault proxy of remote_servers.h.
//
// Over Parquet files under ROOT/BUCKET, served by `rclone serve s3` on loopback: the lanes of one
// rank (datasets/lanes) read through the S3 store with its fetch threads ahead, a reader thread
// hands their documents to W tokenizer threads, and a stand-in for training takes B x T tokens a
// step. Two modes, each a fresh cache:
//   full       the server at full speed, training as fast as the tokens come: tokens/s, and the
//              time to the first batch (catalogue, footers and first units included)
//   throttled  the proxy holds the server to 1.5x the bytes training consumes (training paced at
//              --train-tokens-per-s), with the cache capped at --cache-units units: the share of
//              steps on which training waited for input, and the cache's high water against its cap
//
// usage: bench_remote_input ROOT BUCKET [--lanes K] [--workers W] [--batch B] [--seq T]
//                           [--seconds S] [--trials N] [--train-tokens-per-s R] [--cache-units N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "datasets/io/store.h"
#include "datasets/lanes/data_order.h"
#include "datasets/lanes/document_lanes.h"
#include "datasets/lanes/fetch_plan.h"
#include "datasets/plan/data_plan.h"
#include "datasets/tokenizer/tokenizer.h"
#include "remote_servers.h"
#include "test_util.h"

using namespace pipeline::datasets;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct Options {
  fs::path root;
  std::string bucket;
  uint32_t lanes = 8;
  int workers = 2;
  int batch = 8, seq = 1024;
  double seconds = 20;
  int trials = 3;
  double train_tokens_per_s = 0;  // throttled mode's training pace (0: measured from full speed, x 0.8)
  int cache_units = 2;
};

struct Result {
  double tokens_per_s = 0;
  double first_batch_s = 0;
  double waited_share = 0;  // steps on which training found no batch ready
  uint64_t steps = 0;
  uint64_t cache_high_water = 0, cache_cap = 0, unit_max = 0;
  double bytes_per_token = 0;
};

const std::string kKey = "BENCHKEY", kSecret = "BENCHsecret0123";

// One run of the input side over the bucket for `seconds`, through `endpoint`.
Result run(const Options& o, const std::string& endpoint, double train_tokens_per_s, uint64_t cache_bytes, int prefetch) {
  test_util::TempDir cache("bench_remote_cache");
  io::StoreOptions store;
  store.endpoint = endpoint;
  store.allow_http = true;
  store.cache_dir = cache.path;
  store.cache_bytes = cache_bytes;
  store.prefetch = prefetch;
  store.connections = 8;
  store.env = test_util::env_of({{"HOME", cache.path.string()}, {"AWS_ACCESS_KEY_ID", kKey},
                                 {"AWS_SECRET_ACCESS_KEY", kSecret}});
  const auto t0 = Clock::now();
  DataOrderOptions oo;
  oo.lanes = o.lanes;
  oo.seed = 1337;
  oo.store = store;
  DataOrder order = open_data_order({{"s3://" + o.bucket}}, oo);
  const auto cursors = start_cursors(order, lanes_of(0, 1, o.lanes));
  fetch_ahead(order, cursors);
  DocumentLanes lanes(order, cursors);
  Result r;
  for (const Unit& u : order.sources[0].catalog->units) r.unit_max = std::max(r.unit_max, u.bytes);

  // reader -> tokenizers -> "pack" (a count of tokens) -> training, each through a bounded queue.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> docs;
  const size_t max_docs = 256;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> tokens{0}, text_bytes{0};
  const uint64_t batch_tokens = static_cast<uint64_t>(o.batch) * o.seq;
  std::thread reader([&] {
    size_t i = 0;
    while (!stop) {
      std::string_view doc;
      LanePlace place;
      if (!lanes.next(i, doc, place)) break;
      i = (i + 1) % lanes.size();
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return docs.size() < max_docs || stop; });
      docs.emplace_back(doc);
      cv.notify_all();
    }
  });
  std::vector<std::thread> tokenizers;
  for (int w = 0; w < o.workers; ++w)
    tokenizers.emplace_back([&] {
      const Tokenizer& tok = Tokenizer::gpt2();
      std::vector<uint32_t> ids;
      while (true) {
        std::string doc;
        {
          std::unique_lock<std::mutex> l(mu);
          cv.wait(l, [&] { return !docs.empty() || stop; });
          if (stop) return;
          doc = std::move(docs.front());
          docs.pop_front();
          cv.notify_all();
        }
        ids.clear();
        tok.encode_ordinary_append(doc, ids);
        tokens.fetch_add(ids.size() + 1, std::memory_order_relaxed);
        text_bytes.fetch_add(doc.size(), std::memory_order_relaxed);
      }
    });
  // Training: takes a batch of tokens when there is one, then spends B*T / pace on it.
  uint64_t taken = 0, waited = 0, steps = 0;
  double warm_at = -1, warm_tokens = 0;
  const double warmup_s = 3;
  const auto end = t0 + std::chrono::duration<double>(o.seconds);
  bool first = true;
  while (Clock::now() < end) {
    const auto want = Clock::now();
    bool was_waiting = false;
    while (tokens.load(std::memory_order_relaxed) < taken + batch_tokens && Clock::now() < end) {
      was_waiting = true;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (tokens.load() < taken + batch_tokens) break;
    taken += batch_tokens;
    const double at = std::chrono::duration<double>(Clock::now() - t0).count();
    if (first) {
      r.first_batch_s = at;
      first = false;
    } else if (at > r.first_batch_s + warmup_s) {
      if (warm_at < 0) {
        warm_at = at;
        warm_tokens = static_cast<double>(taken);
      } else {
        ++steps;
        waited += was_waiting && std::chrono::duration<double>(Clock::now() - want).count() > 1e-3;
      }
    }
    if (train_tokens_per_s > 0)
      std::this_thread::sleep_until(want + std::chrono::duration<double>(static_cast<double>(batch_tokens) / train_tokens_per_s));
  }
  const double now = std::chrono::duration<double>(Clock::now() - t0).count();
  if (warm_at > 0 && now > warm_at) r.tokens_per_s = (static_cast<double>(taken) - warm_tokens) / (now - warm_at);
  r.steps = steps;
  r.waited_share = steps ? static_cast<double>(waited) / static_cast<double>(steps) : 0;
  const io::FetchStats f = order.sources[0].store->fetch_stats();
  r.cache_high_water = f.cache_high_water;
  r.cache_cap = f.cache_cap;
  r.bytes_per_token = tokens.load() ? static_cast<double>(f.bytes) / static_cast<double>(tokens.load()) : 0;
  stop = true;
  cv.notify_all();
  reader.join();
  for (auto& t : tokenizers) t.join();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int bench_main(int argc, char** argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: bench_remote_input ROOT BUCKET [--lanes K] [--workers W] [--batch B] [--seq T] "
                         "[--seconds S] [--trials N] [--train-tokens-per-s R] [--cache-units N]\n");
    return 2;
  }
  o.root = args[0];
  o.bucket = args[1];
  for (size_t i = 2; i + 1 < args.size(); i += 2) {
    const std::string& k = args[i];
    const char* v = args[i + 1].c_str();
    if (k == "--lanes") o.lanes = static_cast<uint32_t>(std::atoi(v));
    else if (k == "--workers") o.workers = std::atoi(v);
    else if (k == "--batch") o.batch = std::atoi(v);
    else if (k == "--seq") o.seq = std::atoi(v);
    else if (k == "--seconds") o.seconds = std::atof(v);
    else if (k == "--trials") o.trials = std::atoi(v);
    else if (k == "--train-tokens-per-s") o.train_tokens_per_s = std::atof(v);
    else if (k == "--cache-units") o.cache_units = std::atoi(v);
    else {
      std::fprintf(stderr, "bench_remote_input: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  test_util::TempDir logs("bench_remote");
  remote_test::RcloneS3 server(o.root, logs.path / "rclone.log", kKey, kSecret);
  if (!server.missing.empty()) {
    std::printf("skipped: %s\n", server.missing.c_str());
    return 77;
  }
  std::vector<double> full_rate, first;
  Result last;
  for (int t = 0; t < o.trials; ++t) {
    last = run(o, server.endpoint(), 0, uint64_t(1) << 40, 64);
    full_rate.push_back(last.tokens_per_s);
    first.push_back(last.first_batch_s);
    std::printf("full speed, trial %d: %.0f tokens/s, first batch after %.2f s\n", t + 1, last.tokens_per_s,
                last.first_batch_s);
    std::fflush(stdout);
  }
  const double pace = o.train_tokens_per_s > 0 ? o.train_tokens_per_s : 0.8 * median(full_rate);
  const double consumption = pace * last.bytes_per_token;  // bytes/s of the files training consumes
  remote_test::FaultProxy proxy(server.port);
  proxy.throttle_bps = static_cast<uint64_t>(1.5 * consumption);
  std::vector<double> waited;
  uint64_t high = 0, cap = 0, unit = 0;
  for (int t = 0; t < o.trials; ++t) {
    const uint64_t cap_bytes = static_cast<uint64_t>(o.cache_units) * std::max<uint64_t>(last.unit_max, 1);
    Result r = run(o, "http://127.0.0.1:" + std::to_string(proxy.port()), pace, cap_bytes, o.cache_units);
    waited.push_back(r.waited_share);
    high = std::max(high, r.cache_high_water);
    cap = r.cache_cap;
    unit = r.unit_max;
    std::printf("throttled to %.2f MB/s (1.5x training's %.2f MB/s at %.0f tokens/s), cache %d units, trial %d: training "
                "waited on %.1f%% of %llu steps; cache high water %llu B (cap %llu B, one unit %llu B)\n",
                1.5 * consumption / 1e6, consumption / 1e6, pace, o.cache_units, t + 1, 100 * r.waited_share,
                static_cast<unsigned long long>(r.steps), static_cast<unsigned long long>(r.cache_high_water),
                static_cast<unsigned long long>(r.cache_cap), static_cast<unsigned long long>(r.unit_max));
    std::fflush(stdout);
  }
  std::printf("ours: median %.0f tokens/s at full speed, first batch after %.2f s (median of %d); throttled: training "
              "waited on %.1f%% of steps (median), cache high water %llu B of cap %llu + one unit %llu B\n",
              median(full_rate), median(first), o.trials, 100 * median(waited), static_cast<unsigned long long>(high),
              static_cast<unsigned long long>(cap), static_cast<unsigned long long>(unit));
  return 0;
}

int main(int argc, char** argv) {
  try {
    return bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_remote_input: %s\n", e.what());
    return 1;
  }
}
