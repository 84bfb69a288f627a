// The fused cross-entropy kernels for CUDA (cross_entropy_cuda.cu, built where CMake finds
// nvcc and LibTorch has CUDA: PIPELINE_HAVE_CUDA_LOSS). cross_entropy_real_vocab (gpt2.cpp)
// calls them on CUDA logits; this header keeps CUDA's and LibTorch's headers apart, so it
// speaks in raw pointers and a stream.
//
// Against ATen's ops, one pass of reads in forward and one of reads and writes in backward:
// the log-softmax, exp, gather, scatter and copies of the chunked path (about 13 ms of a GPT-2
// 124M step at 16x1024 on an H200) are not made.
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t

namespace pipeline::model::cuda_loss {

/// `rows` rows of logits, `row_stride` elements apart, the first `vocab` of each the real
/// vocabulary and `padded` of them in all; fp32 or bf16. targets: `rows` int64 ids on the device.
struct Rows {
  const void* logits = nullptr;
  bool bf16 = true;
  int64_t rows = 0, row_stride = 0, vocab = 0, padded = 0;
  const int64_t* targets = nullptr;
};

/// Per row: lse = log sum exp over the real vocabulary, row_loss = lse - logit[target], or 0 for
/// a target outside [0, vocab) (ignored, as PyTorch's ignore_index). A NaN logit makes its row's
/// lse and loss NaN. Enqueued on `stream`; throws if this launch fails (an error some earlier
/// call left pending is neither reported nor cleared).
void forward(const Rows& rows, float* lse, float* row_loss, CUstream_st* stream);

/// grad (rows x padded, contiguous, the logits' dtype) = (softmax - onehot(target)) * scale[0]
/// over the real vocabulary, 0 in the padded columns and in the rows of ignored targets.
/// scale is one fp32 on the device (the loss's incoming gradient over the rows counted, read by
/// the kernel: no host sync). A row whose lse is NaN gets NaN gradients.
void backward(const Rows& rows, const float* lse, const float* scale, void* grad, CUstream_st* stream);

/// Whether the kernels have code the current CUDA device can run (SASS for its architecture, or
/// PTX it can compile). A build for sm_80 and up has none for a T4 (sm_75): the caller then takes
/// the chunked path (loss_path.h). Launches nothing; leaves no error of its own pending.
bool has_image_for_current_device();

}  // namespace pipeline::model::cuda_loss
