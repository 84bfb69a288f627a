// SHA-256 (FIPS 180-4), written here so datasets/ needs no crypto library just to check
// shard integrity. Incremental: feed bytes as they stream past, then take the digest.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace pipeline::datasets {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  /// Finishes the hash; the object must not be updated afterwards.
  std::array<uint8_t, 32> digest();
  /// Lower-case hex of digest().
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> block_{};
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

/// Hex SHA-256 of a byte string.
std::string sha256_hex(std::string_view data);

/// Hex SHA-256 of a file, read in bounded chunks. Throws std::runtime_error naming the file.
std::string sha256_file_hex(const std::filesystem::path& path);

}  // namespace pipeline::datasets
