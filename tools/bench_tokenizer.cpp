// Tokenizer throughput: MB/s of GPT-2 encode_ordinary for 1 and N threads sharing one
// vocabulary, on the reference texts (or files given on the command line).
//
// usage: bench_tokenizer [--threads 1,2,8] [--min-seconds 1.0] [--trials 3] [FILE...]
// Each thread encodes the whole text over and over; MB/s = bytes encoded by all threads / wall
// time, the best of --trials runs of at least --min-seconds each (the machine is shared, so
// the best run is the one least disturbed). "MB/cpu-s" divides by the CPU time the encoding
// threads actually got instead, which stays meaningful when other work competes for the cores.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "datasets/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using pipeline::datasets::Tokenizer;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Timing {
  double wall = 0;  // seconds
  double cpu = 0;   // CPU seconds, summed over the encoding threads
};

// `threads` threads each encoding `text` `reps` times.
Timing run_once(const Tokenizer& tok, const std::string& text, unsigned threads, unsigned reps, size_t& tokens) {
  std::atomic<size_t> total{0};
  std::atomic<int64_t> cpu_ns{0};
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::vector<uint32_t> ids;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const double c0 = thread_cpu_seconds();
      size_t n = 0;
      for (unsigned r = 0; r < reps; ++r) {
        ids.clear();
        tok.encode_ordinary_append(text, ids);
        n += ids.size();
      }
      cpu_ns.fetch_add(static_cast<int64_t>((thread_cpu_seconds() - c0) * 1e9));
      total.fetch_add(n);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  Timing t;
  t.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  t.cpu = static_cast<double>(cpu_ns.load()) * 1e-9;
  tokens = total.load() / (size_t{threads} * reps);
  return t;
}

std::vector<unsigned> parse_threads(const std::string& s) {
  std::vector<unsigned> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const int v = std::atoi(s.substr(pos, comma - pos).c_str());
    if (v <= 0) throw std::invalid_argument("--threads expects a comma-separated list of positive counts, got '" + s + "'");
    out.push_back(static_cast<unsigned>(v));
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::vector<unsigned> thread_counts{1, 2, hw};
  double min_seconds = 1.0;
  int trials = 3;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      thread_counts = parse_threads(argv[++i]);
    } else if (a == "--min-seconds" && i + 1 < argc) {
      min_seconds = std::atof(argv[++i]);
    } else if (a == "--trials" && i + 1 < argc) {
      trials = std::max(1, std::atoi(argv[++i]));
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: bench_tokenizer [--threads 1,2,8] [--min-seconds 1.0] [--trials 3] [FILE...]");
      return 0;
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    files = {PIPELINE_REFERENCE_DATA_DIR "/tinyshakespeare.txt", PIPELINE_REFERENCE_DATA_DIR "/edge_cases.txt"};
  }
  std::sort(thread_counts.begin(), thread_counts.end());
  thread_counts.erase(std::unique(thread_counts.begin(), thread_counts.end()), thread_counts.end());

  const auto t_load = Clock::now();
  const Tokenizer& tok = Tokenizer::gpt2();
  const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_load).count();
  std::printf("GPT-2 vocabulary opened in %.2f ms; hardware threads: %u\n\n", load_ms, hw);
  std::printf("%-22s %10s %8s %10s %10s %9s %10s\n", "file", "bytes", "threads", "tokens", "MB/s", "speedup",
              "MB/cpu-s");

  for (const auto& path : files) {
    const std::string text = read_file(path);
    const std::string name = path.substr(path.find_last_of('/') + 1);
    // Calibrate repetitions so one single-threaded run lasts about min_seconds.
    size_t tokens = 0;
    const double one = run_once(tok, text, 1, 1, tokens).wall;
    const unsigned reps = std::max(1u, static_cast<unsigned>(min_seconds / std::max(one, 1e-6)));
    double base = 0;
    for (unsigned threads : thread_counts) {
      Timing best{1e300, 1e300};
      for (int t = 0; t < trials; ++t) {
        const Timing r = run_once(tok, text, threads, reps, tokens);
        best.wall = std::min(best.wall, r.wall);
        best.cpu = std::min(best.cpu, r.cpu);
      }
      const double bytes = static_cast<double>(text.size()) * reps * threads;
      const double mbps = bytes / best.wall / 1e6;
      if (threads == thread_counts.front()) base = mbps / threads;
      std::printf("%-22s %10zu %8u %10zu %10.1f %8.2fx %10.1f\n", name.c_str(), text.size(), threads, tokens, mbps,
                  mbps / base, bytes / best.cpu / 1e6);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
  return 1;
}
