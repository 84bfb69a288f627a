// NVTX3 ranges: what Nsight Systems shows on each thread's timeline next to the kernels (every
// stage invocation under the stage's name; train's forward, backward and optimizer step; eval's
// and checkpoint's work). NVTX3 is header-only; CMake finds it in the torch wheel
// (nvidia/cu13/include) or the CUDA toolkit and passes its path as PIPELINE_NVTX3_HEADER.
// Without it (or in the sanitizer and fuzz builds) a range compiles to nothing, so graph/ and
// datasets/ keep building without CUDA. With it and no profiler attached, a range costs a
// check of a function pointer that NVTX leaves null.
#pragma once

#ifdef PIPELINE_NVTX3_HEADER
#include PIPELINE_NVTX3_HEADER
#endif

namespace pipeline {

/// A range on the calling thread's NVTX stack, from construction to destruction. `name` is
/// copied by the profiler when it records the range; it need not outlive the call.
///
/// Example:
///   { NvtxRange range("forward"); auto logits = model->forward(x); }
class NvtxRange {
 public:
#ifdef PIPELINE_NVTX3_HEADER
  explicit NvtxRange(const char* name) noexcept { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
#else
  explicit NvtxRange(const char*) noexcept {}
#endif
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

/// True when ranges are compiled in (this build found the NVTX3 headers).
constexpr bool nvtx_enabled() {
#ifdef PIPELINE_NVTX3_HEADER
  return true;
#else
  return false;
#endif
}

}  // namespace pipeline
