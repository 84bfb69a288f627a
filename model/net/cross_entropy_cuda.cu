// The fused cross-entropy on CUDA (cross_entropy_cuda.h): one block per row of logits.
//
// Forward reads a row once, keeping a running (max, sum of exp) per thread (the online softmax),
// merges those across the block, and writes the row's log-sum-exp and its loss. Backward reads
// the row again and writes (softmax - onehot) * scale straight into the gradient, zero in the
// padded columns. Every value is computed in fp32; the logits are read 16 bytes at a time where
// the rows are aligned for it. Nothing here allocates, syncs or touches the host, so both kernels
// can be captured into CUDA graphs.
//
// NaN propagates: a NaN logit makes its row's log-sum-exp, loss and every gradient of the row
// NaN (fmaxf alone would drop it from the maximum, and a pack whose maximum came out -inf would
// be left out of the sum: a finite loss over NaN gradients). A row whose target is outside
// [0, vocab) is ignored, as PyTorch's ignore_index: loss 0, gradient 0, and the caller leaves it
// out of the mean (gpt2.cpp counts the rows it keeps).
#include "model/net/cross_entropy_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <stdexcept>
#include <string>
#include <tuple>

namespace pipeline::model::cuda_loss {

namespace {

constexpr int kThreads = 512;  // per block (one row); 16 warps

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// Values of T in one 16-byte load.
template <class T>
constexpr int kPack = 16 / static_cast<int>(sizeof(T));

// The larger of a and b, or NaN when either is (fmaxf returns the other operand).
__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || b != b) ? CUDART_NAN_F : fmaxf(a, b); }

// (m, s) summarizes values x_i as m = max x_i, s = sum exp(x_i - m). Merging two summaries
// rescales both sums to the larger maximum. Two empty summaries (m = -inf) stay empty; a NaN in
// either makes both NaN.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = max_nan(m, m2);
  if (mx == -CUDART_INF_F) return;
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// Merges every thread's (m, s) across the block; every thread gets the result.
__device__ void block_merge(float& m, float& s) {
  __shared__ float warp_m[32], warp_s[32];
  for (int off = 16; off > 0; off >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  m = lane < warps ? warp_m[lane] : -CUDART_INF_F;
  s = lane < warps ? warp_s[lane] : 0.0f;
  for (int off = 16; off > 0; off >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
}

template <class T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ logits, int64_t row_stride, const int64_t* __restrict__ targets, int64_t vocab,
                   float* __restrict__ lse, float* __restrict__ row_loss) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * row_stride;
  float m = -CUDART_INF_F, s = 0.0f;
  int64_t tail = 0;
  if constexpr (kVector) {
    constexpr int n = kPack<T>;
    const int64_t packs = vocab / n;
    const uint4* packed = reinterpret_cast<const uint4*>(row);
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const uint4 raw = __ldg(packed + i);
      const T* v = reinterpret_cast<const T*>(&raw);
      float x[n], mx = -CUDART_INF_F;
#pragma unroll
      for (int k = 0; k < n; ++k) {
        x[k] = to_float(v[k]);
        mx = max_nan(mx, x[k]);
      }
      float sum = 0.0f;
      if (mx != -CUDART_INF_F) {  // NaN included: exp(x - NaN) is NaN
#pragma unroll
        for (int k = 0; k < n; ++k) sum += __expf(x[k] - mx);
      }
      merge(m, s, mx, sum);
    }
    tail = packs * n;
  }
  for (int64_t c = tail + threadIdx.x; c < vocab; c += blockDim.x) {
    const float x = to_float(row[c]);
    merge(m, s, x, x == -CUDART_INF_F ? 0.0f : 1.0f);
  }
  block_merge(m, s);
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    lse[r] = l;
    const int64_t t = targets[r];
    row_loss[r] = t >= 0 && t < vocab ? l - to_float(row[t]) : 0.0f;  // ignored: no loss, never a read outside
  }
}

template <class T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ logits, int64_t row_stride, const int64_t* __restrict__ targets,
                    const float* __restrict__ lse, const float* __restrict__ scale_in, int64_t vocab,
                    int64_t padded, T* __restrict__ grad) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * row_stride;
  T* out = grad + r * padded;
  const int64_t t = targets[r];
  const bool kept = t >= 0 && t < vocab;  // an ignored row: gradient 0
  const float scale = scale_in[0], l = lse[r];
  auto value = [&](int64_t c, float x) {
    if (c >= vocab || !kept) return 0.0f;  // padded columns never take probability mass
    return (__expf(x - l) - (c == t ? 1.0f : 0.0f)) * scale;
  };
  int64_t tail = 0;
  if constexpr (kVector) {
    constexpr int n = kPack<T>;
    const int64_t packs = padded / n;
    const uint4* in = reinterpret_cast<const uint4*>(row);
    uint4* dst = reinterpret_cast<uint4*>(out);
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const uint4 raw = __ldg(in + i);
      const T* v = reinterpret_cast<const T*>(&raw);
      uint4 result;
      T* g = reinterpret_cast<T*>(&result);
#pragma unroll
      for (int k = 0; k < n; ++k) g[k] = from_float<T>(value(i * n + k, to_float(v[k])));
      dst[i] = result;
    }
    tail = packs * n;
  }
  for (int64_t c = tail + threadIdx.x; c < padded; c += blockDim.x) out[c] = from_float<T>(value(c, to_float(row[c])));
}

// Launches `kernel` and throws if this launch failed. Its status is the launch's own return value,
// not cudaGetLastError, which would blame this kernel for an error an earlier, unrelated call left
// pending. A launch that succeeds leaves such an error pending for its owner. CUDA keeps one
// pending error a thread, and a call that fails replaces it: so when the launch fails, its error
// (which the exception reports) is cleared, or its next reader would report it a second time, and
// an earlier error it replaced, which the runtime no longer holds, is named in the same message.
template <class... Params, class... Args>
void launch(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
  std::tuple<Params...> values(args...);  // each as the kernel's parameter type, as <<<>>> converts it
  void* argv[sizeof...(Params)];
  std::apply([&](auto&... v) {
    int i = 0;
    ((argv[i++] = static_cast<void*>(&v)), ...);
  }, values);
  const cudaError_t earlier = cudaPeekAtLastError();
  const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, argv, 0, stream);
  if (e == cudaSuccess) return;
  if (cudaPeekAtLastError() == e) (void)cudaGetLastError();  // (a sticky error stays: the context is lost)
  throw std::runtime_error(std::string("cross-entropy kernel (") + what + "): " + cudaGetErrorString(e) +
                           (earlier != cudaSuccess ? std::string(" (an earlier CUDA error was pending: ") +
                                                         cudaGetErrorString(earlier) + ")"
                                                   : std::string()));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T>
void forward_as(const Rows& rows, float* lse, float* row_loss, cudaStream_t stream) {
  const auto* logits = static_cast<const T*>(rows.logits);
  const bool vector = aligned16(logits) && (rows.row_stride * sizeof(T)) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(rows.rows)), block(kThreads);
  launch("forward", vector ? forward_kernel<T, true> : forward_kernel<T, false>, grid, block, stream, logits,
         rows.row_stride, rows.targets, rows.vocab, lse, row_loss);
}

template <class T>
void backward_as(const Rows& rows, const float* lse, const float* scale, void* grad_out_rows, cudaStream_t stream) {
  const auto* logits = static_cast<const T*>(rows.logits);
  auto* grad = static_cast<T*>(grad_out_rows);
  const bool vector = aligned16(logits) && aligned16(grad) && (rows.row_stride * sizeof(T)) % 16 == 0 &&
                      (rows.padded * sizeof(T)) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(rows.rows)), block(kThreads);
  launch("backward", vector ? backward_kernel<T, true> : backward_kernel<T, false>, grid, block, stream, logits,
         rows.row_stride, rows.targets, lse, scale, rows.vocab, rows.padded, grad);
}

void check_rows(const Rows& rows) {
  if (rows.rows < 1 || rows.rows > 0x7fffffff || rows.vocab < 1 || rows.vocab > rows.padded || rows.row_stride < rows.padded)
    throw std::invalid_argument("cross-entropy kernel: " + std::to_string(rows.rows) + " rows of " +
                                std::to_string(rows.padded) + " (stride " + std::to_string(rows.row_stride) +
                                ", vocab " + std::to_string(rows.vocab) + ") is not a shape it takes");
}

}  // namespace

void forward(const Rows& rows, float* lse, float* row_loss, CUstream_st* stream) {
  check_rows(rows);
  if (rows.bf16) forward_as<__nv_bfloat16>(rows, lse, row_loss, stream);
  else forward_as<float>(rows, lse, row_loss, stream);
}

void backward(const Rows& rows, const float* lse, const float* scale, void* grad, CUstream_st* stream) {
  check_rows(rows);
  if (rows.bf16) backward_as<__nv_bfloat16>(rows, lse, scale, grad, stream);
  else backward_as<float>(rows, lse, scale, grad, stream);
}

bool has_image_for_current_device() {
  // Every instantiation is in the same fat binary: one answers for all. A device the binary has
  // no code for (neither its SASS nor PTX it can compile) answers cudaErrorNoKernelImageForDevice
  // (or cudaErrorInvalidDeviceFunction); this query launches nothing. Its answer is its return
  // value: an error it fails with is cleared (it is an answer, not a fault), and an error an earlier
  // call left pending stays pending when it succeeds; when it fails, CUDA's one pending error had
  // become the query's, so that earlier one is gone, as it is after any CUDA call that fails.
  cudaFuncAttributes attributes;
  const cudaError_t e = cudaFuncGetAttributes(&attributes, forward_kernel<float, false>);
  if (e != cudaSuccess && cudaPeekAtLastError() == e) (void)cudaGetLastError();
  return e == cudaSuccess;
}

}  // namespace pipeline::model::cuda_loss
