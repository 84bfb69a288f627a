// Benchmark of the real input side (a benchmark to run and report, not a test):
//   read_shards -> tokenize x W -> pack -> sink
// on a prepared text dataset (default: the bundled tiny-shakespeare), looping over it, with the
// engine as `pipeline run` uses it. Reports the steady-state rate in MB/s of text and tokens/s
// (after a warm-up), next to one tokenizer thread on the same text, and the ratio to
// cores x that speed (the input side's goal is to move data at the tokenizer's speed times the
// cores it has). It also reports MB per CPU-second of the whole process against one tokenizer
// thread's: the share of the CPU the input side spends tokenizing, which holds on a loaded
// machine where wall-clock rates do not.
//
// With --dataset given more than once (a prepared dataset, Parquet files), the trials alternate
// between them in one run and each gets its median and its ratio to the first: input formats
// compared under the same load.
//
// usage: bench_input [--workers W|auto] [--seconds S] [--warmup S] [--trials N] [--batch B] [--seq T]
//                    [--dataset DIR]... [--chunk-bytes N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "datasets/dataset_reader.h"
#include "datasets/parquet_reader.h"
#include "datasets/tokenizer.h"
#include "tools/bench_meter.h"

using namespace pipeline;
using bench_meter::g_counters;
using bench_meter::process_cpu_s;
using Clock = std::chrono::steady_clock;

namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// One tokenizer thread on the dataset's first `limit` bytes of documents: MB/s of wall time
// and MB per CPU-second (the latter holds on a loaded machine).
std::pair<double, double> tokenizer_mb_s(const std::string& dataset, size_t limit) {
  datasets::TextDatasetReader text;
  datasets::ParquetDocumentReader parquet;
  const bool is_parquet = datasets::is_parquet_source(dataset);
  if (is_parquet)
    parquet.open(dataset);
  else
    text.open(dataset, "train");
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (std::string d; bytes < limit && (is_parquet ? parquet.next(d) : text.next(d));) {
    bytes += d.size();
    docs.push_back(d);
  }
  const auto& tok = datasets::Tokenizer::gpt2();
  std::vector<uint32_t> ids;
  double best = 0, best_cpu = 0;
  for (int trial = 0; trial < 3; ++trial) {
    auto t0 = Clock::now();
    double c0 = thread_cpu_s();
    for (const auto& d : docs) {
      ids.clear();
      tok.encode_ordinary_append(d, ids);
    }
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, bytes / s / 1e6);
    best_cpu = std::max(best_cpu, bytes / (thread_cpu_s() - c0) / 1e6);
  }
  return {best, best_cpu};
}

}  // namespace

int main(int argc, char** argv) {
  std::string workers = "auto";
  std::vector<std::string> data_sets;
  std::string chunk = "auto";
  int trials = 3;
  double seconds = 5, warmup_s = 1;
  int64_t B = 16, T = 1024;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--workers") workers = next();
    else if (a == "--seconds") seconds = std::atof(next().c_str());
    else if (a == "--warmup") warmup_s = std::atof(next().c_str());
    else if (a == "--trials") trials = std::atoi(next().c_str());
    else if (a == "--batch") B = std::atoll(next().c_str());
    else if (a == "--seq") T = std::atoll(next().c_str());
    else if (a == "--dataset") data_sets.push_back(next());
    else if (a == "--chunk-bytes") chunk = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_input [--workers W|auto] [--seconds S] [--warmup S] [--trials N] [--batch B] "
                   "[--seq T] [--dataset DIR]... [--chunk-bytes N|auto]\n");
      return 2;
    }
  }
  if (data_sets.empty()) data_sets.push_back(std::string(PIPELINE_SOURCE_DIR) + "/datasets/data/tinyshakespeare/text");
  const unsigned cores = std::thread::hardware_concurrency();
  auto [tok, tok_cpu] = tokenizer_mb_s(data_sets.front(), 8u << 20);
  std::printf("input side: read_shards -> tokenize x %s -> pack -> sink, B=%lld T=%lld\n", workers.c_str(),
              static_cast<long long>(B), static_cast<long long>(T));
  for (size_t d = 0; d < data_sets.size(); ++d) std::printf("  [%zu] %s\n", d, data_sets[d].c_str());
  std::printf("one tokenizer thread on this text: %.1f MB/s (%.1f MB per CPU-second); %u cores: goal >= 60%% of "
              "%.1f = %.1f MB/s\n",
              tok, tok_cpu, cores, cores * tok, 0.6 * cores * tok);
  std::printf("%6s %4s %10s %12s %12s %15s %12s %15s\n", "trial", "data", "MB/s", "tokens/s", "batches/s",
              "of cores x tok", "MB/CPU-s", "of tok MB/CPU-s");
  std::vector<std::vector<double>> rates(data_sets.size()), token_rates(data_sets.size());
  for (int t = 0; t < trials; ++t)
    for (size_t d = 0; d < data_sets.size(); ++d) {
      bench_meter::InputSide in;
      in.dataset = data_sets[d];
      in.batch = B;
      in.seq = T;
      in.chunk_bytes = chunk;
      in.tokenize_workers = workers == "auto" ? 0 : std::atoi(workers.c_str());
      double s = 0, cpu = 0;
      uint64_t bytes = 0, tokens = 0, batches = 0;
      bench_meter::run_input_side(in, [&](graph::Engine&) {
        std::this_thread::sleep_for(std::chrono::duration<double>(warmup_s));
        const uint64_t b0 = g_counters.bytes, k0 = g_counters.tokens, n0 = g_counters.batches;
        const double c0 = process_cpu_s();
        const auto t0 = Clock::now();
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        s = std::chrono::duration<double>(Clock::now() - t0).count();
        cpu = process_cpu_s() - c0;
        bytes = g_counters.bytes - b0, tokens = g_counters.tokens - k0, batches = g_counters.batches - n0;
      });
      double mb = bytes / s / 1e6;
      rates[d].push_back(mb);
      token_rates[d].push_back(tokens / s);
      double mb_cpu = bytes / cpu / 1e6;
      std::printf("%6d %4zu %10.1f %12.0f %12.1f %14.0f%% %12.1f %14.0f%%\n", t, d, mb, tokens / s, batches / s,
                  100 * mb / (cores * tok), mb_cpu, 100 * mb_cpu / tok_cpu);
      std::fflush(stdout);
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (size_t d = 0; d < data_sets.size(); ++d) {
    std::printf("[%zu] median %.1f MB/s, %.0f tokens/s, best %.1f MB/s", d, median(rates[d]), median(token_rates[d]),
                *std::max_element(rates[d].begin(), rates[d].end()));
    if (d > 0) std::printf("; %.0f%% of [0]'s median", 100 * median(rates[d]) / median(rates[0]));
    std::printf("\n");
  }
  return 0;
}
