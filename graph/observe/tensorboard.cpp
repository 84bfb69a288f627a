// TensorBoard event file writer (see tensorboard.h).
#include "graph/observe/tensorboard.h"

#include <isa-l/crc.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "observe/tensorboard_event.pb.h"  // generated from graph/observe/tensorboard_event.proto

namespace pipeline::graph {

static_assert(std::endian::native == std::endian::little, "TFRecord lengths are written little-endian");

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string encode(const tensorboard::Event& e) {
  std::string out;
  if (!e.SerializeToString(&out)) throw std::runtime_error("tensorboard: cannot encode an event");
  return out;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  // ISA-L's crc32_iscsi neither pre- nor post-inverts: seeding with ~0 and inverting the result
  // gives the standard CRC-32C (check value 0xe3069283 for "123456789"). Its length is an int,
  // so long buffers go in pieces.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t crc = 0xffffffffu;
  while (size > 0) {
    const int n = static_cast<int>(std::min<size_t>(size, std::numeric_limits<int>::max()));
    crc = crc32_iscsi(p, n, crc);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.resize(8 + 4 + data.size() + 4);
  const uint64_t length = data.size();
  std::memcpy(out.data(), &length, 8);
  const uint32_t length_crc = masked_crc32c(out.data(), 8);
  std::memcpy(out.data() + 8, &length_crc, 4);
  std::memcpy(out.data() + 12, data.data(), data.size());
  const uint32_t data_crc = masked_crc32c(data.data(), data.size());
  std::memcpy(out.data() + 12 + data.size(), &data_crc, 4);
  return out;
}

std::string tensorboard_file_version_event(double wall_time) {
  tensorboard::Event e;
  e.set_wall_time(wall_time);
  e.set_file_version("brain.Event:2");
  return encode(e);
}

std::string tensorboard_session_start_event(int64_t step, double wall_time) {
  tensorboard::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  e.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  return encode(e);
}

std::string tensorboard_scalars_event(int64_t step, double wall_time,
                                      const std::vector<std::pair<std::string, double>>& scalars) {
  tensorboard::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  auto* summary = e.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    auto* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return encode(e);
}

std::vector<std::pair<std::string, double>> snapshot_scalars(const Snapshot& s) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& st : s.stages) {
    out.emplace_back("stage_busy/" + st.name, st.window_busy);
    // Only for a stage that sleeps on the device (train, log on a GPU): a CPU run gets no empty plots.
    if (st.device_wait_s > 0) out.emplace_back("stage_device_wait/" + st.name, st.window_device_wait);
    out.emplace_back("stage_items_per_s/" + st.name, st.window_items_per_s);
  }
  for (const auto& q : s.queues)
    if (q.capacity > 0) out.emplace_back("queue_occupancy/" + q.consumer, q.window_mean / q.capacity);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir, int64_t purge_step) {
  static std::atomic<int> counter{0};
  char host[256] = "localhost";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  const double t = now_s();
  path_ = dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + host + "." +
                 std::to_string(::getpid()) + "." + std::to_string(counter++));
  std::filesystem::create_directories(dir);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw std::runtime_error(path_.string() + ": cannot create the TensorBoard event file: " + std::strerror(errno));
  append(tensorboard_file_version_event(t));
  if (purge_step > 0) append(tensorboard_session_start_event(purge_step, t));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                                    double wall_time) {
  if (scalars.empty()) return;
  append(tensorboard_scalars_event(step, wall_time < 0 ? now_s() : wall_time, scalars));
}

void TensorBoardWriter::append(const std::string& event) {
  const std::string record = tfrecord(event);
  std::lock_guard<std::mutex> lock(mu_);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    throw std::runtime_error(path_.string() + ": cannot write a TensorBoard event: " + std::strerror(errno));
}

}  // namespace pipeline::graph
