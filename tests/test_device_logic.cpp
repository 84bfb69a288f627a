// The device path's decisions that need no device: the GPU peak table and [logging] peak_tflops
// (MFU), which loss runs (fused kernels or chunked), and how far train runs ahead of the GPU.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "model/device/device_peak.h"
#include "model/net/gpt_config.h"
#include "model/net/loss_path.h"
#include "model/device/run_ahead.h"

using namespace pipeline::model;

TEST_CASE("the peak table knows the GPUs people train on, by the names CUDA gives them") {
  struct Case {
    const char* name;
    double tflops;
  };
  // Names as cudaGetDeviceProperties reports them.
  const std::vector<Case> cases = {
      {"NVIDIA H100 80GB HBM3", 989},  {"NVIDIA H100 PCIe", 756},      {"NVIDIA H100 NVL", 835},
      {"NVIDIA H200", 989},            {"NVIDIA H200 NVL", 835},       {"NVIDIA GH200 480GB", 989},
      {"NVIDIA A100-SXM4-80GB", 312},  {"NVIDIA A100-PCIE-40GB", 312}, {"NVIDIA A100 80GB PCIe", 312},
      {"NVIDIA L4", 121},              {"NVIDIA L40S", 362},           {"NVIDIA L40", 181},
      {"NVIDIA A10", 125},             {"NVIDIA GeForce RTX 4090", 165.2}, {"Tesla T4", 65},
      {"NVIDIA B200", 2250},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(table_peak_tflops(c.name) == doctest::Approx(c.tflops));
  }
  std::string row;
  CHECK(table_peak_tflops("NVIDIA H100 PCIe", &row) == 756);
  CHECK(row == "H100 PCIe");
}

TEST_CASE("a GPU the table lacks has no peak: never a neighbour's figure") {
  for (const char* name : {"NVIDIA A10G", "NVIDIA H20", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 3090",
                           "NVIDIA RTX 6000 Ada Generation", "Tesla V100-SXM2-16GB", "", "AMD Instinct MI300X"}) {
    CAPTURE(name);
    CHECK(table_peak_tflops(name) == 0);
  }
}

TEST_CASE("a variant is not its base card: the RTX 4090 D has its own peak, a MIG slice none, and says why") {
  std::string row;
  CHECK(table_peak_tflops("NVIDIA GeForce RTX 4090 D", &row) == doctest::Approx(147.1));
  CHECK(row == "RTX 4090 D");
  CHECK(table_peak_tflops("NVIDIA GeForce RTX 4090", &row) == doctest::Approx(165.2));
  CHECK(row == "RTX 4090");
  for (const char* slice : {"NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA A100-SXM4-40GB MIG 7g.40gb",
                            "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100 80GB HBM3 MIG"}) {
    CAPTURE(slice);
    CHECK(table_peak_tflops(slice) == 0);
    CHECK(resolve_peak_flops(0, true, slice).tflops == 0);
  }
  auto a100 = resolve_peak_flops(0, true, "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
  CHECK(a100.source == "\"NVIDIA A100-SXM4-40GB MIG 1g.5gb\" is a MIG slice (1g.5gb) of the peak table's A100 (312 "
                       "TFLOP/s for the whole GPU): a slice computes with a share of the GPU's SMs, which the peak table "
                       "cannot know");
  CHECK(describe_peak(a100).find("set [logging] peak_tflops") != std::string::npos);
  CHECK(resolve_peak_flops(0, true, "NVIDIA H100 80GB HBM3 MIG").source.find("is a MIG slice of the peak table's H100 SXM") !=
        std::string::npos);
  CHECK(resolve_peak_flops(40, true, "NVIDIA A100-SXM4-40GB MIG 1g.5gb").tflops == 40);  // the user's figure wins
  CHECK(table_peak_tflops("NVIDIA AMIGA 100") == 0);  // MIG only as a word of its own
}

TEST_CASE("[logging] peak_tflops overrides the table; unknown devices and the CPU get no MFU and a line how to set it") {
  auto set = resolve_peak_flops(500, true, "NVIDIA H100 80GB HBM3");
  CHECK(set.tflops == 500);
  CHECK(set.source == "[logging] peak_tflops");
  auto cpu_set = resolve_peak_flops(1.5, false, "");
  CHECK(cpu_set.tflops == 1.5);  // asked for: MFU on the CPU too

  auto table = resolve_peak_flops(0, true, "NVIDIA A100-SXM4-40GB");
  CHECK(table.tflops == 312);
  CHECK(table.source == "the peak table's A100");
  CHECK(describe_peak(table) == "MFU against 312 TFLOP/s (the peak table's A100)");

  auto unknown = resolve_peak_flops(0, true, "NVIDIA A10G");
  CHECK(unknown.tflops == 0);
  const auto line = describe_peak(unknown);
  CHECK(line.find("\xE2\x80\x94") != std::string::npos);  // "—"
  CHECK(line.find("\"NVIDIA A10G\"") != std::string::npos);
  CHECK(line.find("[logging] peak_tflops") != std::string::npos);

  auto cpu = resolve_peak_flops(0, false, "");
  CHECK(cpu.tflops == 0);
  CHECK(describe_peak(cpu).find("the CPU") != std::string::npos);
}

TEST_CASE("FLOPs a token by the PaLM formula, 6N + 12LCT") {
  const auto gpt2 = GPTConfig::preset("gpt2");
  CHECK(gpt2.num_parameters() == 124'475'904);
  CHECK(gpt2.flops_per_token(1024) == doctest::Approx(6.0 * 124'475'904 + 12.0 * 12 * 768 * 1024));
  CHECK(gpt2.flops_per_token(1024) / 1e6 == doctest::Approx(860.1).epsilon(1e-4));
}

TEST_CASE("the fused loss runs only where every condition holds, and the reason names the first that fails") {
  LossPathInputs all{.fused_built = true, .on_cuda = true, .dtype_supported = true, .chunk_rows = 0, .image_for_device = true};
  CHECK(choose_loss_path(all).fused);
  CHECK(choose_loss_path(all).why == "fused CUDA kernels");
  auto without = [&](auto change) {
    auto in = all;
    change(in);
    return choose_loss_path(in);
  };
  auto no_image = without([](LossPathInputs& in) { in.image_for_device = false; });  // a T4 with an sm_80+ build
  CHECK_FALSE(no_image.fused);
  CHECK(no_image.why.find("no image for this GPU") != std::string::npos);
  CHECK(no_image.why.find("PIPELINE_CUDA_ARCHITECTURES") != std::string::npos);
  auto not_built = without([](LossPathInputs& in) { in.fused_built = false; });
  CHECK_FALSE(not_built.fused);
  CHECK(not_built.why.find("no nvcc") != std::string::npos);
  CHECK_FALSE(without([](LossPathInputs& in) { in.on_cuda = false; }).fused);
  CHECK_FALSE(without([](LossPathInputs& in) { in.dtype_supported = false; }).fused);
  CHECK_FALSE(without([](LossPathInputs& in) { in.chunk_rows = 4096; }).fused);
}

TEST_CASE("on the CPU the fused kernel runs for fp32 logits on a CPU with AVX2 and FMA, unless chunks are asked for") {
  const LossPathInputs cpu{.on_cpu = true, .cpu_fp32 = true, .cpu_kernel_runs = true};
  CHECK(choose_loss_path(cpu).fused);
  CHECK(choose_loss_path(cpu).why == "fused CPU kernel (AVX2)");
  auto bf16 = cpu;
  bf16.cpu_fp32 = false;
  CHECK_FALSE(choose_loss_path(bf16).fused);
  CHECK(choose_loss_path(bf16).why.find("fp32") != std::string::npos);
  auto old_cpu = cpu;
  old_cpu.cpu_kernel_runs = false;
  CHECK_FALSE(choose_loss_path(old_cpu).fused);
  CHECK(choose_loss_path(old_cpu).why.find("AVX2") != std::string::npos);
  auto chunks = cpu;
  chunks.chunk_rows = 64;
  CHECK_FALSE(choose_loss_path(chunks).fused);
}

namespace {

// An event that records the order of the waits and reports a fixed time for each.
struct FakeEvent {
  int step;
  std::vector<int>* waited;
  std::chrono::nanoseconds wait() const {
    waited->push_back(step);
    return std::chrono::milliseconds(step);
  }
};

}  // namespace

TEST_CASE("before step N, train waits for step N-2 and no other") {
  std::vector<int> waited;
  RunAhead<FakeEvent> ahead;  // depth 2
  CHECK(ahead.before_step() == std::chrono::nanoseconds(0));  // step 1: nothing issued yet
  ahead.issued(std::make_shared<FakeEvent>(FakeEvent{1, &waited}));
  CHECK(ahead.before_step() == std::chrono::nanoseconds(0));  // step 2: step 0 does not exist
  CHECK(waited.empty());
  ahead.issued(std::make_shared<FakeEvent>(FakeEvent{2, &waited}));
  CHECK(ahead.before_step() == std::chrono::milliseconds(1));  // step 3 waits for step 1
  CHECK(waited == std::vector<int>{1});
  CHECK(ahead.pending() == 1);  // step 2 may still run while step 3 is issued
  ahead.issued(std::make_shared<FakeEvent>(FakeEvent{3, &waited}));
  ahead.issued(nullptr);  // a CPU step: nothing to wait for, nothing kept
  CHECK(ahead.before_step() == std::chrono::milliseconds(2));
  CHECK(waited == std::vector<int>{1, 2});

  std::vector<int> lockstep;
  RunAhead<FakeEvent> one(1);  // depth 1: each step waits for the one before
  one.issued(std::make_shared<FakeEvent>(FakeEvent{1, &lockstep}));
  one.before_step();
  CHECK(lockstep == std::vector<int>{1});
  CHECK(one.pending() == 0);
}
