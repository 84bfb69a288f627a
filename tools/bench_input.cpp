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
// usage: bench_input [--workers W|auto] [--seconds S] [--warmup S] [--trials N] [--batch B] [--seq T]
//                    [--dataset DIR] [--chunk-bytes N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <time.h>

#include "datasets/dataset_reader.h"
#include "datasets/tokenizer.h"
#include "graph/engine.h"
#include "stages/run_setup.h"
#include "stages/types.h"

using namespace pipeline;
using Clock = std::chrono::steady_clock;

namespace {

struct Meter {
  std::atomic<uint64_t> bytes{0}, documents{0}, batches{0}, tokens{0};
  std::atomic<int64_t> t_start_ns{0};  // when the measured window began (after the warm-up)
  uint64_t bytes0 = 0, tokens0 = 0, batches0 = 0;
  double warmup_s = 1, seconds = 5;
  Clock::time_point t0;
  std::atomic<bool> measuring{false}, done{false};
  Clock::time_point t_begin, t_end;
  double cpu_begin = 0, cpu_end = 0;  // process CPU seconds at the window's ends
};

double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}
Meter g_meter;

// Counts the text that goes by (between read_shards and tokenize: one chunk per message).
class TextMeter : public graph::Stage {
 public:
  explicit TextMeter(const graph::StageContext&) {}
  void process(graph::Item in, graph::Emitter& out) override {
    const auto& c = in.get<stages::TextChunk>();
    g_meter.bytes.fetch_add(c.text.size(), std::memory_order_relaxed);
    g_meter.documents.fetch_add(c.documents(), std::memory_order_relaxed);
    out.emit_item(std::move(in));
  }
};
PIPELINE_STAGE(bench_text_meter, {.name = "bench_text_meter", .doc = "counts text bytes (bench_input)",
                                  .input = graph::port<stages::TextChunk>("documents"),
                                  .output = graph::port<stages::TextChunk>("documents"), .max_workers = 1,
                                  .factory = graph::make_factory<TextMeter>()});

// Counts batches; opens the measured window after the warm-up and ends the run after it.
class BatchMeter : public graph::Stage {
 public:
  explicit BatchMeter(const graph::StageContext&) : rc_(stages::require_run_context("sink")) {}
  void process(graph::Item in, graph::Emitter&) override {
    const auto& b = in.get<stages::Batch>();
    g_meter.batches.fetch_add(1, std::memory_order_relaxed);
    g_meter.tokens.fetch_add(static_cast<uint64_t>(b.B * b.T), std::memory_order_relaxed);  // x's tokens
    double t = std::chrono::duration<double>(Clock::now() - g_meter.t0).count();
    if (!g_meter.measuring && t >= g_meter.warmup_s) {
      g_meter.measuring = true;
      g_meter.t_begin = Clock::now();
      g_meter.cpu_begin = process_cpu_s();
      g_meter.bytes0 = g_meter.bytes.load();
      g_meter.tokens0 = g_meter.tokens.load();
      g_meter.batches0 = g_meter.batches.load();
    } else if (g_meter.measuring && !g_meter.done && t >= g_meter.warmup_s + g_meter.seconds) {
      g_meter.done = true;
      g_meter.t_end = Clock::now();
      g_meter.cpu_end = process_cpu_s();
      g_meter.bytes0 = g_meter.bytes.load() - g_meter.bytes0;
      g_meter.tokens0 = g_meter.tokens.load() - g_meter.tokens0;
      g_meter.batches0 = g_meter.batches.load() - g_meter.batches0;
      rc_.input_done.store(true);  // the source stops; what is in flight drains
    }
  }

 private:
  stages::RunContext& rc_;
};
PIPELINE_STAGE(bench_batch_meter, {.name = "bench_batch_meter", .doc = "counts batches (bench_input)",
                                   .input = graph::port<stages::Batch>("batch"), .output = graph::no_port(),
                                   .max_workers = 1, .factory = graph::make_factory<BatchMeter>()});

// One tokenizer thread on the dataset's first `limit` bytes of documents: MB/s of wall time
// and MB per CPU-second (the latter holds on a loaded machine).
std::pair<double, double> tokenizer_mb_s(const std::string& dataset, size_t limit) {
  datasets::TextDatasetReader r;
  r.open(dataset, "train");
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (std::string d; bytes < limit && r.next(d);) {
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
  std::string workers = "auto", dataset = std::string(PIPELINE_SOURCE_DIR) + "/datasets/data/tinyshakespeare/text";
  std::string chunk = "auto";
  int trials = 3;
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
    else if (a == "--seconds") g_meter.seconds = std::atof(next().c_str());
    else if (a == "--warmup") g_meter.warmup_s = std::atof(next().c_str());
    else if (a == "--trials") trials = std::atoi(next().c_str());
    else if (a == "--batch") B = std::atoll(next().c_str());
    else if (a == "--seq") T = std::atoll(next().c_str());
    else if (a == "--dataset") dataset = next();
    else if (a == "--chunk-bytes") chunk = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_input [--workers W|auto] [--seconds S] [--warmup S] [--trials N] [--batch B] "
                   "[--seq T] [--dataset DIR] [--chunk-bytes N|auto]\n");
      return 2;
    }
  }
  const unsigned cores = std::thread::hardware_concurrency();
  auto [tok, tok_cpu] = tokenizer_mb_s(dataset, 8u << 20);
  std::printf("input side: read_shards -> tokenize x %s -> pack -> sink, B=%lld T=%lld, %s\n", workers.c_str(),
              static_cast<long long>(B), static_cast<long long>(T), dataset.c_str());
  std::printf("one tokenizer thread on this text: %.1f MB/s (%.1f MB per CPU-second); %u cores: goal >= 60%% of "
              "%.1f = %.1f MB/s\n",
              tok, tok_cpu, cores, cores * tok, 0.6 * cores * tok);
  std::printf("%6s %10s %12s %12s %15s %12s %15s\n", "trial", "MB/s", "tokens/s", "batches/s", "of cores x tok",
              "MB/CPU-s", "of tok MB/CPU-s");
  std::vector<double> rates;
  for (int t = 0; t < trials; ++t) {
    stages::RunRequest req;
    req.config = "gpt2.toml";
    req.source_dir = PIPELINE_SOURCE_DIR;
    req.create_run_dir = false;
    req.overrides = {"training.batch_size=" + std::to_string(B), "training.seq_len=" + std::to_string(T),
                     "data.dataset=\"" + dataset + "\"", "data.loop=true", "logging.live=\"off\""};
    auto plan = stages::plan_run(req);
    stages::set_run_context(plan.ctx);
    graph::GraphSpec g;
    g.add("read", "read_shards").set("chunk_bytes", chunk == "auto" ? config::Value{std::string("auto")}
                                                                      : config::Value{int64_t{std::atoll(chunk.c_str())}});
    g.add("meter", "bench_text_meter", {"read"}, 1, 64);
    g.add("tokenize", "tokenize", {"meter"}, workers == "auto" ? 0 : std::atoi(workers.c_str()), 64);
    g.add("pack", "pack", {"tokenize"}, 1, 64);
    g.add("sink", "bench_batch_meter", {"pack"}, 1, 8);
    g_meter.bytes = g_meter.tokens = g_meter.batches = g_meter.documents = 0;
    g_meter.measuring = g_meter.done = false;
    g_meter.t0 = Clock::now();
    {
      graph::Engine e(std::move(g), {.stats = false});
      e.run();
    }
    stages::set_run_context(nullptr);
    if (!g_meter.done) {
      std::fprintf(stderr, "trial %d: the run ended before the measured window closed\n", t);
      return 1;
    }
    double s = std::chrono::duration<double>(g_meter.t_end - g_meter.t_begin).count();
    double mb = g_meter.bytes0 / s / 1e6;
    rates.push_back(mb);
    double mb_cpu = g_meter.bytes0 / (g_meter.cpu_end - g_meter.cpu_begin) / 1e6;
    std::printf("%6d %10.1f %12.0f %12.1f %14.0f%% %12.1f %14.0f%%\n", t, mb, g_meter.tokens0 / s, g_meter.batches0 / s,
                100 * mb / (cores * tok), mb_cpu, 100 * mb_cpu / tok_cpu);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("median %.1f MB/s, best %.1f MB/s\n", rates[rates.size() / 2], rates.back());
  return 0;
}
