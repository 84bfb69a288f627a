// The cross-entropy over fp32 logits on the CPU, with its gradient, in one walk over each row:
// the row's maximum, then exp(z - max) written straight into the gradient while it is summed,
// then the gradient scaled in place while the row is still in cache. Each row's logits are read
// from memory once and its gradient written once, where ATen's log_softmax, its backward and
// the copies around them walk the (B*T, V) logits six or seven times (206 MB each at the quick
// start's 8x128). Compiled for AVX2 and FMA (ATen's vectorized exp); runs_here() tells whether
// this CPU has them, and gpt2.cpp falls back to the chunked ATen ops where it does not.
//
// Semantics are those of the chunked path (gpt2.cpp): softmax over the first `vocab` columns of
// rows `padded` wide; a target outside [0, vocab) is ignored (no loss, zero gradient); a NaN or
// +inf logit (or a row all -inf) makes its row's loss and gradient NaN, as log_softmax does. The
// exp is ATen's fast one (within about 2e-6), not the one within 1 ulp: tests/test_model.cpp holds
// the kernel to the sliced ATen form at 1e-6 in the loss and 1e-5 in the gradients.
#pragma once

#include <cstdint>

namespace pipeline::model::cpu_loss {

/// Whether this CPU runs the kernel (AVX2 and FMA).
bool runs_here();

struct Rows {
  const float* logits = nullptr;  // row r at logits + r * stride, `padded` columns of which `vocab` count
  int64_t stride = 0;
  int64_t vocab = 0;
  int64_t padded = 0;
  const int64_t* targets = nullptr;  // one per row
};

/// Rows [begin, end): row_loss[r] = logsumexp(z_r[:vocab]) - z_r[target_r] (0 for an ignored row)
/// and, when `grad` is given (row r at grad + r * padded), grad_r = scale * (softmax(z_r[:vocab]) -
/// onehot(target_r)), zero in the padded columns and in ignored rows. Rows are independent: call it
/// on disjoint ranges from several threads.
void rows(const Rows& in, float* row_loss, float* grad, float scale, int64_t begin, int64_t end);

}  // namespace pipeline::model::cpu_loss
