// See cross_entropy_cpu.h. This file alone is compiled for AVX2 and FMA (model/CMakeLists.txt),
// with ATen's vectors in their AVX2 form (CPU_CAPABILITY=AVX2, as ATen compiles its own kernels
// for that capability); nothing here runs unless runs_here() said yes.
#include "model/net/cross_entropy_cpu.h"

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace pipeline::model::cpu_loss {
namespace {

using Vec = at::vec::Vectorized<float>;

// The largest of z[0:n], NaN when any is NaN.
float row_max(const float* z, int64_t n) {
  Vec acc(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(z + j));
  float lanes[Vec::size()];
  acc.store(lanes);
  float m = -std::numeric_limits<float>::infinity();
  for (float v : lanes) m = (std::isnan(v) || std::isnan(m)) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, v);
  for (; j < n; ++j) m = (std::isnan(z[j]) || std::isnan(m)) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, z[j]);
  return m;
}

// The sum of exp(z[j] - m) over j < n, m finite and no z[j] above it; when `out` is given, each
// term written to out[j]. The vectors' exp is ATen's exp_u20 (a degree-5 polynomial after range
// reduction, within about 2e-6 of the true value, an exp of a value below log(FLT_MIN) flushed to
// zero): a third faster over a row than the Sleef exp within 1 ulp, which made this loop the
// kernel's cost (44 ms against 28 ms for the quick start's 1024 rows of 50,304, 2 threads). It
// maps NaN to a finite value, so a row whose maximum is not finite never comes here (rows()).
float row_sum_exp(const float* z, int64_t n, float m, float* out) {
  const Vec vm(m);
  Vec acc(0.0f);
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) {
    const Vec e = (Vec::loadu(z + j) - vm).exp_u20();
    if (out) e.store(out + j);
    acc = acc + e;
  }
  float lanes[Vec::size()];
  acc.store(lanes);
  float s = 0.0f;
  for (float v : lanes) s += v;
  for (; j < n; ++j) {
    const float e = std::exp(z[j] - m);
    if (out) out[j] = e;
    s += e;
  }
  return s;
}

void row_scale(float* g, int64_t n, float k) {
  const Vec vk(k);
  int64_t j = 0;
  for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(g + j) * vk).store(g + j);
  for (; j < n; ++j) g[j] *= k;
}

}  // namespace

bool runs_here() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

void rows(const Rows& in, float* row_loss, float* grad, float scale, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const float* z = in.logits + r * in.stride;
    float* g = grad ? grad + r * in.padded : nullptr;
    if (g && in.padded > in.vocab)  // the padded columns never take a gradient
      std::memset(g + in.vocab, 0, static_cast<size_t>(in.padded - in.vocab) * sizeof(float));
    const int64_t t = in.targets[r];
    if (t < 0 || t >= in.vocab) {  // ignored: no loss, no gradient
      row_loss[r] = 0.0f;
      if (g) std::memset(g, 0, static_cast<size_t>(in.vocab) * sizeof(float));
      continue;
    }
    const float m = row_max(z, in.vocab);
    if (!std::isfinite(m)) {  // a NaN or +inf logit, or none above -inf: NaN loss and gradient, as log_softmax gives
      row_loss[r] = std::numeric_limits<float>::quiet_NaN();
      if (g) std::fill(g, g + in.vocab, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const float s = row_sum_exp(z, in.vocab, m, g);  // g holds exp(z - m) after this
    row_loss[r] = (m + std::log(s)) - z[t];
    if (!g) continue;
    row_scale(g, in.vocab, scale / s);
    g[t] -= scale;
  }
}

}  // namespace pipeline::model::cpu_loss
