// safetensors files (Hugging Face's weight format), read and written to its specification,
// without torch: the layout, the checks and the streaming writer. model/hf/hf_gpt2 maps GPT-2's
// tensors onto it.
//
// Layout (https://github.com/huggingface/safetensors, "Format"):
//   u64 little-endian N, the header's byte length (at most 100,000,000)
//   N bytes of UTF-8 JSON, starting with '{', possibly padded with trailing spaces:
//     {"__metadata__": {"key": "value", ...},            optional, strings only
//      "NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [BEGIN, END]}, ...}
//   the data buffer: every tensor's bytes, row-major, little-endian, at [BEGIN, END) relative
//   to the buffer's start (byte 8 + N of the file).
// A valid file's tensors tile the buffer exactly: sorted by BEGIN, each starts where the previous
// ended, the first at 0, the last ends at the end of the file, and END - BEGIN is the element
// count times the dtype's size. Names are unique.
//
// Example:
//   SafetensorsReader r("model.safetensors");
//   const SafetensorsTensor* t = r.header().find("wte.weight");
//   std::vector<char> bytes(t->bytes());  r.read(*t, bytes.data());
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/atomic_file.h"

namespace pipeline::datasets {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// The element types of the format, with the spelling the header uses ("F32", "BF16", ...).
enum class SafetensorsDtype { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2 };
const char* safetensors_dtype_name(SafetensorsDtype dtype);
size_t safetensors_dtype_size(SafetensorsDtype dtype);
/// False when `name` is not a dtype of the format.
bool parse_safetensors_dtype(std::string_view name, SafetensorsDtype& out);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
  uint64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                      // file offset of the data buffer (8 + N)
  std::vector<SafetensorsTensor> tensors;       // in data-buffer order
  std::map<std::string, std::string> metadata;  // __metadata__
  /// nullptr when there is no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
};

/// Parses and checks a header. `head` holds the file's first bytes, at least 8 + N of them (more
/// are ignored; a fuzzer passes the whole input); `file_size` is the size of the whole file.
/// Throws DatasetError naming `source`, the tensor at fault and what was expected: a file too
/// short for its header, a header over the cap, invalid JSON, an unknown dtype, a shape that
/// disagrees with the byte range, offsets out of range, overlapping or leaving a gap, a
/// duplicate name.
SafetensorsHeader parse_safetensors_header(std::string_view head, uint64_t file_size, const std::string& source);

/// An open safetensors file: the header is read and checked on construction, tensor data on demand.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  /// Copies the tensor's t.bytes() bytes into dst. Throws DatasetError naming the file and tensor
  /// when the read comes up short (the file shrank after it was opened).
  void read(const SafetensorsTensor& t, void* dst) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  SafetensorsHeader header_;
};

/// Writes a safetensors file in one pass: the header first (from the declared tensors), then each
/// tensor's data in header order, to PATH.tmp, renamed over PATH by finish(). Tensors are ordered
/// as the reference implementation orders them (larger dtypes first, then by name), and the header
/// is padded with spaces so the data buffer starts 8-byte aligned. The same tensors and metadata
/// always give the same bytes. Destroyed without finish(), it removes PATH.tmp.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    SafetensorsDtype dtype = SafetensorsDtype::F32;
    std::vector<uint64_t> shape;
  };

  SafetensorsWriter(std::filesystem::path path, std::vector<Entry> tensors,
                    std::map<std::string, std::string> metadata = {});

  /// The tensors in the order write() must receive them.
  const std::vector<SafetensorsTensor>& order() const { return order_; }
  /// The next tensor's data; `name` and `bytes` must match order()[i]. Throws std::logic_error otherwise.
  void write(std::string_view name, const void* data, size_t bytes);
  /// Checks every tensor was written, fsyncs, renames over the final path, fsyncs the directory.
  void finish();

 private:
  std::filesystem::path path_;
  std::vector<SafetensorsTensor> order_;
  size_t next_ = 0;
  AtomicFile file_;  // PATH.tmp until finish(); removed if the writer is destroyed before
};

}  // namespace pipeline::datasets
