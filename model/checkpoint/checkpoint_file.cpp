// See checkpoint_file.h.
#include "model/checkpoint/checkpoint_file.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

namespace pipeline::model {

static_assert(std::endian::native == std::endian::little, "checkpoint format is little-endian");

namespace {

constexpr uint32_t kMaxNameBytes = 4096;

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

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t prev) {
  // zlib takes the length as uInt: feed it in pieces that fit.
  auto p = static_cast<const Bytef*>(data);
  uLong crc = prev;
  while (size > 0) {
    const auto n = static_cast<uInt>(std::min<size_t>(size, size_t(1) << 30));
    crc = ::crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

size_t checkpoint_dtype_size(uint8_t code) {
  switch (code) {
    case 1: return 4;
    case 2: return 2;
    case 3: return 2;
    case 4: return 8;
    case 5: return 8;
    case 6: return 4;
    case 7: return 1;
    case 8: return 1;
    default: return 0;
  }
}

CheckpointFileReader::CheckpointFileReader(const std::string& path) : path_(path) {
  const std::string where = "checkpoint '" + path + "': ";
  file_.reset(std::fopen(path.c_str(), "rb"));
  if (!file_) throw std::runtime_error(where + "cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fileno(file_.get()), &st) != 0) throw std::runtime_error(where + std::strerror(errno));
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kCheckpointHeaderBytes) {
    throw std::runtime_error(where + "file is " + std::to_string(file_size) + " bytes, shorter than the " +
                             std::to_string(kCheckpointHeaderBytes) + "-byte header (truncated or not a checkpoint)");
  }
  std::setvbuf(file_.get(), nullptr, _IOFBF, 1 << 22);
  raw(&header_, sizeof header_);
  if (std::memcmp(header_.magic, kCheckpointMagic, 8) != 0) {
    throw std::runtime_error(where + "bad magic '" + describe_magic(header_.magic) +
                             "', expected 'PIPECKPT' (not a pipeline checkpoint)");
  }
  if (header_.version != kCheckpointVersion || header_.header_bytes != kCheckpointHeaderBytes) {
    throw std::runtime_error(where + "format version " + std::to_string(header_.version) + " (header " +
                             std::to_string(header_.header_bytes) + " bytes) is not supported; this build reads version " +
                             std::to_string(kCheckpointVersion));
  }
  const uint64_t payload = file_size - kCheckpointHeaderBytes;
  if (header_.payload_bytes != payload) {
    throw std::runtime_error(where + "header promises " + std::to_string(header_.payload_bytes) +
                             " payload bytes but the file has " + std::to_string(payload) +
                             (header_.payload_bytes > payload ? " (truncated)" : " (trailing bytes)"));
  }
  if (header_.metadata_bytes > header_.payload_bytes) corrupt("metadata length exceeds the payload");
  remaining_ = payload;
}

void CheckpointFileReader::raw(void* dst, size_t n) {
  if (n && std::fread(dst, 1, n, file_.get()) != n) {
    throw std::runtime_error("checkpoint '" + path_ + "': unexpected end of file at byte " + std::to_string(offset_) +
                             " (truncated?)");
  }
  offset_ += n;
}

void CheckpointFileReader::payload(void* dst, size_t n, const char* what) {
  if (n > remaining_) {
    throw std::runtime_error("checkpoint '" + path_ + "': " + what + " at byte " + std::to_string(offset_) + " needs " +
                             std::to_string(n) + " bytes but only " + std::to_string(remaining_) +
                             " remain in the payload (corrupt file)");
  }
  raw(dst, n);
  crc_ = crc32(dst, n, crc_);
  remaining_ -= n;
}

void CheckpointFileReader::corrupt(const std::string& what) const {
  throw std::runtime_error("checkpoint '" + path_ + "': " + what + " at byte " + std::to_string(offset_) +
                           " (corrupt file)");
}

std::string CheckpointFileReader::read_metadata() {
  std::string meta(header_.metadata_bytes, '\0');  // bounded by the file size (checked on open)
  payload(meta.data(), meta.size(), "metadata");
  return meta;
}

CheckpointTensorRecord CheckpointFileReader::next_tensor() {
  CheckpointTensorRecord t;
  const auto name_len = payload_pod<uint32_t>("tensor name length");
  if (name_len == 0 || name_len > kMaxNameBytes) corrupt("implausible tensor name length " + std::to_string(name_len));
  t.name.resize(name_len);
  payload(t.name.data(), name_len, "tensor name");
  t.dtype = payload_pod<uint8_t>("dtype");
  const auto ndim = payload_pod<uint8_t>("ndim");
  payload_pod<uint16_t>("padding");
  const size_t elem = checkpoint_dtype_size(t.dtype);
  if (elem == 0) corrupt("tensor '" + t.name + "' has unknown dtype code " + std::to_string(t.dtype));
  t.dims.resize(ndim);
  // The element count is bounded by the bytes left in the file, so an absurd shape is an
  // error here rather than a huge allocation (or an overflow) later.
  uint64_t numel = 1;
  bool too_big = false;
  for (auto& d : t.dims) {
    d = payload_pod<int64_t>("tensor dims");
    if (d < 0) corrupt("tensor '" + t.name + "' has a negative dimension " + std::to_string(d));
    too_big = too_big || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
  }
  t.nbytes = payload_pod<uint64_t>("tensor byte count");
  uint64_t expected = 0;
  too_big = too_big || __builtin_mul_overflow(numel, static_cast<uint64_t>(elem), &expected);
  if (too_big || t.nbytes != expected) {
    std::string shape;
    for (auto d : t.dims) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    corrupt("tensor '" + t.name + "' of shape [" + shape + "] says " + std::to_string(t.nbytes) + " bytes" +
            (too_big ? " but its shape overflows 64 bits" : ", not " + std::to_string(expected)));
  }
  if (t.nbytes > remaining_) {
    corrupt("tensor '" + t.name + "' needs " + std::to_string(t.nbytes) + " bytes but only " +
            std::to_string(remaining_) + " remain in the payload");
  }
  return t;
}

void CheckpointFileReader::read_data(void* dst, uint64_t n) { payload(dst, n, "tensor data"); }

void CheckpointFileReader::finish() {
  if (remaining_ != 0) corrupt(std::to_string(remaining_) + " unread payload bytes");
  if (crc_ != header_.crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "CRC-32 of the payload is %08x, header says %08x", crc_, header_.crc);
    throw std::runtime_error("checkpoint '" + path_ + "': " + buf + " (corrupt file)");
  }
}

}  // namespace pipeline::model
