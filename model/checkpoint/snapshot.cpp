// See snapshot.h.
#include "model/checkpoint/snapshot.h"

#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#ifdef PIPELINE_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace pipeline::model {

namespace {

// Buffers start on 64-byte boundaries, so each typed view of the byte buffer is aligned.
constexpr int64_t kAlign = 64;

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// One byte buffer for all of `like`, and a view of it shaped and typed like each tensor.
NamedTensors carve(const NamedTensors& like, bool pinned, torch::Tensor& flat) {
  int64_t total = 0;
  for (const auto& [name, t] : like) total += (bytes_of(t) + kAlign - 1) / kAlign * kAlign;
  flat = torch::empty({std::max<int64_t>(total, 1)}, torch::TensorOptions().dtype(torch::kByte).pinned_memory(pinned));
  NamedTensors out;
  int64_t offset = 0;
  for (const auto& [name, t] : like) {
    out.emplace_back(name, flat.narrow(0, offset, bytes_of(t)).view(t.scalar_type()).view(t.sizes()));
    offset += (bytes_of(t) + kAlign - 1) / kAlign * kAlign;
  }
  return out;
}

NamedTensors named_parameters(GPT& model) {
  NamedTensors out;
  for (const auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace

struct SnapshotPool::Set {
  torch::Tensor model_flat, optim_flat;  // (bytes) uint8, pinned on CUDA
  NamedTensors model, optimizer;         // views into the flats
  DeviceEvent start{DeviceEvent::Kind::sync};  // the training stream's work the copies follow
  DeviceEvent ready{DeviceEvent::Kind::sync};  // the copies are done
};

// What a snapshot's lease needs to give its set back, even after the pool is gone.
struct SnapshotPool::Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Set>> sets;
  std::vector<bool> out;
  std::chrono::nanoseconds waited{0};
  std::optional<c10::Stream> copy_stream;  // CUDA only

  void give_back(size_t i) {
    {
      std::lock_guard lock(mu);
      out[i] = false;
    }
    cv.notify_all();
  }
};

SnapshotPool::SnapshotPool(GPT model, const AdamW* optimizer, int sets)
    : model_(std::move(model)), optimizer_(optimizer), device_(model_->wte->weight.device()),
      shared_(std::make_shared<Shared>()) {
  if (sets < 1) throw std::invalid_argument("SnapshotPool: sets must be >= 1, got " + std::to_string(sets));
  const bool cuda = device_.is_cuda();
#ifdef PIPELINE_HAVE_CUDA
  if (cuda) shared_->copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
#endif
  const auto params = named_parameters(model_);
  const auto state = optimizer_ ? optimizer_->state() : NamedTensors{};
  for (int i = 0; i < sets; ++i) {
    auto s = std::make_unique<Set>();
    s->model = carve(params, cuda, s->model_flat);
    s->optimizer = carve(state, cuda, s->optim_flat);
    allocations_ += 2;
    set_bytes_ = s->model_flat.numel() + s->optim_flat.numel();
    shared_->sets.push_back(std::move(s));
    shared_->out.push_back(false);
  }
}

SnapshotPool::~SnapshotPool() = default;

int SnapshotPool::sets() const { return static_cast<int>(shared_->sets.size()); }

std::chrono::nanoseconds SnapshotPool::waited() const {
  std::lock_guard lock(shared_->mu);
  return shared_->waited;
}

namespace {

// dst[i] <- src[i] (non-blocking from a device); the names must match the layout made at construction.
void copy_all(NamedTensors& dst, const NamedTensors& src, bool non_blocking) {
  if (dst.size() != src.size())
    throw std::logic_error("SnapshotPool: " + std::to_string(src.size()) + " tensors to copy, the buffers hold " +
                           std::to_string(dst.size()) + " (the model or optimizer changed shape)");
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].first != src[i].first || dst[i].second.sizes() != src[i].second.sizes())
      throw std::logic_error("SnapshotPool: tensor '" + src[i].first + "' does not match buffer '" + dst[i].first + "'");
    dst[i].second.copy_(src[i].second.detach(), non_blocking);
  }
}

}  // namespace

CheckpointState SnapshotPool::take(int64_t step, std::string metadata) {
  torch::NoGradGuard no_grad;
  Shared& sh = *shared_;
  size_t index = 0;
  {
    std::unique_lock lock(sh.mu);
    auto free_set = [&] {
      for (size_t i = 0; i < sh.out.size(); ++i)
        if (!sh.out[i]) return std::optional<size_t>(i);
      return std::optional<size_t>();
    };
    if (!free_set()) {
      auto t0 = std::chrono::steady_clock::now();
      sh.cv.wait(lock, [&] { return free_set().has_value(); });
      sh.waited += std::chrono::steady_clock::now() - t0;
    }
    index = *free_set();
    sh.out[index] = true;
  }
  Set& s = *sh.sets[index];
  CheckpointState state;
  state.step = step;
  state.metadata = std::move(metadata);
  // The lease: when the last copy of this state is gone, the set is free again.
  state.buffers = std::shared_ptr<void>(&s, [shared = shared_, index](void*) { shared->give_back(index); });

  const auto params = named_parameters(model_);
  const auto opt_state = optimizer_ ? optimizer_->state() : NamedTensors{};
  if (sh.copy_stream) {
    const c10::Stream train = current_stream(device_);
    s.start.record(train);
    s.start.block(*sh.copy_stream);
    {
      c10::StreamGuard on_copy(*sh.copy_stream);
      copy_all(s.model, params, /*non_blocking=*/true);
      copy_all(s.optimizer, opt_state, /*non_blocking=*/true);
    }
    // The sources are read on the copy stream: should one be freed before the copies ran, the
    // caching allocator must not hand its memory out again until they have.
    for (const auto& [name, t] : params) t.record_stream(*sh.copy_stream);
    for (const auto& [name, t] : opt_state) t.record_stream(*sh.copy_stream);
    s.ready.record(*sh.copy_stream);
    state.ready = std::shared_ptr<DeviceEvent>(state.buffers, &s.ready);
    pending_ = &s.ready;
  } else {
    copy_all(s.model, params, /*non_blocking=*/false);
    copy_all(s.optimizer, opt_state, /*non_blocking=*/false);
  }
  state.model = s.model;
  state.optimizer = s.optimizer;
  capture_rng_states(state);
  return state;
}

std::chrono::nanoseconds SnapshotPool::wait_idle() {
  Shared& sh = *shared_;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(sh.mu);
  sh.cv.wait(lock, [&] { return std::none_of(sh.out.begin(), sh.out.end(), [](bool o) { return o; }); });
  return std::chrono::steady_clock::now() - t0;
}

void SnapshotPool::order_before_update() {
  if (!pending_) return;
  pending_->block(current_stream(device_));
  pending_ = nullptr;
}

}  // namespace pipeline::model
