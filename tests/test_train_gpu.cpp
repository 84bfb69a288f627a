// GPU end-to-end tests of the training graph (labels torch;gpu): the tiny model trained on CUDA
// through pin -> h2d (side stream, events) -> train, against the same run on the CPU; a small
// pinned pool recycled many times; bf16 autocast. Exits 77 (CTest: skipped) where CUDA is absent.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <torch/torch.h>

#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

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

}  // namespace

TEST_CASE("CUDA training through pin and h2d follows the CPU run") {
  at::set_num_threads(1);
  auto root = temp_dir("gpu");
  auto cpu = run(tiny_config(root / "cpu", kTextInput), root / "cpu", {"training.steps=12"});
  auto gpu = run(tiny_config(root / "gpu", kTextInput), root / "gpu", {"training.steps=12", "run.device=\"cuda\""});
  REQUIRE(cpu.losses.size() == 12);
  REQUIRE(gpu.losses.size() == 12);
  for (const auto& [step, loss] : cpu.losses) {
    INFO("step " << step << ": cpu " << loss << " gpu " << gpu.losses[step]);
    // Same batches and weights; fp32 kernels differ only in summation order.
    CHECK(std::abs(as_double(gpu.losses[step]) - as_double(loss)) < 1e-3 * std::abs(as_double(loss)));
  }
  fs::remove_all(root);
}

TEST_CASE("two pinned buffers recycled over many batches keep every batch intact") {
  // With only two pinned buffers, each is reused every other batch: reuse before its copy
  // finished would corrupt batches and show as losses that differ from the CPU run.
  auto root = temp_dir("pool");
  std::vector<std::string> o{"training.steps=40", "stages.pin.buffers=2", "stages.h2d.capacity=1"};
  auto cpu = run(tiny_config(root / "cpu", kTextInput), root / "cpu", o);
  o.push_back("run.device=\"cuda\"");
  auto gpu = run(tiny_config(root / "gpu", kTextInput), root / "gpu", o);
  REQUIRE(gpu.losses.size() == 40);
  for (const auto& [step, loss] : cpu.losses)
    CHECK(std::abs(as_double(gpu.losses[step]) - as_double(loss)) < 2e-3 * std::abs(as_double(loss)));
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
