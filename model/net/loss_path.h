// Which cross-entropy runs for a batch of logits: the fused CUDA kernels
// (cross_entropy_cuda.h) or the chunked ATen path (gpt2.cpp), and why. Torch-free, so that the
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
};

struct LossPath {
  bool fused = false;
  std::string why;  // one phrase: "fused CUDA kernels" or "chunked ATen ops (no kernel image for this GPU)"
};

/// The fused kernels when every condition holds, the chunked path otherwise, with the first
/// reason that ruled the kernels out.
LossPath choose_loss_path(const LossPathInputs& in);

}  // namespace pipeline::model
