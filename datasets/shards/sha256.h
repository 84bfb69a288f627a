// SHA-256 of byte strings and files, for shard integrity (the hashes in manifest.json).
// OpenSSL's libcrypto does the hashing (with SHA-NI where the CPU has it); this wrapper keeps its
// headers out of the rest of datasets/. Incremental: feed bytes as they stream past, then take
// the digest.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;

namespace pipeline::datasets {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  /// Finishes the hash; the object must not be updated afterwards.
  std::array<uint8_t, 32> digest();
  /// Lower-case hex of digest().
  std::string hex_digest();

 private:
  struct FreeCtx {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_md_ctx_st, FreeCtx> ctx_;
};

/// Hex SHA-256 of a byte string.
std::string sha256_hex(std::string_view data);

/// Hex SHA-256 of a file, read in bounded chunks. Throws std::runtime_error naming the file.
std::string sha256_file_hex(const std::filesystem::path& path);

}  // namespace pipeline::datasets
