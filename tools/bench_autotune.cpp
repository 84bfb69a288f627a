// Benchmark of autotune (a benchmark to run and report, not a test). The real input side with a
// CPU-heavy stage in it,
//   read_shards -> meter -> spin (MS per chunk) -> tokenize -> pack -> sink,
// run three ways on the bundled text:
//   1. hand-tuned: every spin/tokenize worker count in a small grid with roomy queues (64);
//      the best steady-state throughput is the reference;
//   2. mis-sized: spin and tokenize with 1 worker, every capacity 2, autotune off;
//   3. the same mis-sized graph with autotune on ([run] autotune = true).
// Reports each one's steady-state MB/s and tokens/s, how long autotune took to reach 90% of
// the hand-tuned best (the first second whose rate was there and stayed there on average),
// and autotune's log of decisions.
//
// usage: bench_autotune [--spin-ms MS] [--chunk-bytes N] [--seconds S] [--tune-seconds S]
//                       [--batch B] [--seq T] [--dataset DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench_meter.h"

using namespace pipeline;
using bench_meter::g_counters;
using Clock = std::chrono::steady_clock;

namespace {

struct Measured {
  double mb_s = 0, tokens_s = 0;  // over the last `seconds` of the run
  std::vector<double> series;     // MB/s in each second of the run
  bench_meter::RunResult result;
};

// Runs `in` for `seconds` in all, sampling the text rate every second; the steady-state rate is
// that of the last `steady` seconds.
Measured measure(const bench_meter::InputSide& in, double seconds, double steady) {
  Measured m;
  m.result = bench_meter::run_input_side(in, [&](graph::Engine&) {
    const auto t0 = Clock::now();
    uint64_t last_bytes = 0, steady_bytes = 0, steady_tokens = 0;
    for (int s = 1; s <= static_cast<int>(seconds); ++s) {
      std::this_thread::sleep_until(t0 + std::chrono::seconds(s));
      const uint64_t b = g_counters.bytes;
      m.series.push_back((b - last_bytes) / 1e6);
      last_bytes = b;
      if (s == static_cast<int>(seconds - steady)) steady_bytes = b, steady_tokens = g_counters.tokens;
    }
    m.mb_s = (g_counters.bytes - steady_bytes) / steady / 1e6;
    m.tokens_s = (g_counters.tokens - steady_tokens) / steady;
  });
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  bench_meter::InputSide base;
  base.dataset = std::string(PIPELINE_SOURCE_DIR) + "/datasets/data/tinyshakespeare/text";
  base.spin_ms = 3;
  base.chunk_bytes = "2048";
  double seconds = 8, tune_seconds = 60;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--spin-ms") base.spin_ms = std::atof(next().c_str());
    else if (a == "--chunk-bytes") base.chunk_bytes = next();
    else if (a == "--seconds") seconds = std::atof(next().c_str());
    else if (a == "--tune-seconds") tune_seconds = std::atof(next().c_str());
    else if (a == "--batch") base.batch = std::atoll(next().c_str());
    else if (a == "--seq") base.seq = std::atoll(next().c_str());
    else if (a == "--dataset") base.dataset = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_autotune [--spin-ms MS] [--chunk-bytes N] [--seconds S] [--tune-seconds S] "
                   "[--batch B] [--seq T] [--dataset DIR]\n");
      return 2;
    }
  }
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("input side: read_shards -> meter -> spin (%.1f ms per chunk of %s bytes) -> tokenize -> pack -> sink, "
              "B=%lld T=%lld, %u cores\n",
              base.spin_ms, base.chunk_bytes.c_str(), static_cast<long long>(base.batch),
              static_cast<long long>(base.seq), cores);

  // 1. Hand-tuned: the best of a grid.
  double best = 0, best_tokens = 0;
  std::string best_name;
  for (int spin_w : {1, 2, 3, 4}) {
    for (int tok_w : {1, 2}) {
      bench_meter::InputSide in = base;
      in.spin_workers = spin_w;
      in.tokenize_workers = tok_w;
      in.capacity = 64;
      Measured m = measure(in, seconds, seconds / 2);
      std::printf("hand-tuned candidate: spin x%d, tokenize x%d, capacity 64: %.3f MB/s, %.0f tokens/s\n", spin_w,
                  tok_w, m.mb_s, m.tokens_s);
      if (m.mb_s > best) best = m.mb_s, best_tokens = m.tokens_s, best_name = "spin x" + std::to_string(spin_w) +
                                                                           ", tokenize x" + std::to_string(tok_w);
    }
  }
  std::printf("hand-tuned best: %s: %.3f MB/s, %.0f tokens/s\n\n", best_name.c_str(), best, best_tokens);

  // 2. and 3. Mis-sized, without and with autotune.
  bench_meter::InputSide mis = base;
  mis.spin_workers = 1;
  mis.tokenize_workers = 1;
  mis.capacity = 2;
  Measured off = measure(mis, seconds, seconds / 2);
  std::printf("mis-sized (spin x1, tokenize x1, capacity 2), autotune off: %.3f MB/s, %.0f tokens/s (%.0f%% of best)\n",
              off.mb_s, off.tokens_s, 100 * off.mb_s / best);
  mis.autotune = true;
  Measured on = measure(mis, tune_seconds, 10);
  std::printf("mis-sized, autotune on: %.3f MB/s, %.0f tokens/s over the last 10 s (%.0f%% of best)\n", on.mb_s,
              on.tokens_s, 100 * on.mb_s / best);
  // The first second from which the rate averaged over the rest of the run (at most 10 s) is at
  // least 90% of the best.
  int reached = -1;
  for (size_t s = 0; s < on.series.size() && reached < 0; ++s) {
    size_t end = std::min(on.series.size(), s + 10);
    double sum = 0;
    for (size_t k = s; k < end; ++k) sum += on.series[k];
    if (end > s && sum / static_cast<double>(end - s) >= 0.9 * best && on.series[s] >= 0.9 * best)
      reached = static_cast<int>(s);
  }
  std::printf("MB/s per second with autotune:");
  for (double r : on.series) std::printf(" %.2f", r);
  std::printf("\n");
  if (reached >= 0)
    std::printf("autotune reached 90%% of the hand-tuned best after %d s\n", reached + 1);
  else
    std::printf("autotune did not reach 90%% of the hand-tuned best within %.0f s\n", tune_seconds);
  std::printf("\nautotune log:\n");
  for (const auto& e : on.result.events) std::printf("  %6.1f s  %s: %s\n", e.t_s, e.kind.c_str(), e.text.c_str());
  std::printf("final workers:");
  for (const auto& st : on.result.final.stages) std::printf(" %s x%d", st.name.c_str(), st.workers);
  std::printf("\nfinal capacities:");
  for (const auto& q : on.result.final.queues)
    std::printf(" %s<-%s %d", q.consumer.c_str(), q.producers.front().c_str(), q.capacity);
  std::printf("\n");
  return 0;
}
