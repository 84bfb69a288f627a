// Data-parallel training: stopping together, cursors in checkpoints, and the train stage's hooks
// (see data_parallel.h).
#include "runner/data_parallel.h"

#include <algorithm>
#include <cstdio>

#include "base/json.h"
#include "datasets/plan/data_plan.h"
#include "runner/lane_setup.h"
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
  group_->set(cursor_key(step, rank()), cursor.to_json(/*with_done=*/false));  // rank 0's carries it
}

std::string DataParallel::complete_checkpoint_metadata(int64_t step, const std::string& metadata) {
  auto meta = json_parse(metadata);
  const JsonValue* own = meta.find("cursor");
  if (!own) throw std::logic_error("checkpoint metadata without a cursor");
  std::string cursors = "[" + DataCursor::from_json(*own).to_json(/*with_done=*/false);
  for (int r = 1; r < size(); ++r) {
    const auto key = cursor_key(step, r);
    cursors += "," + group_->get(key);  // the others publish theirs at the same step
    group_->erase(key);
  }
  cursors += "]";
  auto end = metadata.find_last_of('}');
  return metadata.substr(0, end) + ",\"world_size\":" + std::to_string(size()) + ",\"cursors\":" + cursors + "}";
}

namespace {

// Every rank's cursor in a checkpoint's metadata ("cursor" of a one-process run, "cursors" of a
// data-parallel one), and the number of ranks that wrote it.
std::vector<DataCursor> checkpoint_cursors(const JsonValue& meta, int written_by, const std::string& checkpoint) {
  std::vector<const JsonValue*> found;
  if (written_by == 1) {
    found.push_back(meta.find("cursor"));
  } else {
    const auto& all = meta.array("cursors");
    if (all.size() != static_cast<size_t>(written_by))
      throw std::runtime_error(checkpoint + ": checkpoint metadata holds " + std::to_string(all.size()) +
                               " data cursors for " + std::to_string(written_by) + " ranks (\"cursors\")");
    for (const auto& c : all) found.push_back(&c);
  }
  std::vector<DataCursor> out;
  for (const JsonValue* c : found) {
    if (!c) throw std::runtime_error(checkpoint + ": checkpoint metadata has no data cursor (\"cursor\")");
    try {
      out.push_back(DataCursor::from_json(*c));
    } catch (const std::exception& e) {
      throw std::runtime_error(checkpoint + ": " + e.what());
    }
  }
  return out;
}

int checkpoint_world_size(const JsonValue& meta, const std::string& checkpoint) {
  const double w = meta.number("world_size", 1);
  if (!(w >= 1) || w > 1e6 || w != static_cast<double>(static_cast<int>(w)))
    throw std::runtime_error(checkpoint + ": checkpoint metadata: \"world_size\" " + std::to_string(w) +
                             " is not a number of ranks");
  return static_cast<int>(w);
}

}  // namespace

namespace {

// The lanes order: every lane's cursor, gathered from the ranks that wrote the checkpoint (each
// held its own lanes), and this rank's of them, on `world` ranks (datasets/plan/data_plan.h's
// lanes_of: rank r serves lanes r, r + W, ...).
DataCursor lane_start(const std::string& metadata, const std::vector<DataCursor>& cursors, int rank, int world,
                      const std::string& checkpoint) {
  const CheckpointOrder held = checkpoint_order(metadata, checkpoint);
  if (held.order != "lanes")
    throw std::runtime_error(checkpoint + ": checkpoint metadata: lane cursors in a checkpoint of " + held.order + " order");
  std::vector<const datasets::LaneCursor*> by_lane(held.lanes, nullptr);
  for (const DataCursor& c : cursors) {
    if (!c.lane_order)
      throw std::runtime_error(checkpoint + ": checkpoint metadata: some ranks' cursors are lanes', others not");
    for (const auto& l : c.lanes) {
      if (l.lane >= held.lanes)
        throw std::runtime_error(checkpoint + ": checkpoint metadata: a cursor of lane " + std::to_string(l.lane) +
                                 " in a run of " + std::to_string(held.lanes) + " lanes");
      if (by_lane[l.lane])
        throw std::runtime_error(checkpoint + ": checkpoint metadata: lane " + std::to_string(l.lane) + "'s cursor given twice");
      if (l.sources.size() != cursors.front().lanes.front().sources.size())
        throw std::runtime_error(checkpoint + ": checkpoint metadata: lane " + std::to_string(l.lane) + "'s cursor has " +
                                 std::to_string(l.sources.size()) + " sources, lane " +
                                 std::to_string(cursors.front().lanes.front().lane) + "'s " +
                                 std::to_string(cursors.front().lanes.front().sources.size()));
      by_lane[l.lane] = &l;
    }
  }
  for (uint32_t l = 0; l < held.lanes; ++l)
    if (!by_lane[l])
      throw std::runtime_error(checkpoint + ": checkpoint metadata holds no cursor of lane " + std::to_string(l) + " of its " +
                               std::to_string(held.lanes) + " lanes");
  if (held.lanes % static_cast<uint32_t>(world) != 0) {
    std::string fits;
    for (uint32_t k = 1; k <= held.lanes; ++k)
      if (held.lanes % k == 0 && held.rows % k == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(k);
    throw std::runtime_error(checkpoint + " reads its data through " + std::to_string(held.lanes) + " lanes, which " +
                             ranks_phrase(world) + " cannot share (rank r serves lanes r, r + W, ...): resume it on " +
                             fits + " ranks");
  }
  DataCursor out;
  out.lane_order = true;
  for (uint32_t l : datasets::lanes_of(static_cast<uint32_t>(rank), static_cast<uint32_t>(world), held.lanes))
    out.lanes.push_back(*by_lane[l]);
  return out;
}

}  // namespace

DataCursor checkpoint_cursor(const std::string& metadata, int rank, int world_size, const std::string& checkpoint) {
  auto meta = json_parse(metadata);
  const int written_by = checkpoint_world_size(meta, checkpoint);
  auto cursors = checkpoint_cursors(meta, written_by, checkpoint);
  if (std::any_of(cursors.begin(), cursors.end(), [](const DataCursor& c) { return c.lane_order; }))
    return lane_start(metadata, cursors, rank, world_size, checkpoint);
  const bool global = std::all_of(cursors.begin(), cursors.end(), [](const DataCursor& c) { return c.has_next; });
  if (global) {
    // The ranks' places in the documents every rank numbers alike are one layer of progress; with
    // what the runs before consumed, they say what is left, which this run's ranks deal out again.
    // Rank 0's cursor ("cursor", also with several ranks) carries what the runs before consumed.
    const DataCursor rank0 = written_by == 1 ? cursors[0] : checkpoint_cursors(meta, 1, checkpoint)[0];
    datasets::DataProgress progress = rank0.done ? *rank0.done : datasets::DataProgress{};
    datasets::ProgressLayer layer;
    layer.world = static_cast<uint32_t>(written_by);
    layer.by_shard = cursors[0].by_shard;
    for (const auto& c : cursors) {
      if (c.by_shard != layer.by_shard)
        throw std::runtime_error(checkpoint + ": checkpoint metadata: the ranks' cursors disagree on \"by_shard\"");
      layer.next.push_back(c.next);
    }
    try {
      progress.add(std::move(layer));
    } catch (const std::exception& e) {
      throw std::runtime_error(checkpoint + ": " + e.what());
    }
    // The readers start at the first document left (progress.start()); a mix replays its draws
    // from the reader position of the rank furthest behind, which is before every draw left.
    const auto behind = std::min_element(cursors.begin(), cursors.end(), [](const DataCursor& a, const DataCursor& b) {
      return a.next.doc < b.next.doc;
    });
    DataCursor start;
    start.pos = behind->pos;
    start.done = std::make_shared<const datasets::DataProgress>(std::move(progress));
    return start;
  }
  // Written before positions were kept in every rank's terms (or by a source that marks no
  // documents): each rank's position is a place in its own share of the documents (d mod N).
  const bool at_start = std::all_of(cursors.begin(), cursors.end(), [](const DataCursor& c) {
    return c.skip == 0 && c.pos.pos == datasets::DatasetPosition{} && !c.pos.mixed;
  });
  if (at_start) return DataCursor{};  // nothing read yet: the data starts over on any number of ranks
  if (written_by != world_size)
    throw std::runtime_error(checkpoint + " was written by a run of " + ranks_phrase(written_by) + ", and this run has " +
                             ranks_phrase(world_size) + ": its data positions are each rank's own (the checkpoint " +
                             "predates positions that any number of ranks continues), so resume it with " +
                             (written_by == 1 ? std::string("`pipeline run --resume` without torchrun")
                                              : "torchrun and " + std::to_string(written_by) +
                                                    " ranks in all (--nproc-per-node times --nnodes)"));
  return cursors[static_cast<size_t>(rank)];
}

ResumedBatch resumed_batch(const std::string& metadata, int world_size, const TrainingSection& training,
                           const std::string& checkpoint) {
  auto meta = json_parse(metadata);
  ResumedBatch out;
  out.written_by = checkpoint_world_size(meta, checkpoint);
  // Checkpoints before "grad_accum" was recorded: the config's, which nothing adapted then.
  const double ga = meta.number("grad_accum", static_cast<double>(training.grad_accum));
  if (!(ga >= 1) || ga != static_cast<double>(static_cast<int64_t>(ga)))
    throw std::runtime_error(checkpoint + ": checkpoint metadata: \"grad_accum\" " + std::to_string(ga) +
                             " is not a number of micro-batches");
  out.written_grad_accum = static_cast<int64_t>(ga);
  out.micro_batches = out.written_by * out.written_grad_accum;
  if (out.micro_batches % world_size != 0) {
    std::vector<int64_t> fits;  // the numbers of ranks that share it
    for (int64_t m = 1; m <= out.micro_batches; ++m)
      if (out.micro_batches % m == 0) fits.push_back(m);
    auto list = [&](auto value) {
      std::string s;
      for (size_t i = 0; i < fits.size(); ++i)
        s += (i == 0 ? "" : i + 1 == fits.size() ? " or " : ", ") + std::to_string(value(fits[i]));
      return s;
    };
    throw std::runtime_error(
        checkpoint + " trains " + std::to_string(out.micro_batches) + " micro-batches of " +
        std::to_string(training.batch_size) + "x" + std::to_string(training.seq_len) + " tokens a step (" +
        (out.written_by == 1 ? std::string("1 process") : std::to_string(out.written_by) + " ranks") +
        " x grad_accum " + std::to_string(out.written_grad_accum) + "), which " + std::to_string(world_size) +
        " ranks cannot share evenly: resume it on " + list([](int64_t m) { return m; }) + " ranks (grad_accum " +
        list([&](int64_t m) { return out.micro_batches / m; }) +
        "), or give --set training.grad_accum=N to train another global batch");
  }
  out.grad_accum = out.micro_batches / world_size;
  return out;
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

void TrainSync::sum_windows(StepResult& r) {
  // A sum mod 2^64 that no int64 all-reduce overflows: the low and the high 32 bits apart, each
  // summed over the ranks (recombined by step_windows). On the host, so over Gloo with NCCL too.
  r.windows_parts = torch::tensor({static_cast<int64_t>(r.windows & 0xffffffffu), static_cast<int64_t>(r.windows >> 32)},
                                  torch::kInt64);
  r.windows_reduced = dp_.group().allreduce_sum(r.windows_parts);
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

std::string TrainSync::share(const std::string& key, const std::string& value) {
  if (dp_.writer()) {
    dp_.group().set(key, value);
    return value;
  }
  return dp_.group().get(key);
}

void TrainSync::broadcast(std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  dp_.group().broadcast(tensors, 0);
}

void TrainSync::finish() {
  if (pending_) pending_->wait();
  pending_.reset();
}

}  // namespace pipeline::stages
