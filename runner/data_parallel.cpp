// Data-parallel training: stopping together, cursors in checkpoints, and the train stage's hooks
// (see data_parallel.h).
#include "runner/data_parallel.h"

#include <algorithm>
#include <cstdio>

#include "base/json.h"
#include "stages/types.h"

namespace pipeline::stages {

namespace {

std::string cursor_key(int64_t step, int rank) { return "cursor/" + std::to_string(step) + "/" + std::to_string(rank); }

std::string ranks_phrase(int n) { return n == 1 ? "1 process (no data parallel)" : std::to_string(n) + " ranks"; }

}  // namespace

DataParallel::DataParallel(std::shared_ptr<dist::Group> group, dist::BackendKind backend)
    : group_(std::move(group)), backend_(backend) {}

std::string DataParallel::describe(const torch::Device& device) const {
  return "rank " + std::to_string(rank()) + " of " + std::to_string(size()) + " (" + dist::backend_name(backend_) +
         ", " + device.str() + ")";
}

void DataParallel::publish_cursor(int64_t step, const DataCursor& cursor) {
  group_->set(cursor_key(step, rank()), cursor.to_json());
}

std::string DataParallel::complete_checkpoint_metadata(int64_t step, const std::string& metadata) {
  auto meta = json_parse(metadata);
  const JsonValue* own = meta.find("cursor");
  if (!own) throw std::logic_error("checkpoint metadata without a cursor");
  std::string cursors = "[" + DataCursor::from_json(*own).to_json();
  for (int r = 1; r < size(); ++r) {
    const auto key = cursor_key(step, r);
    cursors += "," + group_->get(key);  // the others publish theirs at the same step
    group_->erase(key);
  }
  cursors += "]";
  auto end = metadata.find_last_of('}');
  return metadata.substr(0, end) + ",\"world_size\":" + std::to_string(size()) + ",\"cursors\":" + cursors + "}";
}

DataCursor checkpoint_cursor(const std::string& metadata, int rank, int world_size, const std::string& checkpoint) {
  auto meta = json_parse(metadata);
  const int written_by = static_cast<int>(meta.number("world_size", 1));
  if (written_by != world_size)
    throw std::runtime_error(checkpoint + " was written by a run of " + ranks_phrase(written_by) + ", and this run has " +
                             ranks_phrase(world_size) + ": each rank's data position only continues with the same "
                             "number of ranks, so resume it with " +
                             (written_by == 1 ? std::string("`pipeline run --resume` without torchrun")
                                              : "torchrun and " + std::to_string(written_by) +
                                                    " ranks in all (--nproc-per-node times --nnodes)"));
  const JsonValue* c = nullptr;
  if (world_size == 1) {
    c = meta.find("cursor");
  } else {
    const auto& all = meta.array("cursors");
    if (all.size() != static_cast<size_t>(world_size))
      throw std::runtime_error(checkpoint + ": checkpoint metadata holds " + std::to_string(all.size()) +
                               " data cursors for " + std::to_string(world_size) + " ranks");
    c = &all[static_cast<size_t>(rank)];
  }
  if (!c) throw std::runtime_error(checkpoint + ": checkpoint metadata has no data cursor");
  try {
    return DataCursor::from_json(*c);
  } catch (const std::exception& e) {
    throw std::runtime_error(checkpoint + ": " + e.what());
  }
}

std::unique_ptr<StepSync> DataParallel::join_steps(const RunConfig& cfg, const std::vector<torch::Tensor>& params) {
  return std::make_unique<TrainSync>(*this, cfg, params);
}

TrainSync::TrainSync(DataParallel& dp, const RunConfig& cfg, const std::vector<torch::Tensor>& params)
    : dp_(dp), lagged_(cfg.data.loop) {
  {
    torch::NoGradGuard no_grad;
    dp_.group().broadcast(params, 0);
  }
  dist::ReducerOptions o;
  o.bucket_bytes = static_cast<int64_t>(cfg.run.dist_bucket_mb * 1024 * 1024);
  reducer_ = std::make_unique<dist::GradientReducer>(dp_.group(), params, o);
  flags_ = torch::zeros({3}, torch::kInt64);
}

DataParallel::EarlyStop TrainSync::exchange_flags(bool dry) {
  // [0]: a stop was requested on some rank; [1]: some rank is out of data; [2]: some rank was
  // asked for a checkpoint. MAX over ranks.
  auto issue = [&] {
    requests_in_flight_ = checkpoint_requests_;
    const bool ask = checkpoint_requests_ > requests_served_;
    flags_ = torch::tensor({static_cast<int64_t>(dp_.stop_requested()), static_cast<int64_t>(dry), static_cast<int64_t>(ask)},
                           torch::kInt64);
    return dp_.group().allreduce_max(flags_);
  };
  auto reason = [&] {
    auto a = flags_.accessor<int64_t, 1>();
    if (a[2] != 0) {
      checkpoint_agreed_ = true;
      requests_served_ = std::max(requests_served_, requests_in_flight_);
    }
    return a[1] != 0 ? DataParallel::EarlyStop::out_of_data
           : a[0] != 0 ? DataParallel::EarlyStop::requested
                       : DataParallel::EarlyStop::none;
  };
  if (!lagged_) {
    issue()->wait();
    return reason();
  }
  auto why = DataParallel::EarlyStop::none;
  if (pending_) {
    pending_->wait();
    pending_.reset();
    why = reason();
  }
  if (why == DataParallel::EarlyStop::none) pending_ = issue();
  return why;
}

bool TrainSync::before_forward(bool last_micro_batch, int64_t checkpoint_requests) {
  if (agreed_stop_) return false;
  if (!last_micro_batch) return true;
  checkpoint_requests_ = checkpoint_requests;
  if (auto why = exchange_flags(/*dry=*/false); why != DataParallel::EarlyStop::none) {
    agreed_stop_ = true;
    dp_.set_stopped_early(why);
    return false;
  }
  reducer_->before_forward();
  return true;
}

void TrainSync::before_backward(const torch::Tensor& loss, bool last_micro_batch) {
  reducer_->before_backward(loss, last_micro_batch);
}

void TrainSync::average(torch::Tensor& loss, torch::Tensor& norm, StepResult& r) {
  auto stats = torch::stack({loss.detach().to(torch::kFloat32), norm.to(torch::kFloat32)}) /
               static_cast<double>(dp_.size());  // (2,): the sum over ranks is the mean
  auto work = dp_.group().allreduce_sum(stats);
  if (stats.is_cuda()) {
    work->wait();  // the current stream waits for NCCL; the host does not
  } else {
    r.reduced = work;  // the log stage waits, off the training thread
  }
  loss = stats[0];
  norm = stats[1];
}

std::string TrainSync::describe_buckets() const {
  auto sizes = reducer_->bucket_sizes();
  int64_t total = 0, largest = 0;
  for (auto b : sizes) total += b, largest = std::max(largest, b);
  char buf[160];
  std::snprintf(buf, sizeof buf, "gradients: %zu bucket%s all-reduced during backward, %.1f MB in all (largest %.1f MB)",
                sizes.size(), sizes.size() == 1 ? "" : "s", static_cast<double>(total) / 1e6,
                static_cast<double>(largest) / 1e6);
  return buf;
}

bool TrainSync::take_checkpoint_request() {
  const bool agreed = checkpoint_agreed_;
  checkpoint_agreed_ = false;
  return agreed;
}

bool TrainSync::checkpoint_here(int64_t step, const DataCursor& cursor) {
  if (dp_.writer()) return true;
  dp_.publish_cursor(step, cursor);
  return false;
}

void TrainSync::end_of_input() {
  if (agreed_stop_) return;
  if (lagged_)
    throw std::runtime_error("rank " + std::to_string(dp_.rank()) +
                             "'s input ended although [data] loop = true; the other ranks cannot continue without it");
  dp_.set_stopped_early(exchange_flags(/*dry=*/true));  // the others wait for it at their next step
  agreed_stop_ = true;
}

void TrainSync::finish() {
  if (pending_) pending_->wait();
  pending_.reset();
}

}  // namespace pipeline::stages
