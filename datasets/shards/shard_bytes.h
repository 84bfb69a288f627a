// The shard format's bytes (shard.h), shared by its writer, its streaming reader and the block
// reader (block_shard.h): the magics and little-endian integers. Internal to shards/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pipeline::datasets::shard_bytes {

inline constexpr uint32_t kHeaderMagic = 0x184D2A50;  // zstd skippable frame 0: the shard header
inline constexpr uint32_t kIndexMagic = 0x184D2A5B;   // zstd skippable frame 11: the block index
inline constexpr uint32_t kZstdFrameMagic = 0xFD2FB528;
inline constexpr char kTextMagic[8] = {'P', 'L', 'S', 'H', 'T', 'E', 'X', 'T'};
inline constexpr char kTokensMagic[8] = {'P', 'L', 'S', 'H', 'T', 'O', 'K', 'N'};
inline constexpr char kIndexEnd[8] = {'P', 'L', 'S', 'H', 'B', 'L', 'K', 'S'};
inline constexpr size_t kIndexEntryBytes = 32;
inline constexpr size_t kIndexTailBytes = 16;  // u64 N, "PLSHBLKS"

inline void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline std::string hex_bytes(const unsigned char* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

/// Payload bytes a block or shard of `documents` and `items` holds: text adds a 4-byte length a
/// document; tokens are 2 bytes each (items count the end-of-text ids).
inline uint64_t payload_bytes(bool text, uint64_t documents, uint64_t items) {
  return text ? items + 4 * documents : 2 * items;
}

}  // namespace pipeline::datasets::shard_bytes
