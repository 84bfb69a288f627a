// See loss_path.h.
#include "model/net/loss_path.h"

namespace pipeline::model {

LossPath choose_loss_path(const LossPathInputs& in) {
  const std::string chunked = "chunked ATen ops";
  if (in.on_cpu) {
    if (in.chunk_rows > 0) return {false, chunked + " (chunk_rows was given)"};
    if (!in.cpu_fp32) return {false, chunked + " (the CPU kernel takes fp32 logits)"};
    if (!in.cpu_kernel_runs) return {false, chunked + " (this CPU lacks AVX2 and FMA, which the CPU kernel needs)"};
    return {true, "fused CPU kernel (AVX2)"};
  }
  if (!in.on_cuda) return {false, chunked + " (neither CUDA nor the CPU)"};
  if (!in.fused_built) return {false, chunked + " (this build has no fused kernels: CMake found no nvcc)"};
  if (!in.dtype_supported) return {false, chunked + " (the fused kernels take fp32 or bf16 logits)"};
  if (in.chunk_rows > 0) return {false, chunked + " (chunk_rows was given)"};
  if (!in.image_for_device)
    return {false, chunked + " (the fused kernels have no image for this GPU's architecture: rebuild with it in "
                             "PIPELINE_CUDA_ARCHITECTURES)"};
  return {true, "fused CUDA kernels"};
}

}  // namespace pipeline::model
