// The fused cross-entropy on CUDA (cross_entropy_cuda.h): one block per row of logits.
//
// Forward reads a row once, keeping a running (max, sum of exp) per thread (the online softmax),
// merges those across the block, and writes the row's log-sum-exp and its loss. Backward reads
// the row again and writes (softmax - onehot) * grad_out / N straight into the gradient, zero in
// the padded columns. Every value is computed in fp32; the logits are read 16 bytes at a time
// where the rows are aligned for it. Nothing here allocates, syncs or touches the host, so both
// kernels can be captured into CUDA graphs.
#include "model/cross_entropy_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <stdexcept>
#include <string>

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

// (m, s) summarizes values x_i as m = max x_i, s = sum exp(x_i - m). Merging two summaries
// rescales both sums to the larger maximum. Two empty summaries (m = -inf) stay empty.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
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
        mx = fmaxf(mx, x[k]);
      }
      float sum = 0.0f;
      if (mx != -CUDART_INF_F) {
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
    row_loss[r] = t >= 0 && t < vocab ? l - to_float(row[t]) : CUDART_NAN_F;  // a bad id: NaN, never a read outside
  }
}

template <class T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ logits, int64_t row_stride, const int64_t* __restrict__ targets,
                    const float* __restrict__ lse, const float* __restrict__ grad_out, float inv_rows, int64_t vocab,
                    int64_t padded, T* __restrict__ grad) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * row_stride;
  T* out = grad + r * padded;
  const float scale = grad_out[0] * inv_rows, l = lse[r];
  const int64_t t = targets[r];
  auto value = [&](int64_t c, float x) {
    if (c >= vocab) return 0.0f;  // padded columns never take probability mass
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

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("cross-entropy kernel (") + what + "): " + cudaGetErrorString(e));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T>
void forward_as(const Rows& rows, float* lse, float* row_loss, cudaStream_t stream) {
  const auto* logits = static_cast<const T*>(rows.logits);
  const bool vector = aligned16(logits) && (rows.row_stride * sizeof(T)) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(rows.rows)), block(kThreads);
  if (vector)
    forward_kernel<T, true><<<grid, block, 0, stream>>>(logits, rows.row_stride, rows.targets, rows.vocab, lse, row_loss);
  else
    forward_kernel<T, false><<<grid, block, 0, stream>>>(logits, rows.row_stride, rows.targets, rows.vocab, lse, row_loss);
  check_launch("forward");
}

template <class T>
void backward_as(const Rows& rows, const float* lse, const float* grad_out, float inv_rows, void* grad_out_rows,
                 cudaStream_t stream) {
  const auto* logits = static_cast<const T*>(rows.logits);
  auto* grad = static_cast<T*>(grad_out_rows);
  const bool vector = aligned16(logits) && aligned16(grad) && (rows.row_stride * sizeof(T)) % 16 == 0 &&
                      (rows.padded * sizeof(T)) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(rows.rows)), block(kThreads);
  if (vector)
    backward_kernel<T, true><<<grid, block, 0, stream>>>(logits, rows.row_stride, rows.targets, lse, grad_out, inv_rows,
                                                         rows.vocab, rows.padded, grad);
  else
    backward_kernel<T, false><<<grid, block, 0, stream>>>(logits, rows.row_stride, rows.targets, lse, grad_out, inv_rows,
                                                          rows.vocab, rows.padded, grad);
  check_launch("backward");
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

void backward(const Rows& rows, const float* lse, const float* grad_out, float inv_rows, void* grad, CUstream_st* stream) {
  check_rows(rows);
  if (rows.bf16) backward_as<__nv_bfloat16>(rows, lse, grad_out, inv_rows, grad, stream);
  else backward_as<float>(rows, lse, grad_out, inv_rows, grad, stream);
}

}  // namespace pipeline::model::cuda_loss
