// GPU end-to-end tests of the training graph (labels torch;gpu): the tiny model trained on CUDA
// through pack (uint16 windows in pinned buffers) -> h2d (side stream, events, host-callback
// release) -> train, against the same run on the CPU; a small pinned pool recycled many times;
// bf16 autocast; CUDA graphs against eager; no host sync anywhere in the graph while it trains
// (sync-debug mode); train's bounded run-ahead (it sleeps on step N-2's event) and the torch
// settings the run layer owns. Exits 77 (CTest: skipped) where CUDA is absent.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#if defined(PIPELINE_HAVE_CUDA) && __has_include(<cuda_runtime_api.h>)
#include <c10/cuda/CUDAFunctions.h>
#define PIPELINE_HAVE_SYNC_DEBUG 1
#endif

#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

using namespace train_harness;

namespace {

// Decided before main so that no test (whatever doctest filter is given) touches CUDA without it.
const bool kCudaPresent = [] {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "test_train_gpu: no CUDA device, skipped\n");
    std::exit(77);
  }
  return true;
}();

double as_double(const std::string& s) { return std::stod(s); }

// tiny_config run with the overrides `o` (directory root/a), then with `o` and `extra` (root/b).
std::pair<RunResult, RunResult> run_without_and_with(const fs::path& root, std::vector<std::string> o, const std::string& extra) {
  auto without = run(tiny_config(root / "a", kTextInput), root / "a", o);
  o.push_back(extra);
  return {std::move(without), run(tiny_config(root / "b", kTextInput), root / "b", o)};
}

// Every step of `ref` has a loss in `got` within `rel` of it (relative).
void check_losses_close(const RunResult& got, const RunResult& ref, double rel, const char* what) {
  for (const auto& [step, loss] : ref.losses) {
    INFO(what << ", step " << step << ": " << loss << " vs " << (got.losses.count(step) ? got.losses.at(step) : "none"));
    REQUIRE(got.losses.count(step) == 1);
    CHECK(std::abs(as_double(got.losses.at(step)) - as_double(loss)) < rel * std::abs(as_double(loss)));
  }
}

}  // namespace

TEST_CASE("CUDA training through pack's pinned windows and h2d follows the CPU run") {
  at::set_num_threads(1);
  auto root = temp_dir("gpu");
  auto cpu = run(tiny_config(root / "cpu", kTextInput), root / "cpu", {"training.steps=12"});
  auto gpu = run(tiny_config(root / "gpu", kTextInput), root / "gpu", {"training.steps=12", "run.device=\"cuda\""});
  REQUIRE(cpu.losses.size() == 12);
  REQUIRE(gpu.losses.size() == 12);
  // Same batches and weights; fp32 kernels differ only in summation order.
  check_losses_close(gpu, cpu, 1e-3, "gpu vs cpu");
  fs::remove_all(root);
}

TEST_CASE("two pinned buffers recycled over many batches keep every batch intact") {
  // With only two pinned buffers, each is reused every other batch: reuse before its copy
  // finished would corrupt batches and show as losses that differ from the CPU run.
  auto root = temp_dir("pool");
  auto [cpu, gpu] = run_without_and_with(root, {"training.steps=40", "stages.pack.buffers=2", "stages.h2d.capacity=1"},
                                         "run.device=\"cuda\"");
  REQUIRE(gpu.losses.size() == 40);
  check_losses_close(gpu, cpu, 2e-3, "gpu vs cpu");
  fs::remove_all(root);
}

TEST_CASE("bf16 autocast on CUDA trains and writes its checkpoint") {
  auto root = temp_dir("bf16");
  auto r = run(tiny_config(root / "b", kTextInput), root / "b",
               {"training.steps=30", "training.dtype=\"bf16\"", "run.device=\"cuda\"", "optimizer.lr=1e-2"});
  REQUIRE(r.losses.size() == 30);
  CHECK(as_double(r.losses.rbegin()->second) < as_double(r.losses.begin()->second) - 1.0);
  CHECK(fs::exists(r.checkpoint));
  fs::remove_all(root);
}

TEST_CASE("CUDA graphs: the losses of eager training, within bf16 tolerance") {
  auto root = temp_dir("graph");
  auto [eager, graph] = run_without_and_with(
      root, {"training.steps=24", "training.dtype=\"bf16\"", "run.device=\"cuda\"", "optimizer.lr=1e-2", "checkpoint.every=8"},
      "training.cuda_graph=true");
  REQUIRE(eager.losses.size() == 24);
  REQUIRE(graph.losses.size() == 24);
  // Steps 1-3 run eagerly in both; then the same kernels, replayed. bf16 and atomics in the
  // embedding backward leave small differences that grow slowly over steps.
  check_losses_close(graph, eager, 2e-2, "graph vs eager");
  CHECK(fs::exists(graph.checkpoint));
  fs::remove_all(root);
}

TEST_CASE("gradient accumulation under CUDA graphs follows eager") {
  auto root = temp_dir("graph_accum");
  auto [eager, graph] = run_without_and_with(root, {"training.steps=10", "training.grad_accum=3", "run.device=\"cuda\""},
                                             "training.cuda_graph=true");
  REQUIRE(graph.losses.size() == 10);
  check_losses_close(graph, eager, 1e-3, "graph vs eager, fp32");
  fs::remove_all(root);
}

namespace {

// val_loss by step, and the samples, from a run's metrics.jsonl.
std::map<int64_t, double> val_losses(const fs::path& dir, std::vector<std::string>* samples = nullptr) {
  std::map<int64_t, double> out;
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto v = line.find("\"val_loss\":");
    if (v == std::string::npos) continue;
    out[std::stoll(line.substr(line.find("\"step\":") + 7))] = std::stod(line.substr(v + 11));
    if (samples) {
      auto q = line.find("\"sample\":\"");
      samples->push_back(q == std::string::npos ? "" : line.substr(q + 10, line.rfind('"') - q - 10));
    }
  }
  return out;
}

const std::string kEvalStage = "[stages.eval]\ntype = \"eval\"\ninput = \"train\"\ncapacity = 4\n";

}  // namespace

TEST_CASE("eval on CUDA: the CPU's validation loss, and a sample drawn with the KV cache under autocast") {
  // Never run on a GPU before: eval's weight clones ordered after the step's event, their
  // record_stream, the KV-cache sampling on eval's own stream, the one pinned transfer back.
  auto root = temp_dir("eval");
  const std::vector<std::string> o{"training.steps=12", "eval.every=4", "eval.batches=3", "eval.sample_tokens=24"};
  auto cpu = run(tiny_config(root / "cpu", kTextInput) + kEvalStage, root / "cpu", o);
  auto gpu_o = o;
  gpu_o.push_back("run.device=\"cuda\"");
  auto gpu = run(tiny_config(root / "gpu", kTextInput) + kEvalStage, root / "gpu", gpu_o);
  std::vector<std::string> samples;
  auto want = val_losses(cpu.dir), got = val_losses(gpu.dir, &samples);
  REQUIRE(want.size() == 3);
  REQUIRE(got.size() == 3);
  for (const auto& [step, loss] : want) {
    CAPTURE(step);
    REQUIRE(got.count(step) == 1);
    CHECK(std::abs(got[step] - loss) < 1e-3 * loss);  // fp32: summation order only
  }
  for (const auto& sample : samples) CHECK(sample.size() > 10);  // the prompt plus 24 generated tokens

  // bf16: eval under the run's autocast, while training goes on.
  auto bf = gpu_o;
  bf.push_back("training.dtype=\"bf16\"");
  auto b = run(tiny_config(root / "bf16", kTextInput) + kEvalStage, root / "bf16", bf);
  auto bl = val_losses(b.dir);
  REQUIRE(bl.size() == 3);
  for (const auto& [step, loss] : bl) CHECK(std::abs(loss - want[step]) < 2e-2 * want[step]);
  fs::remove_all(root);
}

TEST_CASE("resume on CUDA: the losses after resuming are those of the uninterrupted run") {
  // The CPU run resumes bit for bit (test_stages); on CUDA, bf16 and atomics in the embedding
  // backward allow small differences: within bf16 tolerance.
  auto root = temp_dir("resume");
  const std::vector<std::string> o{"run.device=\"cuda\"", "training.dtype=\"bf16\"", "optimizer.lr=1e-2"};
  auto full = run(tiny_config(root / "full", kTextInput), root / "full", o);
  auto part = run(tiny_config(root / "part", kTextInput), root / "part", o);
  REQUIRE(full.losses.size() == 8);
  fs::remove(root / "part" / "checkpoints" / "step_00000008.ckpt");
  fs::remove(root / "part" / "metrics.jsonl");
  auto resumed = run("", root / "part", {}, root / "part");  // from step 4, with the run's own config
  REQUIRE(resumed.losses.size() == 4);
  for (int64_t s = 5; s <= 8; ++s) {
    CAPTURE(s);
    REQUIRE(resumed.losses.count(s) == 1);
    CHECK(std::abs(as_double(resumed.losses[s]) - as_double(full.losses[s])) < 2e-2 * as_double(full.losses[s]));
  }
  fs::remove_all(root);
}

TEST_CASE("pack's overflow path on CUDA: windows beyond the pinned pool arrive intact") {
  // 1000-token chunks complete about 15 windows each and the pool has 2 pinned buffers: most
  // windows go to overflow buffers, allocated on pack's TBB thread (with the run's device
  // current) and copied by h2d. The losses must be those of the CPU run of the same batches.
  auto root = temp_dir("overflow");
  const std::vector<std::string> o{"training.steps=16", "stages.read.chunk_tokens=1000", "stages.pack.buffers=2"};
  auto cpu = run(tiny_config(root / "cpu", kTokenInput, kData + "tokens"), root / "cpu", o);
  auto gpu_o = o;
  gpu_o.push_back("run.device=\"cuda\"");
  std::mutex mu;
  std::vector<std::string> printed;
  auto gpu = run(tiny_config(root / "gpu", kTokenInput, kData + "tokens"), root / "gpu", gpu_o, {},
                 [&](graph::Engine&, stages::RunContext& ctx) {
                   ctx.log->set_printer([&](const std::string& line) {
                     std::lock_guard lock(mu);
                     printed.push_back(line);
                   });
                 });
  REQUIRE(gpu.losses.size() == 16);
  check_losses_close(gpu, cpu, 1e-3, "gpu (overflow) vs cpu");
  bool reported = false;
  for (const auto& l : printed)
    if (l.find("batches went to buffers outside its pool of 2") != std::string::npos) reported = true;
  CHECK(reported);
  fs::remove_all(root);
}

// Sync-debug mode is process-wide: while it is "error", any host sync anywhere (train, h2d, log,
// checkpoint) throws inside its stage and fails the run. It is switched on once the model is
// built and on the device (that part syncs legitimately) and off before the end.
#ifdef PIPELINE_HAVE_SYNC_DEBUG
void check_no_host_sync(const std::string& tag, std::vector<std::string> o) {
  auto root = temp_dir(tag);
  const int64_t steps = 60;
  o.push_back("training.steps=" + std::to_string(steps));
  o.push_back("run.device=\"cuda\"");
  o.push_back("checkpoint.every=10");
  std::atomic<int64_t> first_checked{0}, last_checked{0};
  auto r = run(tiny_config(root / "r", kTextInput), root / "r", o, {}, [&](graph::Engine&, stages::RunContext& ctx) {
    while (ctx.last_step.load() < 5) std::this_thread::sleep_for(std::chrono::microseconds(200));
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    first_checked = ctx.last_step.load();
    while (ctx.last_step.load() < steps - 3) std::this_thread::sleep_for(std::chrono::microseconds(200));
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    last_checked = ctx.last_step.load();
  });
  MESSAGE(tag << ": steps " << first_checked.load() << " to " << last_checked.load() << " ran under sync-debug \"error\"");
  CHECK(r.losses.size() == static_cast<size_t>(steps));
  CHECK(last_checked - first_checked >= 20);
  fs::remove_all(root);
}

TEST_CASE("no host sync anywhere in the graph while it trains: eager, bf16") {
  check_no_host_sync("nosync_eager", {"training.dtype=\"bf16\""});
}

TEST_CASE("no host sync anywhere in the graph while it trains: CUDA graphs") {
  check_no_host_sync("nosync_graph", {"training.dtype=\"bf16\"", "training.cuda_graph=true"});
}

// The spike guard judges every step on the device and the host reads its verdicts a step late:
// no sync either (it waits on events only at checkpoint steps, and near the end).
TEST_CASE("no host sync anywhere in the graph while it trains: the spike guard, eager and CUDA graphs") {
  check_no_host_sync("nosync_guard", {"training.dtype=\"bf16\"", "training.guard.enabled=true", "training.guard.min_steps=2",
                                      "training.guard.z=1000"});
  check_no_host_sync("nosync_guard_graph", {"training.dtype=\"bf16\"", "training.cuda_graph=true",
                                            "training.guard.enabled=true", "training.guard.min_steps=2", "training.guard.z=1000"});
}
#endif  // PIPELINE_HAVE_SYNC_DEBUG

#ifdef PIPELINE_HAVE_SYNC_DEBUG  // CUDA's headers
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <time.h>

#include "base/json.h"
#include "model/device/device_event.h"
#include "model/device/run_ahead.h"

namespace {

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

}  // namespace

TEST_CASE("before step N, train waits for step N-2 asleep: a blocking-sync event, not a spinning core") {
  namespace m = pipeline::model;
  const torch::Device cuda(torch::kCUDA, 0);
  m::use_device(cuda);
  c10::cuda::CUDAStreamGuard on(c10::cuda::getStreamFromPool(false, 0));
  m::RunAhead<m::DeviceEvent> ahead;
  std::vector<std::shared_ptr<m::DeviceEvent>> done;
  // Two "steps" of about 0.3 s of GPU time each (a kernel that spins on the device's clock).
  const int64_t cycles = 600'000'000;
  for (int i = 0; i < 2; ++i) {
    at::cuda::sleep(cycles);
    done.push_back(std::make_shared<m::DeviceEvent>());
    done.back()->record_current(cuda);
    ahead.issued(done.back());
  }
  const double cpu0 = thread_cpu_s();
  const auto t0 = std::chrono::steady_clock::now();
  const auto waited = ahead.before_step();  // the third step waits for the first
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = thread_cpu_s() - cpu0;
  INFO("waited " << wall << " s of wall time, " << cpu << " s of this thread's CPU");
  CHECK(done[0]->query());
  CHECK(ahead.pending() == 1);
  CHECK(wall > 0.05);
  CHECK(std::chrono::duration<double>(waited).count() > 0.05);
  CHECK(cpu < 0.25 * wall);  // asleep, not spinning
  done[1]->wait();
}

TEST_CASE("under CUDA graphs train's thread sleeps while the GPU works: device wait in the stats, not a core") {
  // GPT-2 124M at 8x1024 in bf16: a step the GPU needs tens of milliseconds for, which the host
  // issues in a few. Without the bound, train's thread spun in the launch queue (its CPU time was
  // its wall time, docs/figures.md).
  auto root = temp_dir("runahead");
  auto r = run(tiny_config(root / "r", kTokenInput, kData + "tokens"), root / "r",
               {"run.device=\"cuda\"", "model.preset=\"gpt2\"", "training.batch_size=8", "training.seq_len=1024",
                "training.steps=30", "training.dtype=\"bf16\"", "training.cuda_graph=true", "checkpoint.every=0",
                "checkpoint.at_end=false"});
  REQUIRE(r.losses.size() == 30);
  const auto summary = pipeline::json_parse(test_util::read_file(r.dir / "stats_summary.json"));
  double cpu = -1, host = 0, wait = 0;
  for (const auto& st : summary.array("stages"))
    if (const auto* name = st.find("name"); name && name->text == "train") {
      cpu = st.number("cpu_s");
      host = st.number("busy_s");  // host work only: the device waits are apart (stats_format 2)
      wait = st.number("device_wait_s");
    }
  const double busy = host + wait;  // the thread's time in its invocations
  INFO("train: busy (host work) " << host << " s, device wait " << wait << " s; CPU " << cpu << " s");
  CHECK(wait > 0.1 * busy);  // most of a GPU-bound step is spent waiting for the GPU, asleep
  CHECK(cpu < 0.5 * busy);   // the goal is 25% of a core; the test leaves room for a loaded machine
  fs::remove_all(root);
}

TEST_CASE("the matmul precision is the run layer's: set before the engine, never by train") {
  auto root = temp_dir("precision");
  auto p = plan(tiny_config(root / "r", kTokenInput, kData + "tokens"), root / "r",
                {"run.device=\"cuda\"", "training.steps=2", "training.matmul_precision=\"highest\""});
  CHECK(at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST);
  at::globalContext().setFloat32MatmulPrecision("medium");
  auto r = execute(p);
  REQUIRE(r.losses.size() == 2);
  CHECK(at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::MEDIUM);
  at::globalContext().setFloat32MatmulPrecision("high");
  fs::remove_all(root);
}
#endif  // PIPELINE_HAVE_SYNC_DEBUG
