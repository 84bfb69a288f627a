// The checkpoint file format without torch: the on-disk header and a reader that walks the
// tensor records, checking every length against the file before anything is allocated. Kept
// torch-free so it can be fuzzed on its own (tests/fuzz/fuzz_checkpoint.cpp); model/checkpoint/checkpoint
// turns its records into tensors. Layout: see model/checkpoint/checkpoint.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace pipeline::model {

inline constexpr char kCheckpointMagic[8] = {'P', 'I', 'P', 'E', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr uint32_t kCheckpointHeaderBytes = 64;

struct CheckpointHeader {
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
static_assert(sizeof(CheckpointHeader) == kCheckpointHeaderBytes);

/// Bytes per element of a dtype code (ours, stable across torch versions), 0 when unknown.
/// 1 float32, 2 float16, 3 bfloat16, 4 float64, 5 int64, 6 int32, 7 uint8, 8 bool.
size_t checkpoint_dtype_size(uint8_t code);

/// One tensor record's description; its `nbytes` of data follow (read_data()).
struct CheckpointTensorRecord {
  std::string name;
  uint8_t dtype = 0;
  std::vector<int64_t> dims;
  uint64_t nbytes = 0;  // = product(dims) * checkpoint_dtype_size(dtype), checked
};

/// Reads one checkpoint file front to back. Every error is a std::runtime_error
/// "checkpoint 'PATH': WHAT at byte N (corrupt file)" or names the header field at fault.
///   CheckpointFileReader r(path);
///   std::string meta = r.read_metadata();
///   for (uint32_t i = 0; i < r.header().tensor_count; ++i) { auto t = r.next_tensor(); r.read_data(buf, t.nbytes); }
///   r.finish();  // nothing left over, CRC-32 matches
class CheckpointFileReader {
 public:
  explicit CheckpointFileReader(const std::string& path);
  const CheckpointHeader& header() const { return header_; }
  std::string read_metadata();
  CheckpointTensorRecord next_tensor();
  void read_data(void* dst, uint64_t n);
  void finish();
  const std::string& path() const { return path_; }

 private:
  void raw(void* dst, size_t n);
  void payload(void* dst, size_t n, const char* what);
  template <typename T>
  T payload_pod(const char* what) {
    T v;
    payload(&v, sizeof v, what);
    return v;
  }
  [[noreturn]] void corrupt(const std::string& what) const;

  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Close> file_;
  CheckpointHeader header_{};
  uint64_t remaining_ = 0;
  uint64_t offset_ = 0;
  uint32_t crc_ = 0;
};

/// CRC-32 (IEEE 802.3), computed by zlib; chain calls by passing the previous value.
uint32_t crc32(const void* data, size_t size, uint32_t prev = 0);

}  // namespace pipeline::model
