// safetensors header checks, reader and streaming writer (format in safetensors.h).
#include "datasets/weights/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>
#include <stdexcept>
#include <utility>

#include "base/atomic_file.h"
#include "datasets/dataset_error.h"
#include "base/json.h"

namespace pipeline::datasets {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::BOOL, "BOOL", 1}, {SafetensorsDtype::U8, "U8", 1},     {SafetensorsDtype::I8, "I8", 1},
    {SafetensorsDtype::I16, "I16", 2},   {SafetensorsDtype::U16, "U16", 2},   {SafetensorsDtype::F16, "F16", 2},
    {SafetensorsDtype::BF16, "BF16", 2}, {SafetensorsDtype::I32, "I32", 4},   {SafetensorsDtype::U32, "U32", 4},
    {SafetensorsDtype::F32, "F32", 4},   {SafetensorsDtype::F64, "F64", 8},   {SafetensorsDtype::I64, "I64", 8},
    {SafetensorsDtype::U64, "U64", 8},   {SafetensorsDtype::F8_E4M3, "F8_E4M3", 1},
    {SafetensorsDtype::F8_E5M2, "F8_E5M2", 1},
};

const DtypeInfo& info(SafetensorsDtype d) {
  for (const auto& i : kDtypes)
    if (i.dtype == d) return i;
  throw std::logic_error("safetensors: unknown dtype enumerator");
}

// Header field checks. Every message names the file, the JSON path and the byte offset of the
// value inside the file (the header starts at byte 8).
class HeaderReader {
 public:
  explicit HeaderReader(const std::string& source) : source_(source) {}

  [[noreturn]] void fail(const std::string& what) const { throw DatasetError(source_ + ": " + what); }
  [[noreturn]] void fail(const JsonValue& v, const std::string& where, const std::string& what) const {
    fail(where + " (byte offset " + std::to_string(8 + v.offset) + "): " + what);
  }

  uint64_t u64(const JsonValue& v, const std::string& where) const {
    uint64_t out = 0;
    if (v.type != JsonValue::Type::number) fail(v, where, std::string("expected an integer, found a ") + JsonValue::type_name(v.type));
    auto [p, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), out);
    if (ec != std::errc() || p != v.text.data() + v.text.size())
      fail(v, where, "expected a non-negative integer below 2^64, found " + v.text);
    return out;
  }

  SafetensorsTensor tensor(const std::string& name, const JsonValue& v) const {
    const std::string where = "tensor '" + name + "'";
    if (v.type != JsonValue::Type::object)
      fail(v, where, std::string("expected an object with dtype, shape and data_offsets, found a ") + JsonValue::type_name(v.type));
    SafetensorsTensor t;
    t.name = name;
    const JsonValue* dtype = v.find("dtype");
    const JsonValue* shape = v.find("shape");
    const JsonValue* offsets = v.find("data_offsets");
    if (!dtype || !shape || !offsets)
      fail(v, where, std::string("missing \"") + (!dtype ? "dtype" : !shape ? "shape" : "data_offsets") + "\"");
    if (dtype->type != JsonValue::Type::string || !parse_safetensors_dtype(dtype->text, t.dtype)) {
      std::string known;
      for (const auto& i : kDtypes) known += (known.empty() ? "" : ", ") + std::string(i.name);
      fail(*dtype, where + " dtype", "\"" + (dtype->type == JsonValue::Type::string ? dtype->text : std::string("?")) +
                                         "\" is not a safetensors dtype (expected one of " + known + ")");
    }
    if (shape->type != JsonValue::Type::array) fail(*shape, where + " shape", "expected an array of dimensions");
    for (size_t i = 0; i < shape->items.size(); ++i) t.shape.push_back(u64(shape->items[i], where + " shape[" + std::to_string(i) + "]"));
    if (offsets->type != JsonValue::Type::array || offsets->items.size() != 2)
      fail(*offsets, where + " data_offsets", "expected [begin, end]");
    t.begin = u64(offsets->items[0], where + " data_offsets[0]");
    t.end = u64(offsets->items[1], where + " data_offsets[1]");
    if (t.end < t.begin)
      fail(*offsets, where + " data_offsets",
           "end " + std::to_string(t.end) + " is before begin " + std::to_string(t.begin));
    // The element count, guarded against overflow: a shape whose bytes do not fit in 64 bits
    // cannot match any byte range.
    uint64_t bytes = info(t.dtype).size;
    for (uint64_t d : t.shape) {
      if (d != 0 && bytes > UINT64_MAX / d) fail(*shape, where + " shape", "the shape's byte size overflows 64 bits");
      bytes *= d;
    }
    if (bytes != t.end - t.begin)
      fail(*offsets, where,
           "shape and dtype " + std::string(info(t.dtype).name) + " need " + std::to_string(bytes) +
               " bytes but data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ") hold " +
               std::to_string(t.end - t.begin));
    return t;
  }

 private:
  std::string source_;
};

std::string u64_list(const std::vector<uint64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDtype dtype) { return info(dtype).name; }
size_t safetensors_dtype_size(SafetensorsDtype dtype) { return info(dtype).size; }

bool parse_safetensors_dtype(std::string_view name, SafetensorsDtype& out) {
  for (const auto& i : kDtypes)
    if (name == i.name) {
      out = i.dtype;
      return true;
    }
  return false;
}

uint64_t SafetensorsTensor::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensor* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsHeader parse_safetensors_header(std::string_view head, uint64_t file_size, const std::string& source) {
  HeaderReader r(source);
  if (file_size < 8 || head.size() < 8)
    r.fail("file is " + std::to_string(file_size) +
           " bytes, shorter than the 8-byte header length (truncated, or not a safetensors file)");
  uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  if (n > kSafetensorsMaxHeaderBytes)
    r.fail("header length " + std::to_string(n) + " (bytes 0-7) exceeds the format's cap of " +
           std::to_string(kSafetensorsMaxHeaderBytes) + " bytes (corrupt, or not a safetensors file)");
  if (n > file_size - 8)
    r.fail("header length " + std::to_string(n) + " (bytes 0-7) runs past the end of the " + std::to_string(file_size) +
           "-byte file (truncated)");
  if (head.size() < 8 + n) throw std::logic_error("parse_safetensors_header: fewer bytes given than the header needs");
  std::string_view json = head.substr(8, n);
  if (json.empty() || json[0] != '{')
    r.fail("the header (byte offset 8) does not start with '{' (corrupt, or not a safetensors file)");
  JsonValue root;
  try {
    root = json_parse(json);
  } catch (const JsonParseError& e) {
    r.fail("the header is not valid JSON: " + e.message + " at byte offset " + std::to_string(8 + e.offset));
  }
  if (root.type != JsonValue::Type::object) r.fail("the header is not a JSON object");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  std::set<std::string_view> seen;
  for (const auto& [key, value] : root.members) {
    if (!seen.insert(key).second) r.fail(value, "tensor '" + key + "'", "the name appears twice in the header");
    if (key == "__metadata__") {
      if (value.type != JsonValue::Type::object) r.fail(value, "__metadata__", "expected an object of strings");
      for (const auto& [mk, mv] : value.members) {
        if (mv.type != JsonValue::Type::string)
          r.fail(mv, "__metadata__." + mk, std::string("expected a string, found a ") + JsonValue::type_name(mv.type));
        h.metadata[mk] = mv.text;
      }
      continue;
    }
    h.tensors.push_back(r.tensor(key, value));
  }

  // The tensors must tile the data buffer: no gap, no overlap, nothing past the end.
  const uint64_t buffer = file_size - h.data_start;
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const SafetensorsTensor* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.end > buffer)
      r.fail("tensor '" + t.name + "': data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             ") run past the end of the " + std::to_string(buffer) + "-byte data buffer (file offset " +
             std::to_string(h.data_start + t.end) + " > file size " + std::to_string(file_size) + ": truncated?)");
    if (t.begin < at)
      r.fail("tensor '" + t.name + "': data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             ") overlap tensor '" + (prev ? prev->name : "") + "', which ends at " + std::to_string(at));
    if (t.begin > at)
      r.fail("tensor '" + t.name + "': data_offsets begin at " + std::to_string(t.begin) + ", leaving bytes [" +
             std::to_string(at) + ", " + std::to_string(t.begin) + ") of the data buffer to no tensor" +
             (prev ? " (after tensor '" + prev->name + "')" : ""));
    at = t.end;
    prev = &t;
  }
  if (at != buffer)
    r.fail("the tensors end at data-buffer byte " + std::to_string(at) + " (file offset " +
           std::to_string(h.data_start + at) + ") but the file has " + std::to_string(buffer - at) +
           " more bytes (trailing data, or a missing tensor)");
  return h;
}

// ---- reader ---------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DatasetError(path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw DatasetError(path.string() + ": cannot stat: " + std::strerror(errno));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  try {
    char len[8] = {};
    const ssize_t got = size >= 8 ? ::pread(fd_, len, 8, 0) : 0;
    uint64_t n = 0;
    if (got == 8) std::memcpy(&n, len, 8);
    // Read just the header: parse_safetensors_header checks n against the cap and the file size
    // before anything of that length is allocated.
    std::string head(len, static_cast<size_t>(std::max<ssize_t>(got, 0)));
    if (got == 8 && n <= kSafetensorsMaxHeaderBytes && n <= size - 8) {
      head.resize(8 + n);
      size_t done = 8;
      while (done < head.size()) {
        ssize_t k = ::pread(fd_, head.data() + done, head.size() - done, static_cast<off_t>(done));
        if (k <= 0) throw DatasetError(path.string() + ": read error in the header at byte offset " + std::to_string(done));
        done += static_cast<size_t>(k);
      }
    }
    header_ = parse_safetensors_header(head, size, path.string());
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsReader::read(const SafetensorsTensor& t, void* dst) const {
  auto* out = static_cast<char*>(dst);
  uint64_t done = 0;
  const uint64_t total = t.bytes();
  while (done < total) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(total - done, uint64_t(1) << 30));
    ssize_t k = ::pread(fd_, out + done, want, static_cast<off_t>(header_.data_start + t.begin + done));
    if (k <= 0)
      throw DatasetError(path_.string() + ": tensor '" + t.name + "': " +
                         (k < 0 ? std::string("read error: ") + std::strerror(errno)
                                : "the file ends at byte offset " + std::to_string(header_.data_start + t.begin + done)) +
                         " (it changed after it was opened?)");
    done += static_cast<uint64_t>(k);
  }
}

// ---- writer ---------------------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::vector<Entry> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), file_(path_) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const Entry& a, const Entry& b) {
    const size_t sa = safetensors_dtype_size(a.dtype), sb = safetensors_dtype_size(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      json += (first ? "" : ",") + json_quote(k) + ":" + json_quote(v);
      first = false;
    }
    json += "}";
  }
  uint64_t at = 0;
  std::set<std::string> names;
  for (const auto& e : tensors) {
    if (e.name == "__metadata__" || !names.insert(e.name).second)
      throw std::invalid_argument(path_.string() + ": tensor name '" + e.name + "' is reserved or given twice");
    SafetensorsTensor t;
    t.name = e.name;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.begin = at;
    t.end = at + t.numel() * safetensors_dtype_size(e.dtype);
    at = t.end;
    json += (json.size() > 1 ? "," : "") + json_quote(t.name) + ":{\"dtype\":\"" + safetensors_dtype_name(t.dtype) +
            "\",\"shape\":" + u64_list(t.shape) + ",\"data_offsets\":[" + std::to_string(t.begin) + "," +
            std::to_string(t.end) + "]}";
    order_.push_back(std::move(t));
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned
  if (json.size() > kSafetensorsMaxHeaderBytes)
    throw std::invalid_argument(path_.string() + ": the header would be " + std::to_string(json.size()) +
                                " bytes, over the format's cap");
  const uint64_t n = json.size();
  file_.write(&n, 8);
  file_.write(json.data(), json.size());
}

void SafetensorsWriter::write(std::string_view name, const void* data, size_t bytes) {
  if (next_ >= order_.size() || order_[next_].name != name || order_[next_].bytes() != bytes)
    throw std::logic_error(path_.string() + ": tensor '" + std::string(name) + "' (" + std::to_string(bytes) +
                           " bytes) written out of order; expected " +
                           (next_ < order_.size() ? "'" + order_[next_].name + "' (" +
                                                        std::to_string(order_[next_].bytes()) + " bytes)"
                                                  : std::string("no more tensors")));
  file_.write(data, bytes);
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != order_.size())
    throw std::logic_error(path_.string() + ": finish() before tensor '" + order_[next_].name + "' was written");
  file_.commit();
}

}  // namespace pipeline::datasets
