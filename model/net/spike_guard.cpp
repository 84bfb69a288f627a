// See spike_guard.h.
#include "model/net/spike_guard.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pipeline::model {

void SpikeGuardState::accept(float loss_value, float norm_value, int64_t window) {
  loss.push_back(loss_value);
  norm.push_back(norm_value);
  ++count;
  const auto keep = static_cast<size_t>(std::max<int64_t>(window, 1));
  if (loss.size() > keep) {
    loss.erase(loss.begin(), loss.end() - static_cast<std::ptrdiff_t>(keep));
    norm.erase(norm.begin(), norm.end() - static_cast<std::ptrdiff_t>(keep));
  }
}

SpikeVerdict SpikeVerdict::from(const torch::Tensor& host) {
  TORCH_CHECK(host.device().is_cpu() && host.scalar_type() == torch::kDouble && host.numel() == kFields,
              "SpikeVerdict: expected a (", kFields, ") float64 host tensor, got ", host.sizes(), " ", host.scalar_type(),
              " on ", host.device());
  const auto c = host.contiguous();
  const double* v = c.data_ptr<double>();
  SpikeVerdict out;
  out.skipped = v[0] != 0;
  out.loss = static_cast<float>(v[1]);  // fp32 values widened exactly: narrowing gives them back
  out.norm = static_cast<float>(v[2]);
  out.loss_z = v[3];
  out.norm_z = v[4];
  out.updates = static_cast<int64_t>(v[5]);
  out.streak = static_cast<int64_t>(v[6]);
  out.skips = static_cast<int64_t>(v[7]);
  out.lr = v[8];
  return out;
}

SpikeGuard::SpikeGuard(SpikeGuardOptions options, const LrSchedule& schedule, int64_t total_steps, torch::Device device)
    : o_(options), last_index_(total_steps) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("SpikeGuard: " + what); };
  if (o_.window < 2) fail("window must be >= 2 steps, got " + std::to_string(o_.window));
  if (o_.min_steps < 2 || o_.min_steps > o_.window)
    fail("min_steps must be in [2, window = " + std::to_string(o_.window) + "], got " + std::to_string(o_.min_steps));
  if (!(o_.z > 0)) fail("z must be > 0, got " + std::to_string(o_.z));
  if (total_steps < 1 || total_steps > kLrTableMaxSteps)
    fail("the learning-rate table covers 1..2^24 steps, got " + std::to_string(total_steps));
  // The rate of each update count exactly as the host's set_lr(schedule.at(u)) would store it:
  // the double rounded to float32 once.
  std::vector<float> table(static_cast<size_t>(total_steps) + 1);
  for (int64_t u = 0; u <= total_steps; ++u) table[static_cast<size_t>(u)] = static_cast<float>(schedule.at(u));
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(device);
  lr_table_ = torch::from_blob(table.data(), {total_steps + 1}, torch::kFloat).to(device, /*non_blocking=*/false, /*copy=*/true);
  hist_ = torch::zeros({2, o_.window}, f32);
  ring_ = torch::arange(o_.window, i64);
  count_ = torch::zeros({}, i64);
  updates_ = torch::zeros({}, i64);
  streak_ = torch::zeros({}, i64);
  skips_ = torch::zeros({}, i64);
  verdict_ = torch::zeros({SpikeVerdict::kFields}, torch::TensorOptions().dtype(torch::kDouble).device(device));
}

torch::Tensor SpikeGuard::judge(const torch::Tensor& loss, const torch::Tensor& norm, AdamW& opt) {
  torch::NoGradGuard no_grad;
  auto x = torch::stack({loss.detach().reshape({}).to(torch::kFloat), norm.detach().reshape({}).to(torch::kFloat)});  // (2)
  // Mean and sample deviation of the values in the window (the first n places of the ring).
  auto n = count_.clamp_max(o_.window);             // () int64
  auto valid = ring_.lt(n).to(torch::kFloat);       // (W)
  auto nf = n.to(torch::kFloat);                    // ()
  auto mean = (hist_ * valid).sum(1) / nf.clamp_min(1);  // (2)
  auto dev = (hist_ - mean.unsqueeze(1)) * valid;   // (2, W)
  auto std = ((dev * dev).sum(1) / (nf - 1).clamp_min(1)).sqrt();  // (2)
  std = torch::maximum(std, mean.abs() * o_.min_rel_std).clamp_min(1e-12);
  auto z = ((x - mean) / std).masked_fill_(n.lt(o_.min_steps), 0.0);  // (2)
  // Skip: a value that is not finite, or one too far above its mean. Only upwards: a loss far
  // below its mean is no spike.
  auto skip = x.isfinite().all().logical_not().logical_or((z > o_.z).any());  // () bool
  auto keep = skip.logical_not();
  // The window takes what was let through, at ring place count % W.
  auto pos = count_.remainder(o_.window).view({1});  // (1) int64
  hist_.index_copy_(1, pos, torch::where(keep, x.unsqueeze(1), hist_.index_select(1, pos)));
  // The rate of this update: the schedule at the updates taken before it.
  auto lr = lr_table_.index_select(0, updates_.clamp_max(last_index_).view({1}));  // (1) float32
  opt.set_lr(lr.reshape({}));
  const auto keep_n = keep.to(torch::kLong), skip_n = skip.to(torch::kLong);
  count_.add_(keep_n);
  updates_.add_(keep_n);
  streak_.add_(1).mul_(skip_n);
  skips_.add_(skip_n);
  verdict_.copy_(torch::cat({skip.to(torch::kDouble).view({1}), x.to(torch::kDouble), z.to(torch::kDouble),
                             torch::stack({updates_, streak_, skips_}).to(torch::kDouble), lr.to(torch::kDouble)}));
  return skip.to(torch::kFloat);
}

void SpikeGuard::load(const SpikeGuardState& state) {
  torch::NoGradGuard no_grad;
  if (state.loss.size() != state.norm.size() || static_cast<int64_t>(state.loss.size()) > state.count)
    throw std::invalid_argument("SpikeGuard::load: " + std::to_string(state.loss.size()) + " loss and " +
                                std::to_string(state.norm.size()) + " norm values for a count of " +
                                std::to_string(state.count));
  // The newest values that fit, each at the ring place its count gives it: the sums run over the
  // same places in the same order as in a run that never stopped.
  const auto m = std::min<int64_t>(static_cast<int64_t>(state.loss.size()), o_.window);
  const auto skipped = static_cast<int64_t>(state.loss.size()) - m;
  // Fewer values than this window counts as held (the state came from a smaller window): count as
  // if only they had ever come in, so that the ring holds exactly the values it counts.
  const int64_t count = m < std::min(state.count, o_.window) ? m : state.count;
  auto hist = torch::zeros({2, o_.window}, torch::kFloat);
  auto h = hist.accessor<float, 2>();
  for (int64_t i = 0; i < m; ++i) {
    const int64_t index = count - m + i;  // the value's insertion index
    const auto at = static_cast<size_t>(skipped + i);
    h[0][index % o_.window] = state.loss[at];
    h[1][index % o_.window] = state.norm[at];
  }
  hist_.copy_(hist);
  count_.fill_(count);
  updates_.fill_(state.updates);
  streak_.fill_(state.streak);
  skips_.fill_(state.skips);
}

}  // namespace pipeline::model
