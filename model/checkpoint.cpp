// Checkpoint snapshot, atomic write, verified read and restore (format in checkpoint.h).
#include "model/checkpoint.h"

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pipeline::model {

static_assert(std::endian::native == std::endian::little, "checkpoint format is little-endian");

namespace {

constexpr uint32_t kHeaderBytes = 64;

// ---- CRC-32, slicing by 8 -------------------------------------------------------------------

struct CrcTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s) {
      for (uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

const CrcTables& crc_tables() {
  static const CrcTables tables;
  return tables;
}

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

class Writer {
 public:
  explicit Writer(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (!file_) fail("cannot open for writing");
    std::setvbuf(file_, nullptr, _IOFBF, 1 << 22);
  }
  ~Writer() {
    if (file_) std::fclose(file_);
  }
  void raw(const void* data, size_t n) {
    if (n && std::fwrite(data, 1, n, file_) != n) fail("write failed");
  }
  void payload(const void* data, size_t n) {
    raw(data, n);
    crc_ = crc32(data, n, crc_);
    bytes_ += n;
  }
  template <typename T>
  void payload_pod(T v) { payload(&v, sizeof v); }
  void seek_start() {
    if (std::fseek(file_, 0, SEEK_SET) != 0) fail("seek failed");
  }
  void sync_and_close() {
    if (std::fflush(file_) != 0) fail("flush failed");
    if (::fsync(fileno(file_)) != 0) fail("fsync failed");
    FILE* f = file_;
    file_ = nullptr;
    if (std::fclose(f) != 0) fail("close failed");
  }
  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error("checkpoint '" + path_ + "': " + what + ": " + std::strerror(errno));
  }
  uint32_t crc() const { return crc_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
};

void write_tensor(Writer& w, const std::string& name, const torch::Tensor& tensor) {
  auto t = tensor.to(torch::kCPU).contiguous();
  const uint8_t code = dtype_code(t.scalar_type(), name);
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

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  int64_t step;
  uint64_t metadata_bytes;
  uint64_t payload_bytes;
  uint32_t tensor_count;
  uint32_t crc;
  uint8_t reserved[16];
};
static_assert(sizeof(Header) == kHeaderBytes);

// ---- reading ---------------------------------------------------------------------------------

class Reader {
 public:
  Reader(const std::string& path, uint64_t limit) : path_(path), remaining_(limit) {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) throw std::runtime_error("checkpoint '" + path + "': cannot open: " + std::strerror(errno));
    std::setvbuf(file_, nullptr, _IOFBF, 1 << 22);
  }
  ~Reader() {
    if (file_) std::fclose(file_);
  }
  void raw(void* dst, size_t n) {
    if (n && std::fread(dst, 1, n, file_) != n) {
      throw std::runtime_error("checkpoint '" + path_ + "': unexpected end of file at byte " +
                               std::to_string(offset_) + " (truncated?)");
    }
    offset_ += n;
  }
  // Payload reads are bounded by the header's payload size and folded into the checksum.
  void payload(void* dst, size_t n, const char* what) {
    if (n > remaining_) {
      throw std::runtime_error("checkpoint '" + path_ + "': " + what + " at byte " +
                               std::to_string(offset_) + " needs " + std::to_string(n) +
                               " bytes but only " + std::to_string(remaining_) +
                               " remain in the payload (corrupt file)");
    }
    raw(dst, n);
    crc_ = crc32(dst, n, crc_);
    remaining_ -= n;
  }
  template <typename T>
  T payload_pod(const char* what) {
    T v;
    payload(&v, sizeof v, what);
    return v;
  }
  uint32_t crc() const { return crc_; }
  uint64_t remaining() const { return remaining_; }
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  uint64_t remaining_;
  uint64_t offset_ = 0;
  uint32_t crc_ = 0;
};

[[noreturn]] void corrupt(const Reader& r, const std::string& what) {
  throw std::runtime_error("checkpoint '" + r.path() + "': " + what + " at byte " +
                           std::to_string(r.offset()) + " (corrupt file)");
}

std::pair<std::string, torch::Tensor> read_tensor(Reader& r) {
  const auto name_len = r.payload_pod<uint32_t>("tensor name length");
  if (name_len == 0 || name_len > 4096) corrupt(r, "implausible tensor name length " + std::to_string(name_len));
  std::string name(name_len, '\0');
  r.payload(name.data(), name_len, "tensor name");
  const auto code = r.payload_pod<uint8_t>("dtype");
  const auto ndim = r.payload_pod<uint8_t>("ndim");
  r.payload_pod<uint16_t>("padding");
  torch::ScalarType type = torch::kFloat;
  bool known = false;
  for (const auto& d : kDtypes) {
    if (d.code == code) {
      type = d.type;
      known = true;
    }
  }
  if (!known) corrupt(r, "tensor '" + name + "' has unknown dtype code " + std::to_string(code));
  std::vector<int64_t> dims(ndim);
  int64_t numel = 1;
  for (auto& d : dims) {
    d = r.payload_pod<int64_t>("tensor dims");
    if (d < 0) corrupt(r, "tensor '" + name + "' has a negative dimension");
    numel *= d;
  }
  const auto nbytes = r.payload_pod<uint64_t>("tensor byte count");
  auto t = torch::empty(dims, torch::TensorOptions().dtype(type));
  if (nbytes != static_cast<uint64_t>(numel) * t.element_size()) {
    corrupt(r, "tensor '" + name + "' says " + std::to_string(nbytes) + " bytes for " +
                   std::to_string(numel) + " elements");
  }
  r.payload(t.data_ptr(), nbytes, "tensor data");
  return {std::move(name), std::move(t)};
}

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.size() >= prefix.size() && std::string_view(s).substr(0, prefix.size()) == prefix;
}

std::string describe_magic(const char* m) {
  std::string out;
  char buf[8];
  for (int i = 0; i < 8; ++i) {
    const auto c = static_cast<unsigned char>(m[i]);
    if (c >= 32 && c < 127) {
      out += static_cast<char>(c);
    } else {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// Host copy of t: pinned + non-blocking from a CUDA device when asked, else a plain clone.
torch::Tensor host_copy(const torch::Tensor& t, bool non_blocking) {
  if (t.device().is_cpu()) return t.detach().clone();
  auto host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(non_blocking));
  host.copy_(t.detach(), non_blocking);
  return host;
}

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t prev) {
  const auto& T = crc_tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = ~prev;
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
          T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size--) crc = (crc >> 8) ^ T[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

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
  const std::string tmp = path + ".tmp";
  uint32_t count = 0;
  {
    Writer w(tmp);
    Header header{};
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
    header.header_bytes = kHeaderBytes;
    header.step = state.step;
    header.metadata_bytes = state.metadata.size();
    header.payload_bytes = w.bytes();
    header.tensor_count = count;
    header.crc = w.crc();
    w.seek_start();
    w.raw(&header, sizeof header);
    w.sync_and_close();
  }
  // POSIX rather than std::filesystem: the torch wheel's libtorch.so exports its own (older)
  // std::filesystem functions, which can take precedence over libstdc++'s at run time.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("checkpoint '" + path + "': cannot rename " + tmp + ": " + std::strerror(errno));
  }
  // Make the rename itself durable.
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

CheckpointState read_checkpoint(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw std::runtime_error("checkpoint '" + path + "': " + std::strerror(errno));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kHeaderBytes) {
    throw std::runtime_error("checkpoint '" + path + "': file is " + std::to_string(file_size) +
                             " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                             "-byte header (truncated or not a checkpoint)");
  }
  Reader r(path, file_size - kHeaderBytes);
  Header header{};
  r.raw(&header, sizeof header);
  if (std::memcmp(header.magic, kCheckpointMagic, 8) != 0) {
    throw std::runtime_error("checkpoint '" + path + "': bad magic '" + describe_magic(header.magic) +
                             "', expected 'PIPECKPT' (not a pipeline checkpoint)");
  }
  if (header.version != kCheckpointVersion || header.header_bytes != kHeaderBytes) {
    throw std::runtime_error("checkpoint '" + path + "': format version " +
                             std::to_string(header.version) + " (header " +
                             std::to_string(header.header_bytes) +
                             " bytes) is not supported; this build reads version " +
                             std::to_string(kCheckpointVersion));
  }
  if (header.payload_bytes != file_size - kHeaderBytes) {
    throw std::runtime_error("checkpoint '" + path + "': header promises " +
                             std::to_string(header.payload_bytes) + " payload bytes but the file has " +
                             std::to_string(file_size - kHeaderBytes) +
                             (header.payload_bytes > file_size - kHeaderBytes ? " (truncated)" : " (trailing bytes)"));
  }
  if (header.metadata_bytes > header.payload_bytes) corrupt(r, "metadata length exceeds the payload");
  CheckpointState state;
  state.step = header.step;
  state.metadata.resize(header.metadata_bytes);
  r.payload(state.metadata.data(), header.metadata_bytes, "metadata");
  for (uint32_t i = 0; i < header.tensor_count; ++i) {
    auto [name, t] = read_tensor(r);
    if (starts_with(name, "model/")) {
      state.model.emplace_back(name.substr(6), std::move(t));
    } else if (starts_with(name, "optim/")) {
      state.optimizer.emplace_back(name.substr(6), std::move(t));
    } else if (name == "rng/cpu") {
      state.rng_cpu = std::move(t);
    } else if (starts_with(name, "rng/cuda/")) {
      state.rng_cuda.push_back(std::move(t));
    } else {
      corrupt(r, "unknown tensor section in '" + name + "'");
    }
  }
  if (r.remaining() != 0) corrupt(r, std::to_string(r.remaining()) + " unread payload bytes");
  if (r.crc() != header.crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "CRC-32 of the payload is %08x, header says %08x", r.crc(), header.crc);
    throw std::runtime_error("checkpoint '" + path + "': " + buf + " (corrupt file)");
  }
  return state;
}

void restore(const CheckpointState& state, GPT& model, AdamW* optimizer, bool restore_rng) {
  state.wait();
  load_parameters(model, state.model);
  if (optimizer && !state.optimizer.empty()) optimizer->load_state(state.optimizer);
  if (!restore_rng) return;
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
