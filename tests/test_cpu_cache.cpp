// The CPU block cache (model/device/cpu_block_cache.h): a training run gives the same losses bit
// for bit with and without it, large blocks come back to the next request of their size, small
// ones and raw allocations still work, and the blocks kept stay within their bound. The cache is
// process-wide once installed, so the run without it comes first, in the first test case.
#include <cstdlib>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "model/device/cpu_block_cache.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

namespace m = pipeline::model;
using namespace train_harness;

namespace {
// Small bounds, so that the test can cross them with a few tensors.
const m::CpuBlockCacheOptions kOptions{.min_bytes = size_t{1} << 20, .min_kept_bytes = size_t{8} << 20};

void install() {
  ::unsetenv("PIPELINE_CPU_ALLOC");
  REQUIRE(m::install_cpu_block_cache(kOptions));
}
}  // namespace

// First in the file, so that the peak in use is this case's own.
TEST_CASE("a step whose large tensors are not alive at once keeps them all: none is mapped again") {
  install();
  // Each step: a block of 16 MiB freed before one of 20 MiB is taken. The peak in use is about
  // 20 MiB, the blocks freed add up to 36: bounded by the peak alone, the older would be given
  // back every step and mapped again the next.
  auto step = [] {
    { auto x = torch::empty({int64_t{4} << 20}, torch::kFloat); x.fill_(1.0f); }
    { auto y = torch::empty({int64_t{5} << 20}, torch::kFloat); y.fill_(2.0f); }
  };
  step();
  const auto s0 = m::cpu_block_cache_stats();
  for (int k = 0; k < 5; ++k) step();
  const auto s1 = m::cpu_block_cache_stats();
  CHECK(s1.mapped == s0.mapped);
  CHECK(s1.unmapped == s0.unmapped);
  CHECK(s1.reused - s0.reused == 10);
}

TEST_CASE("a training run's losses are the same bit for bit with the cache as without it") {
  const auto root = temp_dir("cpu_cache");
  // The tiny model's logits (2 x 32 x 50304 fp32, 12.9 MB) and their gradient go through the cache.
  const auto before = run(tiny_config(root / "glibc", kTextInput), root / "glibc");
  REQUIRE(before.losses.size() == 8);
  install();
  const auto stats0 = m::cpu_block_cache_stats();
  const auto after = run(tiny_config(root / "cache", kTextInput), root / "cache");
  const auto stats1 = m::cpu_block_cache_stats();
  CHECK(after.losses == before.losses);
  // Every step after the first reuses the blocks the step before it freed.
  CHECK(stats1.requests - stats0.requests > 8 * 4);
  CHECK(stats1.reused - stats0.reused > (stats1.requests - stats0.requests) / 2);
  CHECK(stats1.unmapped == stats0.unmapped);  // no block given back to be mapped again
  MESSAGE("cache over 8 steps: " << stats1.requests - stats0.requests << " requests, " << stats1.reused - stats0.reused
                                 << " reused, " << stats1.mapped - stats0.mapped << " mapped");
}

TEST_CASE("a freed large block serves the next request of its size; small requests pass through") {
  install();
  void* first = nullptr;
  {
    auto t = torch::empty({3 << 20}, torch::kFloat);  // 12 MiB
    first = t.data_ptr();
  }
  const auto s0 = m::cpu_block_cache_stats();
  {
    auto t = torch::empty({3 << 20}, torch::kFloat);
    CHECK(t.data_ptr() == first);
    t.fill_(2.5f);
    CHECK(t.sum().item<double>() == doctest::Approx(2.5 * (3 << 20)));
  }
  const auto s1 = m::cpu_block_cache_stats();
  CHECK(s1.requests == s0.requests + 1);
  CHECK(s1.reused == s0.reused + 1);
  CHECK(s1.mapped == s0.mapped);
  // A small tensor is LibTorch's allocator's, not counted here.
  { auto small = torch::ones({1000}, torch::kFloat); CHECK(small.sum().item<float>() == 1000.0f); }
  CHECK(m::cpu_block_cache_stats().requests == s1.requests);
  // Blocks of 2 MiB and more sit on 2 MiB boundaries (huge pages).
  auto big = torch::empty({1 << 20}, torch::kFloat);  // 4 MiB
  CHECK(reinterpret_cast<uintptr_t>(big.data_ptr()) % (uintptr_t{2} << 20) == 0);
}

TEST_CASE("raw allocations, large and small, go back where they came from") {
  install();
  c10::Allocator* a = c10::GetCPUAllocator();
  const auto s0 = m::cpu_block_cache_stats();
  void* large = a->raw_allocate(size_t{5} << 20);
  void* small = a->raw_allocate(4096);
  std::memset(large, 1, size_t{5} << 20);
  std::memset(small, 1, 4096);
  CHECK(m::cpu_block_cache_stats().in_use_bytes == s0.in_use_bytes + (size_t{6} << 20));  // rounded to 2 MiB
  a->raw_deallocate(large);
  a->raw_deallocate(small);
  CHECK(m::cpu_block_cache_stats().in_use_bytes == s0.in_use_bytes);
}

TEST_CASE("the blocks kept never exceed twice the most ever in use at once (or the floor)") {
  install();
  // One block at a time, each of a new size: every one is kept when freed until the bound.
  for (int k = 0; k < 40; ++k) {
    auto t = torch::empty({(int64_t{1} << 19) * (k + 1) + 7}, torch::kFloat);  // 2 MiB x (k+1), and a bit
    t.zero_();
    const auto s = m::cpu_block_cache_stats();
    CHECK(s.kept_bytes <= std::max(m::kCpuBlocksKeptPerPeak * s.peak_in_use_bytes, kOptions.min_kept_bytes));
  }
  const auto s = m::cpu_block_cache_stats();
  CHECK(s.kept_bytes <= std::max(m::kCpuBlocksKeptPerPeak * s.peak_in_use_bytes, kOptions.min_kept_bytes));
  CHECK(s.unmapped > 0);
}
