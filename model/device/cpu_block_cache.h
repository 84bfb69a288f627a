// LibTorch's CPU allocator, with its large blocks kept across steps. A training step on the CPU
// allocates the same large tensors every step (the logits and the loss's gradient alone are
// B*T*V*4 bytes, 206 MB for the quick start's 8x128), and glibc's malloc hands every block over
// its mmap ceiling (32 MiB at most) straight back to the kernel when it is freed: the next step
// maps it afresh and faults in every page, which the kernel zeroes first. That was a quarter of
// the quick start's CPU time (3.6 million minor faults in 30 steps). This allocator keeps freed
// blocks of at least `min_bytes` and hands them out again to requests of the same rounded size, so
// a step reuses the pages the step before it touched; blocks of 2 MiB and more are mapped on
// 2 MiB boundaries and advised as transparent huge pages (fewer faults and TLB misses where they
// must be mapped). Smaller requests go to LibTorch's own allocator, as before.
//
// Bounds: the free blocks kept never exceed twice the most bytes the cache's blocks held in use
// at once (at least `min_kept_bytes`), so memory stays within three times the working set of
// large tensors; past that, the blocks freed longest ago are unmapped. Twice, because a step's
// large tensors are not all alive at once: bounded by the peak itself, a step unmapped one of its
// blocks and mapped it again every step. What is computed never changes:
// only where a tensor's bytes live.
//
// c10 keeps one CPU allocator per process and tensors may be freed on any thread until the
// process exits, so the cache is the one object of the process that is never destroyed:
// install_cpu_block_cache() makes it, once, and registers it with c10. PIPELINE_CPU_ALLOC=glibc in
// the environment leaves LibTorch's allocator in place (for comparisons).
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>

namespace pipeline::model {

/// The free blocks kept are bounded by this many times the peak in use (see above).
inline constexpr size_t kCpuBlocksKeptPerPeak = 2;

struct CpuBlockCacheOptions {
  size_t min_bytes = size_t{1} << 20;        // smaller requests go to LibTorch's allocator
  size_t min_kept_bytes = size_t{256} << 20;  // free blocks kept even when less was ever in use
};

struct CpuBlockCacheStats {
  uint64_t requests = 0;     // allocations of min_bytes or more
  uint64_t reused = 0;       // of them, served by a kept block
  uint64_t mapped = 0;       // blocks mapped from the kernel
  uint64_t unmapped = 0;     // kept blocks given back past the bound
  size_t in_use_bytes = 0;   // in blocks handed out now
  size_t peak_in_use_bytes = 0;
  size_t kept_bytes = 0;     // in free blocks kept
};

/// Registers the cache as LibTorch's CPU allocator (once per process; later calls change
/// nothing) unless PIPELINE_CPU_ALLOC=glibc. Returns whether it is installed.
bool install_cpu_block_cache(const CpuBlockCacheOptions& options = {});

/// The installed cache's figures (all zero when it is not installed).
CpuBlockCacheStats cpu_block_cache_stats();

}  // namespace pipeline::model
