// HellaSwag scoring (see hellaswag.h).
#include "model/eval/hellaswag.h"

#include <algorithm>

namespace pipeline::model {

namespace {

// Scored positions projected onto the vocabulary at a time. On a GPU, 512 (512 x 50304 fp32
// logits are 103 MB, from the caching allocator). On the CPU, as many as keep a (k, V) fp32 block
// within 16 MiB (83 for GPT-2's vocabulary): glibc serves larger blocks with mmap and unmaps
// them when freed, so every chunk would fault its pages in afresh (the whole split spent as much
// time in the kernel as in the model); smaller ones come back from the heap.
int64_t head_chunk(const torch::Device& device, int64_t vocab) {
  if (device.is_cuda()) return 512;
  constexpr int64_t kCpuBlockBytes = int64_t{16} << 20;
  return std::max<int64_t>(1, kCpuBlockBytes / (vocab * static_cast<int64_t>(sizeof(float))));
}

// One forward pass: the rows of items [first, end).
struct Pass {
  int64_t first = 0, end = 0;
  int64_t length = 0;  // the longest row's input, all its tokens but the last: every row is padded to it
  std::vector<datasets::HellaSwagRow> rows;
};

// The next pass from item `first` on: whole items while rows x input length stays within the
// budget (at least one item).
Pass next_pass(const datasets::HellaSwagSet& set, int64_t first, int64_t n, int64_t block_size, int64_t budget) {
  Pass p;
  p.first = p.end = first;
  while (p.end < n) {
    std::vector<datasets::HellaSwagRow> rows;
    int64_t length = p.length;
    for (int e = 0; e < 4; ++e) {
      rows.push_back(datasets::hellaswag_row(set.items[static_cast<size_t>(p.end)], e, block_size));
      length = std::max<int64_t>(length, static_cast<int64_t>(rows.back().tokens.size()) - 1);
    }
    if (p.end > first && static_cast<int64_t>(p.rows.size() + 4) * length > budget) break;
    p.rows.insert(p.rows.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
    p.length = length;
    ++p.end;
  }
  return p;
}

// `v` as a tensor on `device`. On a GPU through pinned memory and a non-blocking copy: a copy from
// pageable memory first waits for the work queued before it (the previous pass), spinning the
// calling thread, where this one enqueues every pass and the caller then sleeps on one event. The
// pinned block goes back to the caching host allocator only once the copy has run (the copy
// records an event on it).
torch::Tensor to_device(const std::vector<int64_t>& v, const torch::Device& device) {
  const auto opts = torch::TensorOptions().dtype(torch::kLong);
  if (!device.is_cuda()) return torch::tensor(v, opts);
  auto host = torch::empty({static_cast<int64_t>(v.size())}, opts.pinned_memory(true));
  std::copy(v.begin(), v.end(), host.data_ptr<int64_t>());
  return host.to(device, /*non_blocking=*/true);
}

// The lowest of four scores, the first of equal ones.
int lowest(const double* s) {
  int best = 0;
  for (int e = 1; e < 4; ++e)
    if (s[e] < s[best]) best = e;
  return best;
}

}  // namespace

HellaSwagLosses hellaswag_losses(GPT& model, const datasets::HellaSwagSet& set, const HellaSwagOptions& options) {
  const GPTConfig& cfg = model->config();
  datasets::check_hellaswag_fits(set, cfg.block_size);
  const auto total = static_cast<int64_t>(set.items.size());
  const int64_t n = options.items > 0 ? std::min(options.items, total) : total;
  const torch::Device device = model->wte->weight.device();

  torch::NoGradGuard no_grad;
  const bool training = model->is_training();
  model->eval();
  HellaSwagLosses out;
  out.sums = torch::zeros({4 * n}, torch::TensorOptions().dtype(torch::kFloat).device(device));  // (4n)
  out.counts.resize(static_cast<size_t>(4 * n));
  for (int64_t first = 0; first < n;) {
    Pass p = next_pass(set, first, n, cfg.block_size, options.batch_tokens);
    const auto R = static_cast<int64_t>(p.rows.size()), L = p.length;
    // Each scored token: the flat position that predicts it, its id, and its slot in a (R, L)
    // grid of per-row losses (summed per row in a fixed order: deterministic, unlike index_add_).
    // A row's last token is a target only: the model reads the tokens before it.
    std::vector<int64_t> ids(static_cast<size_t>(R * L), 0), from, target, slot;
    for (int64_t r = 0; r < R; ++r) {
      const auto& row = p.rows[static_cast<size_t>(r)];
      std::copy(row.tokens.begin(), row.tokens.end() - 1, ids.begin() + r * L);
      for (size_t t = row.ending_begin; t < row.tokens.size(); ++t) {
        from.push_back(r * L + static_cast<int64_t>(t) - 1);
        target.push_back(row.tokens[t]);
        slot.push_back(r * L + static_cast<int64_t>(t - row.ending_begin));
      }
      out.counts[static_cast<size_t>(4 * p.first + r)] = static_cast<int64_t>(row.tokens.size() - row.ending_begin);
    }
    auto x = to_device(ids, device).view({R, L});  // (R, L)
    auto features = model->features(x);            // (R, L, C)
    auto scored = features.view({R * L, cfg.n_embd}).index_select(0, to_device(from, device));  // (N, C)
    auto targets = to_device(target, device);                                                   // (N)
    // The head and the softmax a chunk of positions at a time: (chunk, V) fp32 logits, not (N, V).
    const auto N = static_cast<int64_t>(target.size());
    const int64_t chunk = head_chunk(device, model->wte->weight.size(0));
    auto losses = torch::empty({N}, torch::TensorOptions().dtype(torch::kFloat).device(device));  // (N)
    for (int64_t c = 0; c < N; c += chunk) {
      const int64_t k = std::min(chunk, N - c);
      auto logits = at::linear(scored.narrow(0, c, k), model->wte->weight).narrow(1, 0, cfg.vocab_size).to(torch::kFloat);  // (k, V)
      losses.narrow(0, c, k).copy_(torch::nn::functional::cross_entropy(
          logits, targets.narrow(0, c, k), torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone)));
    }
    auto grid = torch::zeros({R * L}, losses.options()).index_copy_(0, to_device(slot, device), losses);
    out.sums.narrow(0, 4 * p.first, R).copy_(grid.view({R, L}).sum(1));
    first = p.end;
  }
  if (training) model->train();
  return out;
}

HellaSwagResult hellaswag_result(const datasets::HellaSwagSet& set, const HellaSwagLosses& host) {
  auto sums = host.sums.to(torch::kDouble).contiguous();  // (4n)
  const double* s = sums.data_ptr<double>();
  const int64_t n = sums.numel() / 4;
  HellaSwagResult result;
  result.n = n;
  result.predictions.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double sum[4], mean[4];
    for (int e = 0; e < 4; ++e) {
      sum[e] = s[4 * i + e];
      mean[e] = sum[e] / static_cast<double>(host.counts[static_cast<size_t>(4 * i + e)]);
    }
    const int label = set.items[static_cast<size_t>(i)].label;
    const int pred_norm = lowest(mean);
    result.predictions[static_cast<size_t>(i)] = static_cast<int8_t>(pred_norm);
    result.correct += lowest(sum) == label;
    result.correct_norm += pred_norm == label;
  }
  return result;
}

HellaSwagResult score_hellaswag(GPT& model, const datasets::HellaSwagSet& set, const HellaSwagOptions& options) {
  HellaSwagLosses losses = hellaswag_losses(model, set, options);
  losses.sums = losses.sums.to(torch::kCPU);
  return hellaswag_result(set, losses);
}

}  // namespace pipeline::model
