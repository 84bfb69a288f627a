// HellaSwag scoring, as GPT-2 reproductions compute it (build-nanogpt's hellaswag.py, llm.c): for
// each item, the model reads context + ending for each of its 4 endings (datasets/eval/hellaswag.h:
// tokenized apart, cut from the left to the model's context, the ending whole) and an ending's
// score is the cross-entropy of its tokens given what precedes them. acc_norm picks the ending
// with the lowest mean, acc the lowest sum (the first of equal ones).
//
// Items are batched: the 4 rows of several items go through the model in one forward pass, padded
// on the right to the longest row (a causal model's positions never see what follows, so padding
// changes nothing before it, and padded positions are never scored). Only the scored positions
// are projected onto the vocabulary (GPT::features), so the head's cost follows the endings'
// tokens, not the batch's. The losses stay on the device until the last batch: one transfer.
#pragma once

#include <cstdint>
#include <vector>

#include "datasets/eval/hellaswag.h"
#include "model/net/gpt2.h"

namespace pipeline::model {

struct HellaSwagOptions {
  int64_t items = 0;            // the first `items` of the set (0: all)
  int64_t batch_tokens = 8192;  // rows x padded length per forward pass, at least one item's 4 rows
};

struct HellaSwagResult {
  int64_t n = 0;             // items scored
  int64_t correct = 0;       // by acc (sum)
  int64_t correct_norm = 0;  // by acc_norm (mean)
  std::vector<int8_t> predictions;  // acc_norm's predicted ending, per item in file order
  double acc() const { return n ? static_cast<double>(correct) / static_cast<double>(n) : 0; }
  double acc_norm() const { return n ? static_cast<double>(correct_norm) / static_cast<double>(n) : 0; }
};

/// Scores the set with `model` on its parameters' device, in eval mode and without gradients,
/// under whatever autocast the calling thread has set. Throws (naming the file and line) when an
/// ending does not fit the model's context. Waits for the device at the end (one copy back).
HellaSwagResult score_hellaswag(GPT& model, const datasets::HellaSwagSet& set, const HellaSwagOptions& options = {});

/// The two halves of score_hellaswag, for a caller that fetches the losses itself (the eval
/// stage: a non-blocking copy and an event it waits for off the device). The device half enqueues
/// every forward pass on the current stream and returns without waiting:
struct HellaSwagLosses {
  torch::Tensor sums;           // (4n) fp32: each row's summed ending loss, item-major
  std::vector<int64_t> counts;  // (4n): each row's ending tokens
};
HellaSwagLosses hellaswag_losses(GPT& model, const datasets::HellaSwagSet& set, const HellaSwagOptions& options = {});
/// The host half: predictions and accuracy from the losses, their sums on the host.
HellaSwagResult hellaswag_result(const datasets::HellaSwagSet& set, const HellaSwagLosses& host);

}  // namespace pipeline::model
