// Text or not (see text_check.h).
#include "datasets/shards/text_check.h"

#include <cstdio>
#include <string>

#include "datasets/dataset_error.h"

namespace pipeline::datasets {
namespace {

struct Signature {
  std::string_view magic;
  const char* format;
  const char* hint;
};

using namespace std::string_view_literals;
constexpr Signature kSignatures[] = {
    {"PAR1"sv, "Parquet", "name it *.parquet (or give its directory) to read its text column"},
    {"\x1f\x8b"sv, "gzip", "decompress it first (gunzip)"},
    {"\x28\xb5\x2f\xfd"sv, "zstd", "decompress it first (zstd -d)"},
    {"\x50\x2a\x4d\x18"sv, "zstd skippable-frame",
     "a shard of this project? give its dataset's directory to `pipeline run`"},
    {"ARROW1"sv, "Arrow IPC", "convert it to Parquet or text"},
    {"\xff\xff\xff\xff"sv, "Arrow IPC stream", "convert it to Parquet or text"},
    {"BZh"sv, "bzip2", "decompress it first (bunzip2)"},
    {"\xfd" "7zXZ\x00"sv, "xz", "decompress it first (unxz)"},
    {"PK\x03\x04"sv, "zip", "unpack it first"},
};

std::string hex(std::string_view bytes) {
  std::string out;
  char b[4];
  for (unsigned char c : bytes) {
    std::snprintf(b, sizeof b, "%s%02x", out.empty() ? "" : " ", c);
    out += b;
  }
  return out;
}

}  // namespace

const char* binary_signature(std::string_view head) {
  for (const auto& s : kSignatures)
    if (head.starts_with(s.magic)) return s.format;
  return nullptr;
}

void refuse_binary_signature(const std::filesystem::path& file, std::string_view head) {
  for (const auto& s : kSignatures)
    if (head.starts_with(s.magic))
      throw DatasetError(file.string() + ": byte 0: " + s.format + " data (it starts with " + hex(s.magic) +
                         "), not text; " + s.hint);
}

void refuse_nul_bytes(const std::filesystem::path& file, std::string_view text, uint64_t offset) {
  const size_t at = text.find('\0');
  if (at != std::string_view::npos)
    throw DatasetError(file.string() + ": byte " + std::to_string(offset + at) +
                       ": a NUL byte, which text does not hold (a binary file given as text?)");
}

uint64_t invalid_utf8_bytes(std::string_view text) {
  uint64_t bad = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Sequence length and the allowed range of the second byte (RFC 3629: no overlongs, no
    // surrogates, nothing above U+10FFFF).
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    size_t ok = len ? 1 : 0;
    if (len && i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi) {
      ok = 2;
      while (ok < len && i + ok < n && p[i + ok] >= 0x80 && p[i + ok] <= 0xBF) ++ok;
    }
    if (len && ok == len) {
      i += len;
    } else {
      ++bad;  // one bad byte; resynchronise on the next
      ++i;
    }
  }
  return bad;
}

}  // namespace pipeline::datasets
