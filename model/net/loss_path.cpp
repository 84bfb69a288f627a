// See loss_path.h.
#include "model/net/loss_path.h"

namespace pipeline::model {

LossPath choose_loss_path(const LossPathInputs& in) {
  const std::string chunked = "chunked ATen ops";
  if (!in.on_cuda) return {false, chunked + " (not on CUDA)"};
  if (!in.fused_built) return {false, chunked + " (this build has no fused kernels: CMake found no nvcc)"};
  if (!in.dtype_supported) return {false, chunked + " (the fused kernels take fp32 or bf16 logits)"};
  if (in.chunk_rows > 0) return {false, chunked + " (chunk_rows was given)"};
  if (!in.image_for_device)
    return {false, chunked + " (the fused kernels have no image for this GPU's architecture: rebuild with it in "
                             "PIPELINE_CUDA_ARCHITECTURES)"};
  return {true, "fused CUDA kernels"};
}

}  // namespace pipeline::model
