// Checkpoint snapshot, atomic write, verified read and restore (format in checkpoint.h; the
// byte-level reading is model/checkpoint/checkpoint_file's).
#include "model/checkpoint/checkpoint.h"

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>

#include <bit>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string_view>

#include "base/atomic_file.h"

namespace pipeline::model {

static_assert(std::endian::native == std::endian::little, "checkpoint format is little-endian");

namespace {

// ---- dtype codes (ours, stable across torch versions) ---------------------------------------

struct DtypeCode {
  uint8_t code;
  torch::ScalarType type;
};
constexpr DtypeCode kDtypes[] = {
    {1, torch::kFloat},  {2, torch::kHalf},  {3, torch::kBFloat16}, {4, torch::kDouble},
    {5, torch::kLong},   {6, torch::kInt},   {7, torch::kByte},     {8, torch::kBool},
};

uint8_t dtype_code(torch::ScalarType t, const std::string& name) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.code;
  }
  throw std::runtime_error("checkpoint: tensor '" + name + "' has unsupported dtype " +
                           std::string(c10::toString(t)));
}

// ---- writing ---------------------------------------------------------------------------------

// Streams the payload into an AtomicFile, folding it into the CRC-32 as it goes.
class Writer {
 public:
  explicit Writer(const std::string& path) : file_(path) {}
  void raw(const void* data, size_t n) { file_.write(data, n); }
  void payload(const void* data, size_t n) {
    raw(data, n);
    crc_ = crc32(data, n, crc_);
    bytes_ += n;
  }
  template <typename T>
  void payload_pod(T v) { payload(&v, sizeof v); }
  void patch_header(const void* header, size_t n) { file_.write_at(0, header, n); }
  void commit() { file_.commit(); }
  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  AtomicFile file_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

void write_tensor(Writer& w, const std::string& name, const torch::Tensor& tensor) {
  auto t = tensor.to(torch::kCPU).contiguous();
  const uint8_t code = dtype_code(t.scalar_type(), name);
  if (checkpoint_dtype_size(code) != static_cast<size_t>(t.element_size()))
    throw std::logic_error("checkpoint: dtype code " + std::to_string(code) + " and the reader's element size disagree");
  if (t.dim() > 255) throw std::runtime_error("checkpoint: tensor '" + name + "' has too many dims");
  w.payload_pod<uint32_t>(static_cast<uint32_t>(name.size()));
  w.payload(name.data(), name.size());
  w.payload_pod<uint8_t>(code);
  w.payload_pod<uint8_t>(static_cast<uint8_t>(t.dim()));
  w.payload_pod<uint16_t>(0);
  for (int64_t d : t.sizes()) w.payload_pod<int64_t>(d);
  const uint64_t nbytes = t.numel() * t.element_size();
  w.payload_pod<uint64_t>(nbytes);
  w.payload(t.data_ptr(), nbytes);
}

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.size() >= prefix.size() && std::string_view(s).substr(0, prefix.size()) == prefix;
}

torch::ScalarType dtype_of(uint8_t code) {
  for (const auto& d : kDtypes)
    if (d.code == code) return d.type;
  throw std::logic_error("dtype code " + std::to_string(code) + " passed the reader's check but has no torch type");
}

// Host copy of t: pinned + non-blocking from a CUDA device when asked, else a plain clone.
torch::Tensor host_copy(const torch::Tensor& t, bool non_blocking) {
  if (t.device().is_cpu()) return t.detach().clone();
  auto host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(non_blocking));
  host.copy_(t.detach(), non_blocking);
  return host;
}

}  // namespace

std::chrono::nanoseconds CheckpointState::wait() const {
  return ready ? ready->wait() : std::chrono::nanoseconds(0);
}

void capture_rng_states(CheckpointState& state) {
  {
    auto gen = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(gen.mutex());
    state.rng_cpu = gen.get_state();
  }
  state.rng_cuda.clear();
  if (torch::cuda::is_available()) {
    for (int64_t i = 0; i < static_cast<int64_t>(torch::cuda::device_count()); ++i) {
      auto gen = at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      state.rng_cuda.push_back(gen.get_state());  // the host-side seed and offset: no device sync
    }
  }
}

CheckpointState snapshot(GPT& model, const AdamW* optimizer, int64_t step, std::string metadata,
                         bool non_blocking) {
  torch::NoGradGuard no_grad;
  CheckpointState state;
  state.step = step;
  state.metadata = std::move(metadata);
  std::optional<torch::Device> device;
  for (const auto& item : model->named_parameters()) {
    state.model.emplace_back(item.key(), host_copy(item.value(), non_blocking));
    if (!item.value().device().is_cpu()) device = item.value().device();
  }
  if (optimizer) {
    for (const auto& [name, t] : optimizer->state()) {
      state.optimizer.emplace_back(name, host_copy(t, non_blocking));
    }
  }
  capture_rng_states(state);
  if (non_blocking && device && device->is_cuda()) {
    state.ready = std::make_shared<DeviceEvent>();
    state.ready->record_current(*device);
  }
  return state;
}

void write_checkpoint(const std::string& path, const CheckpointState& state) {
  state.wait();
  uint32_t count = 0;
  Writer w(path);  // PATH.tmp until commit(); removed if anything below throws
  CheckpointHeader header{};
  w.raw(&header, sizeof header);  // placeholder, rewritten once sizes and CRC are known
  w.payload(state.metadata.data(), state.metadata.size());
  for (const auto& [name, t] : state.model) {
    write_tensor(w, "model/" + name, t);
    ++count;
  }
  for (const auto& [name, t] : state.optimizer) {
    write_tensor(w, "optim/" + name, t);
    ++count;
  }
  if (state.rng_cpu.defined()) {
    write_tensor(w, "rng/cpu", state.rng_cpu);
    ++count;
  }
  for (size_t i = 0; i < state.rng_cuda.size(); ++i) {
    write_tensor(w, "rng/cuda/" + std::to_string(i), state.rng_cuda[i]);
    ++count;
  }
  std::memcpy(header.magic, kCheckpointMagic, 8);
  header.version = kCheckpointVersion;
  header.header_bytes = kCheckpointHeaderBytes;
  header.step = state.step;
  header.metadata_bytes = state.metadata.size();
  header.payload_bytes = w.bytes();
  header.tensor_count = count;
  header.crc = w.crc();
  w.patch_header(&header, sizeof header);
  w.commit();
}

CheckpointState read_checkpoint(const std::string& path) {
  CheckpointFileReader r(path);
  CheckpointState state;
  state.step = r.header().step;
  state.metadata = r.read_metadata();
  for (uint32_t i = 0; i < r.header().tensor_count; ++i) {
    auto rec = r.next_tensor();  // shape and size checked against the file
    auto t = torch::empty(rec.dims, torch::TensorOptions().dtype(dtype_of(rec.dtype)));
    r.read_data(t.data_ptr(), rec.nbytes);
    auto& name = rec.name;
    if (starts_with(name, "model/")) {
      state.model.emplace_back(name.substr(6), std::move(t));
    } else if (starts_with(name, "optim/")) {
      state.optimizer.emplace_back(name.substr(6), std::move(t));
    } else if (name == "rng/cpu") {
      state.rng_cpu = std::move(t);
    } else if (starts_with(name, "rng/cuda/")) {
      state.rng_cuda.push_back(std::move(t));
    } else {
      throw std::runtime_error("checkpoint '" + path + "': unknown tensor section in '" + name + "' (corrupt file)");
    }
  }
  r.finish();
  return state;
}

void restore(const CheckpointState& state, GPT& model, AdamW* optimizer, bool restore_rng) {
  state.wait();
  load_parameters(model, state.model);
  if (optimizer && !state.optimizer.empty()) optimizer->load_state(state.optimizer);
  if (restore_rng) model::restore_rng(state);
}

void restore_rng(const CheckpointState& state) {
  if (state.rng_cpu.defined()) {
    auto gen = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state.rng_cpu);
  }
  if (!state.rng_cuda.empty() && torch::cuda::is_available()) {
    const auto n = std::min<size_t>(state.rng_cuda.size(), torch::cuda::device_count());
    for (size_t i = 0; i < n; ++i) {
      auto gen = at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state.rng_cuda[i]);
    }
  }
}

void save_checkpoint(const std::string& path, GPT& model, const AdamW* optimizer, int64_t step,
                     std::string metadata) {
  write_checkpoint(path, snapshot(model, optimizer, step, std::move(metadata), /*non_blocking=*/false));
}

}  // namespace pipeline::model
