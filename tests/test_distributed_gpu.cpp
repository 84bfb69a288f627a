// Data parallel on NCCL (labels e2e;gpu): torchrun starts one rank per GPU (two at most) training
// the tiny model on CUDA with [run] backend = "nccl", and its weights must match one process
// training the same batches with grad_accum = (number of ranks) on one GPU (a one-rank NCCL group
// with one GPU). Exits 77 (CTest: skipped) without CUDA or torchrun.
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <torch/torch.h>

#include "model/checkpoint/checkpoint.h"
#include "dist_harness.h"
#include "test_util.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

using namespace train_harness;
using test_util::contains;
using test_util::shell;

namespace {

const std::string kTorchrun = PIPELINE_TORCHRUN;
const int kGpus = [] {
  if (!torch::cuda::is_available() || kTorchrun.empty() || !fs::exists(kTorchrun)) {
    std::fprintf(stderr, "test_distributed_gpu: needs CUDA and torchrun, skipped\n");
    std::exit(77);
  }
  return static_cast<int>(std::min<size_t>(2, torch::cuda::device_count()));
}();

model::CheckpointState last_checkpoint(const fs::path& run_dir) {
  auto ckpt = stages::latest_checkpoint(run_dir);
  REQUIRE(!ckpt.empty());
  return model::read_checkpoint(ckpt.string());
}

}  // namespace

TEST_CASE("NCCL ranks on CUDA train what one process trains") {
  auto root = temp_dir("nccl");
  auto data = dist_harness::make_letters_dataset(root);
  const std::string sets = " --set training.steps=6 --set run.device=\\\"cuda\\\" --set run.backend=\\\"nccl\\\"";
  auto cfg = root / "dp.toml";
  std::ofstream(cfg) << tiny_config(root / "dp", kTextInput, data.string());
  auto dp = shell(kTorchrun + " --standalone --no-python --nproc-per-node=" + std::to_string(kGpus) + " " PIPELINE_EXE
               " run " + cfg.string() + sets);
  INFO(dp.out);
  REQUIRE(dp.code == 0);
  CHECK(contains(dp.out, "data parallel: " + std::to_string(kGpus) + " ranks, nccl"));
  auto one_cfg = root / "one.toml";
  std::ofstream(one_cfg) << tiny_config(root / "one", kTextInput, data.string());
  auto one = shell(std::string(PIPELINE_EXE) + " run " + one_cfg.string() + sets + " --set training.grad_accum=" +
                std::to_string(kGpus));
  INFO(one.out);
  REQUIRE(one.code == 0);
  auto a = last_checkpoint(root / "dp"), b = last_checkpoint(root / "one");
  REQUIRE(a.model.size() == b.model.size());
  for (size_t i = 0; i < a.model.size(); ++i) {
    INFO(a.model[i].first);  // CUDA's embedding backward adds atomically: close, not bit-equal
    CHECK(torch::allclose(a.model[i].second, b.model[i].second, 1e-4, 1e-6));
  }
}
