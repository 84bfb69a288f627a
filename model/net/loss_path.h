// Which cross-entropy runs for a batch of logits: the fused CUDA kernels (cross_entropy_cuda.h),
// the fused CPU kernel (cross_entropy_cpu.h) or the chunked ATen path (gpt2.cpp), and why. Torch-free, so that the
// choice is tested on a machine without a GPU (tests/test_device_logic.cpp); gpt2.cpp asks the
// questions (is the build's kernel image loadable on this device?) and this answers.
#pragma once

#include <cstdint>
#include <string>

namespace pipeline::model {

struct LossPathInputs {
  bool fused_built = false;      // this build has the kernels (PIPELINE_HAVE_CUDA_LOSS)
  bool on_cuda = false;          // the logits are on a CUDA device
  bool dtype_supported = false;  // fp32 or bf16 logits
  int64_t chunk_rows = 0;        // > 0: the caller asked for the chunked path
  bool image_for_device = false; // the kernels have code this device can run (cuda_loss::runs_here)
  bool on_cpu = false;           // the logits are on the CPU
  bool cpu_fp32 = false;         // ... in fp32 (the CPU kernel's only dtype)
  bool cpu_kernel_runs = false;  // this CPU runs the CPU kernel (AVX2 and FMA: cpu_loss::runs_here)
};

struct LossPath {
  bool fused = false;  // a fused kernel: CUDA's on CUDA, the CPU's on the CPU
  std::string why;     // one phrase: "fused CUDA kernels", "chunked ATen ops (no kernel image for this GPU)"
};

/// The fused kernels of the logits' device when every condition holds, the chunked path
/// otherwise, with the first reason that ruled the kernels out.
LossPath choose_loss_path(const LossPathInputs& in);

}  // namespace pipeline::model
