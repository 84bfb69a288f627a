// The device path, as far as a CPU can check it: batches travel as uint16 windows and train on
// exactly the losses of int64 batches; pack's pooled buffers and its overflow; checkpoint
// snapshots into buffers allocated once; KV-cache sampling against the full recompute; the
// engine hears train's step time (device busy) and log's waits. The CUDA side of each is in
// test_train_gpu and test_model_gpu (label gpu).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "datasets/sources/dataset_reader.h"
#include "base/json.h"
#include "graph/stage.h"
#include "model/checkpoint/checkpoint.h"
#include "model/eval/generate.h"
#include "model/net/gpt2.h"
#include "model/net/optim.h"
#include "model/net/schedule.h"
#include "model/checkpoint/snapshot.h"
#include "stages/pinned_pool.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace m = pipeline::model;
using namespace train_harness;

namespace {

struct Threads {
  Threads() { at::set_num_threads(1); }  // bitwise reproducibility and a fair share of 2 cores
} threads_once;

// Counts the CPU allocator's allocations while installed (torch::empty and friends on the CPU).
class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : base_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, /*priority=*/100); }
  ~CountingAllocator() override { c10::SetCPUAllocator(base_, /*priority=*/100); }
  c10::DataPtr allocate(size_t n) override {
    count.fetch_add(1);
    bytes.fetch_add(static_cast<int64_t>(n));
    return base_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t n) const override { base_->copy_data(dest, src, n); }
  std::atomic<int64_t> count{0}, bytes{0};

 private:
  c10::Allocator* base_;
};

// The token stream of the bundled token dataset, and a sink that checks each batch's rows against
// it (the documents order): batch i must be cut from tokens [i*B*T, i*B*T + B*T + 1).
// With `delay`, the sink is slower than pack, so pack's pool runs dry; it records the most of
// the pool's buffers it ever saw handed out at once, and how many windows came in overflow
// buffers instead.
struct WindowCheck {
  std::vector<uint16_t> stream;
  std::chrono::microseconds delay{0};
  std::atomic<int64_t> windows{0}, wrong{0}, overflow{0};
  std::atomic<int> pool_size{0}, max_in_use{0};

  void reset(std::chrono::microseconds d) {
    delay = d;
    windows = wrong = overflow = 0;
    pool_size = max_in_use = 0;
  }
} g_check;

class WindowCheckSink : public graph::Stage {
 public:
  explicit WindowCheckSink(const graph::StageContext&) {}
  void process(graph::Item in, graph::Emitter&) override {
    const auto& b = in.get<stages::Batch>();
    // The documents order: row r of batch i is the stream's tokens [(i*B + r)*T, (i*B + r)*T + T].
    const auto row = static_cast<size_t>(b.T + 1);
    const auto* p = static_cast<const uint16_t*>(b.rows.data_ptr());
    bool right = b.rows.scalar_type() == torch::kUInt16 && b.rows.dim() == 2 && b.rows.size(0) == b.B &&
                 b.rows.size(1) == b.T + 1;
    for (int64_t r = 0; right && r < b.B; ++r) {
      const auto at = static_cast<size_t>((b.index * b.B + r) * b.T);
      right = at + row <= g_check.stream.size() &&
              std::equal(p + r * b.rows.size(1), p + r * b.rows.size(1) + static_cast<std::ptrdiff_t>(row),
                         g_check.stream.begin() + static_cast<std::ptrdiff_t>(at));
    }
    if (!right) g_check.wrong.fetch_add(1);
    if (b.lease) {
      const auto& pool = b.lease->pool();
      const int in_use = pool.size() - pool.free_count();
      g_check.pool_size = pool.size();
      for (int m = g_check.max_in_use.load(); in_use > m && !g_check.max_in_use.compare_exchange_weak(m, in_use);) {
      }
    } else {
      g_check.overflow.fetch_add(1);
    }
    g_check.windows.fetch_add(1);
    if (g_check.delay.count() > 0) std::this_thread::sleep_for(g_check.delay);
  }
};
PIPELINE_STAGE(test_window_check, {.name = "test_window_check",
                                   .doc = "test: checks pack's windows against the dataset's token stream",
                                   .input = graph::port<stages::Batch>("batch"),
                                   .output = graph::no_port(),
                                   .ordered = true,
                                   .max_workers = 1,
                                   .factory = graph::make_factory<WindowCheckSink>()});

}  // namespace

TEST_CASE("uint16 rows train on exactly the losses of int64 batches cut from the same tokens (documents order)") {
  // The graph: read_tokens -> pack (uint16 rows in pooled buffers) -> h2d -> train. In the
  // documents order the rows are one window of B*T+1 tokens, written as overlapping rows: the
  // losses must be those of x and y cut from the window as the code did before rows, bit for bit.
  auto root = temp_dir("wire");
  auto wire = run(tiny_config(root / "w", kTokenInput, kData + "tokens"), root / "w", {"data.order=\"documents\""});
  REQUIRE(wire.losses.size() == 8);

  // The reference, as the code trained before windows became uint16: int64 (B, T) x and y cut
  // from the token stream, the same model, optimizer, clipping and schedule as tiny_config's.
  const int64_t B = 2, T = 32, steps = 8;
  pipeline::datasets::TokenDatasetReader reader;
  reader.open(kData + "tokens", "train");
  std::vector<uint16_t> stream(static_cast<size_t>(steps * B * T + 1));
  size_t got = 0, n;
  while (got < stream.size() && (n = reader.read(std::span<uint16_t>(stream).subspan(got))) > 0) got += n;
  REQUIRE(got == stream.size());
  const auto reference = hand_trained_losses([&](int64_t s) {
    auto window = torch::empty({B * T + 1}, torch::kInt64);  // (B*T+1), as pack built it before
    for (int64_t i = 0; i < B * T + 1; ++i) window[i] = static_cast<int64_t>(stream[static_cast<size_t>(s * B * T + i)]);
    return std::make_pair(window.narrow(0, 0, B * T).view({B, T}), window.narrow(0, 1, B * T).view({B, T}));
  }, steps);
  for (int64_t s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(wire.losses[s + 1] == reference[static_cast<size_t>(s)]);
  }
  fs::remove_all(root);
}

TEST_CASE("pack fills batches across chunks of any size, with two buffers and overflow batches") {
  // The lanes order (the default), two lanes of one row a step each: 100-token chunks of a lane
  // make three of its rows, 1000-token chunks about 31, and the chunk that brings the other lane
  // level completes as many batches, far more than two buffers: the rest go to overflow buffers,
  // and the batches must not change (what a lane holds never depends on how it was read).
  auto root = temp_dir("pack");
  auto small = run(tiny_config(root / "s", kTokenInput, kData + "tokens"), root / "s");
  std::mutex mu;
  std::vector<std::string> printed;
  auto big = run(tiny_config(root / "b", kTokenInput, kData + "tokens"), root / "b",
                 {"stages.read.chunk_tokens=1000", "stages.pack.buffers=2"}, {},
                 [&](graph::Engine&, stages::RunContext& ctx) {
                   ctx.log->set_printer([&](const std::string& line) {
                     std::lock_guard lock(mu);
                     printed.push_back(line);
                   });
                 });
  REQUIRE(small.losses.size() == 8);
  CHECK(big.losses == small.losses);
  bool reported = false;
  for (const auto& l : printed)
    if (test_util::contains(l, "batches went to buffers outside its pool of 2")) reported = true;
  CHECK(reported);
  fs::remove_all(root);
}

namespace {

// The bundled token dataset's train split, whole, as the sink checks windows against it.
void load_check_stream() {
  if (!g_check.stream.empty()) return;
  pipeline::datasets::TokenDatasetReader reader;
  reader.open(kData + "tokens", "train");
  g_check.stream.assign(400000, 0);
  size_t got = 0, n;
  while ((n = reader.read(std::span<uint16_t>(g_check.stream).subspan(got))) > 0) got += n;
  g_check.stream.resize(got);
}

// read_tokens -> pack -> test_window_check, no model, over the whole split once, in the documents
// order (one stream); chunk_tokens 0: read_tokens' default (auto).
std::string pack_alone_toml(const fs::path& dir, int chunk_tokens, int buffers, int capacity) {
  std::ostringstream toml;
  toml << "[run]\ndir = \"" << dir.string() << "\"\ndevice = \"cpu\"\n[model]\npreset = \"tiny\"\n"
       << "[data]\ndataset = \"" << kData << "tokens\"\nloop = false\norder = \"documents\"\n"
       << "[training]\nbatch_size = 2\nseq_len = 32\n[eval]\nevery = 0\n[checkpoint]\nat_end = false\n"
       << "[logging]\nlive = \"off\"\ntrace = false\n"
       << "[stages.read]\ntype = \"read_tokens\"\n" << (chunk_tokens > 0 ? "chunk_tokens = " + std::to_string(chunk_tokens) + "\n" : "")
       << "[stages.pack]\ntype = \"pack\"\ninput = \"read\"\ncapacity = " << capacity << "\nbuffers = " << buffers << "\n"
       << "[stages.check]\ntype = \"test_window_check\"\ninput = \"pack\"\ncapacity = " << capacity << "\n";
  return toml.str();
}

// Windows of 65 tokens, 64 apart, in the whole split.
int64_t expected_windows() { return (static_cast<int64_t>(g_check.stream.size()) - 1) / 64; }

// Runs a pack-alone graph; a run that has not finished in 3 minutes (a deadlock) ends the test
// executable with a failure instead of hanging it.
void run_pack_alone_or_die(const std::string& toml, const fs::path& dir) {
  auto finished = std::async(std::launch::async, [&] { run(toml, dir); });
  if (finished.wait_for(std::chrono::minutes(3)) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: the run did not finish in 3 minutes (deadlock?) after %lld of %lld windows\n",
                 static_cast<long long>(g_check.windows.load()), static_cast<long long>(expected_windows()));
    std::_Exit(1);
  }
  finished.get();
}

}  // namespace

TEST_CASE("pack alone, fed cheap chunks that the engine batches, cuts every window of the stream exactly") {
  // No model: the whole graph is cheap, so the source sends chunks to pack in batches (several
  // inputs per invocation, one buffer reserved for them all), and pack's pool of 3 buffers is
  // short of the windows a batch completes.
  load_check_stream();
  g_check.reset(std::chrono::microseconds(0));
  auto root = temp_dir("pack_alone");
  run(pack_alone_toml(root / "r", 150, 3, 16), root / "r");
  MESSAGE(g_check.windows.load() << " windows checked");
  CHECK(g_check.windows.load() == expected_windows());
  CHECK(g_check.wrong.load() == 0);
  fs::remove_all(root);
}

TEST_CASE("a pool smaller than the queues: never more buffers out than the pool has, and no deadlock") {
  // 2 buffers, queues of 16, and a sink slower than pack: pack must wait for buffers through the
  // engine (admission), never by blocking a thread, and every window must still arrive intact
  // (a buffer handed out twice would have its first window overwritten before the sink read it).
  // Chunks of 300 tokens complete 4 or 5 windows each, more than the pool holds: the rest go to
  // overflow buffers.
  load_check_stream();
  g_check.reset(std::chrono::microseconds(100));
  auto root = temp_dir("pool_bound");
  run_pack_alone_or_die(pack_alone_toml(root / "r", 300, 2, 16), root / "r");
  MESSAGE(g_check.windows.load() << " windows, " << g_check.overflow.load() << " in overflow buffers, at most "
                                 << g_check.max_in_use.load() << " of the pool's " << g_check.pool_size.load()
                                 << " buffers out at once");
  CHECK(g_check.windows.load() == expected_windows());
  CHECK(g_check.wrong.load() == 0);
  CHECK(g_check.pool_size.load() == 2);
  CHECK(g_check.max_in_use.load() == 2);  // the pool ran dry (the gate was exercised) and never went past it
  CHECK(g_check.overflow.load() > 0);
  CHECK(g_check.overflow.load() < g_check.windows.load());
  fs::remove_all(root);
}

TEST_CASE("read_tokens' default chunk is one batch: pack's own buffers carry every window") {
  // The same slow sink and pool of 2, with read_tokens' default chunk size (B*T tokens): each
  // chunk completes at most one window, the one its reserved buffer takes.
  load_check_stream();
  g_check.reset(std::chrono::microseconds(100));
  auto root = temp_dir("default_chunk");
  run_pack_alone_or_die(pack_alone_toml(root / "r", 0, 2, 16), root / "r");
  CHECK(g_check.windows.load() == expected_windows());
  CHECK(g_check.wrong.load() == 0);
  CHECK(g_check.max_in_use.load() == 2);
  CHECK(g_check.overflow.load() == 0);
  fs::remove_all(root);
}

TEST_CASE("the engine hears train's step time and log's waits: device_busy in the stats") {
  auto root = temp_dir("busy");
  std::mutex mu;
  std::vector<std::string> printed;
  auto r = run(tiny_config(root / "r", kTokenInput, kData + "tokens"), root / "r", {"training.steps=6"}, {},
               [&](graph::Engine&, stages::RunContext& ctx) {
                 ctx.log->set_printer([&](const std::string& line) {
                   std::lock_guard lock(mu);
                   printed.push_back(line);
                 });
               });
  REQUIRE(r.losses.size() == 6);
  // log's closing line: train's busy share between the first step and the last (host clock here).
  int share = -1;
  for (const auto& l : printed)
    if (std::sscanf(l.c_str(), "train: busy %d%% in forward, backward and step (host clock)", &share) == 1) break;
  CHECK(share > 50);  // tiny on the CPU: the model is nearly all of the time
  std::ifstream in(r.dir / "stats_summary.json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto summary = pipeline::json_parse(ss.str());
  double busy = -1, wall = 0;
  for (const auto& st : summary.array("stages")) {
    auto name = st.find("name");
    if (name && name->text == "train") {
      busy = st.number("device_busy_s", -1);
      wall = st.number("wall_s");
    }
  }
  // On the CPU, device busy is train's host time in forward, backward and step: most of its wall.
  CHECK(busy > 0);
  CHECK(busy <= wall);
  // metrics.jsonl has the per-phase times.
  std::ifstream metrics(r.dir / "metrics.jsonl");
  std::string line;
  int with_phases = 0;
  while (std::getline(metrics, line))
    if (test_util::contains(line, "\"host_ms\":{\"fwd\":") && test_util::contains(line, "\"bwd\":") &&
        test_util::contains(line, "\"step\":"))
      ++with_phases;
  CHECK(with_phases == 6);
  fs::remove_all(root);
}

TEST_CASE("torch's process-wide settings are the run layer's: train sets none of them") {
  auto root = temp_dir("globals");
  auto p = plan(tiny_config(root / "r", kTokenInput, kData + "tokens"), root / "r", {"training.steps=3"});
  auto gen = at::globalContext().defaultGenerator(torch::kCPU);
  // The run layer seeded the default generators from [run] seed (dropout draws its masks there).
  const auto seeded = gen.get_state();
  torch::manual_seed(static_cast<uint64_t>(p.ctx->cfg.run.seed));
  CHECK(torch::equal(gen.get_state(), seeded));
  // Whatever the state is when the engine starts, the stages leave it so: building train's model
  // draws nothing from it (model/net/gpt2.cpp), and train seeds nothing (no dropout: no draws).
  torch::manual_seed(4242);
  const auto marker = gen.get_state();
  auto r = execute(p);
  REQUIRE(r.losses.size() == 3);
  CHECK(torch::equal(gen.get_state(), marker));  // (the matmul precision, CUDA's: test_train_gpu)
  fs::remove_all(root);
}

TEST_CASE("no peak for the device (the CPU): MFU is \"—\" and absent from metrics.jsonl, and one line says how to set it") {
  auto root = temp_dir("mfu");
  auto r = run(tiny_config(root / "r", kTokenInput, kData + "tokens"), root / "r", {"training.steps=2"});
  REQUIRE(r.losses.size() == 2);
  const std::string log = test_util::read_file(r.dir / "run.log");
  CHECK(test_util::contains(log, "log: MFU: \xE2\x80\x94 (the CPU has no entry in the peak table): set [logging] peak_tflops"));
  CHECK(test_util::contains(log, "| MFU \xE2\x80\x94 |"));
  CHECK_FALSE(test_util::contains(test_util::read_file(r.dir / "metrics.jsonl"), "\"mfu\""));

  // Set, it is a number (on the CPU too), in the progress line and the metrics.
  auto set = run(tiny_config(root / "s", kTokenInput, kData + "tokens"), root / "s",
                 {"training.steps=2", "logging.peak_tflops=0.001"});
  CHECK(test_util::contains(test_util::read_file(set.dir / "run.log"), "log: MFU against 0.001 TFLOP/s ([logging] peak_tflops)"));
  CHECK(test_util::contains(test_util::read_file(set.dir / "metrics.jsonl"), "\"mfu\":"));
  fs::remove_all(root);
}

TEST_CASE("checkpoint snapshots reuse one buffer set: no allocation after the first") {
  auto cfg = m::GPTConfig::preset("tiny").with_vocab(256);
  m::GPT model(cfg, 3);
  m::AdamW opt(model->named_parameters());
  auto x = torch::randint(cfg.vocab_size, {2, 16}, torch::kLong);
  auto step = [&] {
    opt.zero_grad();
    model->loss(model(x), x).backward();
    opt.step();
  };
  m::SnapshotPool pool(model, &opt);
  CHECK(pool.allocations() == 2);  // weights, optimizer state: allocated once, up front
  step();
  auto first = pool.take(1, "{\"step\":1}");
  const void* weights = first.model.front().second.data_ptr();
  auto params = model->named_parameters();
  for (const auto& [name, t] : first.model) CHECK(torch::equal(t, params[name]));
  first = m::CheckpointState();  // written and dropped: the set is free again

  step();
  int64_t bytes = 0, count = 0;
  m::CheckpointState second;
  {
    CountingAllocator counting;
    second = pool.take(2, "{\"step\":2}");
    bytes = counting.bytes.load();
    count = counting.count.load();
  }
  MESSAGE("second snapshot: " << count << " CPU allocations, " << bytes << " bytes (the RNG state); a set is "
                              << pool.set_bytes() << " bytes");
  CHECK(bytes < 16384);  // only the generator's state, never a buffer
  CHECK(pool.allocations() == 2);
  CHECK(second.model.front().second.data_ptr() == weights);  // the same buffers
  for (const auto& [name, t] : second.model) CHECK(torch::equal(t, params[name]));
  auto state = opt.state();
  REQUIRE(second.optimizer.size() == state.size());
  for (size_t i = 0; i < state.size(); ++i) CHECK(torch::equal(second.optimizer[i].second, state[i].second));

  // It is a complete checkpoint.
  const std::string path = (fs::temp_directory_path() / ("pipeline_snapshot_" + std::to_string(::getpid()) + ".ckpt")).string();
  m::write_checkpoint(path, second);
  auto back = m::read_checkpoint(path);
  CHECK(back.step == 2);
  CHECK(torch::equal(back.model.front().second, second.model.front().second));
  fs::remove(path);

  // While a snapshot still holds the only set, the next one waits for it to be let go.
  std::atomic<bool> taken{false};
  std::thread t([&] {
    auto third = pool.take(3, "{}");
    taken = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(taken.load());
  second = m::CheckpointState();
  t.join();
  CHECK(taken.load());
  CHECK(pool.waited() >= std::chrono::milliseconds(50));
}

TEST_CASE("KV-cache sampling gives the tokens of the full recompute for a seed") {
  auto cfg = m::GPTConfig::preset("tiny").with_vocab(512);  // block_size 64
  m::GPT model(cfg, 9);
  std::vector<int64_t> prompt{5, 17, 300, 2, 41};
  for (const auto& [temperature, top_k] : std::vector<std::pair<double, int64_t>>{{1.0, 0}, {0.8, 20}, {0.0, 0}}) {
    CAPTURE(temperature);
    CAPTURE(top_k);
    m::SampleOptions o{.n_tokens = 40, .temperature = temperature, .top_k = top_k, .seed = 11};
    auto cached = m::sample(model, prompt, o);
    o.kv_cache = false;
    auto full = m::sample(model, prompt, o);
    REQUIRE(cached.size() == prompt.size() + 40);
    CHECK(cached == full);
  }
  // Past block_size the context is cropped: the cache gives way to the recompute, still equal.
  m::SampleOptions o{.n_tokens = 80, .temperature = 1.0, .top_k = 0, .seed = 12};
  auto cached = m::sample(model, prompt, o);
  o.kv_cache = false;
  CHECK(cached == m::sample(model, prompt, o));
  // And the cached logits are those of the full forward pass.
  torch::NoGradGuard no_grad;
  model->eval();
  auto ids = torch::randint(cfg.vocab_size, {1, 30}, torch::kLong);
  m::KVCache cache;
  auto last = model->forward_cached(ids.narrow(1, 0, 20), cache);
  for (int64_t t = 20; t < 30; ++t) last = model->forward_cached(ids.narrow(1, t, 1), cache);
  auto ref = model->forward(ids).select(1, 29);  // (1, Vp)
  CHECK(torch::allclose(last, ref, 1e-4, 1e-5));
}

TEST_CASE("the attention backend SDPA takes can be asked") {
  m::GPT model(m::GPTConfig::preset("tiny"), 1);
  auto name = model->attention_backend(32, torch::kFloat, torch::kCPU);
  MESSAGE("CPU fp32 attention: " << name);
  CHECK((name == "flash_attention" || name == "math"));
}
