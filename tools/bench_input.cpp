// Benchmark of the real input side (a benchmark to run and report, not a test):
//   read_shards -> tokenize x W -> pack -> sink
// on a prepared text dataset (default: the bundled tiny-shakespeare), looping over it, with the
// engine as `pipeline run` uses it. Reports the steady-state rate in MB/s of text and tokens/s
// (after a warm-up), next to one tokenizer thread on the same text (measured again right before
// each trial, since the machine's speed moves), and the ratio to cores x that speed (the input side's goal is to move data at the tokenizer's speed times the
// cores it has). It also reports MB per CPU-second of the whole process against one tokenizer
// thread's: the share of the CPU the input side spends tokenizing, which holds on a loaded
// machine where wall-clock rates do not. And against as many tokenizer threads as cores, run at
// once on nothing else ("together"): what this machine's cores tokenize side by side, which is
// the most the input side could reach if reading, decompressing and packing cost nothing.
//
// With --dataset given more than once (a prepared dataset, Parquet files), the trials alternate
// between them in one run and each gets its median and its ratio to the first: input formats
// compared under the same load.
//
// usage: bench_input [--workers W|auto] [--seconds S] [--warmup S] [--trials N] [--batch B] [--seq T]
//                    [--dataset DIR]... [--chunk-bytes N] [--buffers N] [--set KEY=VALUE]...
// --buffers sets pack's pool ([stages.pack] buffers; default: the stage's own); --set any other
// setting, as `pipeline run --set` does (--set data.order='"documents"' measures the documents
// order, the default being the lanes order: docs/data_order.md).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "datasets/sources/dataset_reader.h"
#include "datasets/parquet/parquet_reader.h"
#include "datasets/tokenizer/tokenizer.h"
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

// One tokenizer thread on the dataset's first `limit` bytes of documents, the reference every
// trial is compared with. The machine's speed moves between runs (a shared host), so it is
// measured again right before each trial, and each trial's ratio is against its own reference.
class TokenizerReference {
 public:
  TokenizerReference(const std::string& dataset, size_t limit) {
    datasets::TextDatasetReader text;
    datasets::ParquetDocumentReader parquet;
    const bool is_parquet = datasets::is_parquet_source(dataset);
    if (is_parquet)
      parquet.open(dataset);
    else
      text.open(dataset, "train");
    for (std::string d; bytes_ < limit && (is_parquet ? parquet.next(d) : text.next(d));) {
      bytes_ += d.size();
      docs_.push_back(d);
    }
  }
  /// MB/s of wall time and MB per CPU-second (the latter holds on a loaded machine): the best of
  /// three passes, after one unmeasured pass (page faults on the vocabulary, cold caches).
  std::pair<double, double> measure() const {
    double best = 0, best_cpu = 0;
    for (int pass = 0; pass < 4; ++pass) {
      auto t0 = Clock::now();
      double c0 = thread_cpu_s();
      tokenize_all();
      if (pass == 0) continue;
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      best = std::max(best, bytes_ / s / 1e6);
      best_cpu = std::max(best_cpu, bytes_ / (thread_cpu_s() - c0) / 1e6);
    }
    return {best, best_cpu};
  }
  /// MB/s of `threads` tokenizer threads at once, each on all the text (the best of three
  /// passes after one unmeasured): what the machine's cores do together, which on a shared host
  /// is not `threads` times one thread (cores that share a physical core or its caches).
  double measure_together(unsigned threads) const {
    double best = 0;
    for (int pass = 0; pass < 4; ++pass) {
      std::vector<std::thread> pool;
      auto t0 = Clock::now();
      for (unsigned k = 0; k < threads; ++k) pool.emplace_back([this] { tokenize_all(); });
      for (auto& t : pool) t.join();
      if (pass == 0) continue;  // new threads: their piece caches start cold, as the first pass of measure()
      best = std::max(best, threads * bytes_ / std::chrono::duration<double>(Clock::now() - t0).count() / 1e6);
    }
    return best;
  }

 private:
  // One pass of one thread over all the documents.
  void tokenize_all() const {
    const auto& tok = datasets::Tokenizer::gpt2();
    std::vector<uint32_t> ids;
    for (const auto& d : docs_) {
      ids.clear();
      tok.encode_ordinary_append(d, ids);
    }
  }

  std::vector<std::string> docs_;
  size_t bytes_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string workers = "auto";
  std::vector<std::string> data_sets;
  std::string chunk = "auto";
  int trials = 3, buffers = 0;
  std::vector<std::string> sets;
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
    else if (a == "--buffers") buffers = std::atoi(next().c_str());
    else if (a == "--set") sets.push_back(next());
    else {
      std::fprintf(stderr,
                   "usage: bench_input [--workers W|auto] [--seconds S] [--warmup S] [--trials N] [--batch B] "
                   "[--seq T] [--dataset DIR]... [--chunk-bytes N|auto] [--buffers N] [--set KEY=VALUE]...\n");
      return 2;
    }
  }
  if (data_sets.empty()) data_sets.push_back(std::string(PIPELINE_SOURCE_DIR) + "/datasets/data/tinyshakespeare/text");
  const unsigned cores = std::thread::hardware_concurrency();
  const TokenizerReference reference(data_sets.front(), 8u << 20);
  std::printf("input side: read_shards -> tokenize x %s -> pack -> sink, B=%lld T=%lld\n", workers.c_str(),
              static_cast<long long>(B), static_cast<long long>(T));
  for (size_t d = 0; d < data_sets.size(); ++d) std::printf("  [%zu] %s\n", d, data_sets[d].c_str());
  std::printf("reference: one tokenizer thread on [0]'s text, measured before each trial; %u cores\n", cores);
  std::printf("%6s %4s %10s %12s %12s %10s %15s %12s %15s %12s %10s\n", "trial", "data", "MB/s", "tokens/s",
              "batches/s", "tok MB/s", "of cores x tok", "MB/CPU-s", "of tok MB/CPU-s", "together", "of it");
  std::vector<std::vector<double>> rates(data_sets.size()), token_rates(data_sets.size()), shares(data_sets.size()),
      cpu_shares(data_sets.size()), together_shares(data_sets.size());
  for (int t = 0; t < trials; ++t)
    for (size_t d = 0; d < data_sets.size(); ++d) {
      const auto [tok, tok_cpu] = reference.measure();
      const double together = reference.measure_together(cores);
      bench_meter::InputSide in;
      in.dataset = data_sets[d];
      in.batch = B;
      in.seq = T;
      in.chunk_bytes = chunk;
      in.pack_buffers = buffers;
      in.sets = sets;
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
      shares[d].push_back(mb / (cores * tok));
      cpu_shares[d].push_back(mb_cpu / tok_cpu);
      together_shares[d].push_back(mb / together);
      std::printf("%6d %4zu %10.1f %12.0f %12.1f %10.1f %14.0f%% %12.1f %14.0f%% %12.1f %9.0f%%\n", t, d, mb, tokens / s,
                  batches / s, tok, 100 * shares[d].back(), mb_cpu, 100 * cpu_shares[d].back(), together,
                  100 * together_shares[d].back());
      std::fflush(stdout);
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (size_t d = 0; d < data_sets.size(); ++d) {
    std::printf("[%zu] median %.1f MB/s, %.0f tokens/s, best %.1f MB/s; median %.0f%% of cores x one tokenizer thread, "
                "%.0f%% of its MB per CPU-second, %.0f%% of %u tokenizer threads at once",
                d, median(rates[d]), median(token_rates[d]), *std::max_element(rates[d].begin(), rates[d].end()),
                100 * median(shares[d]), 100 * median(cpu_shares[d]), 100 * median(together_shares[d]), cores);
    if (d > 0) std::printf("; %.0f%% of [0]'s median", 100 * median(rates[d]) / median(rates[0]));
    std::printf("\n");
  }
  return 0;
}
