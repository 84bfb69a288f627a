// SHA-256 through OpenSSL's EVP interface (see sha256.h).
#include "datasets/shards/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace pipeline::datasets {
namespace {

[[noreturn]] void openssl_failed(const char* what) {
  char buf[256];
  ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
  throw std::runtime_error(std::string("SHA-256: ") + what + " failed: " + buf);
}

}  // namespace

void Sha256::FreeCtx::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) openssl_failed("EVP_MD_CTX_new");
  if (EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) openssl_failed("EVP_DigestInit_ex");
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t size) {
  if (size > 0 && EVP_DigestUpdate(ctx_.get(), data, size) != 1) openssl_failed("EVP_DigestUpdate");
}

std::array<uint8_t, 32> Sha256::digest() {
  std::array<uint8_t, 32> out{};
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx_.get(), out.data(), &n) != 1 || n != out.size()) openssl_failed("EVP_DigestFinal_ex");
  return out;
}

std::string Sha256::hex_digest() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (uint8_t b : digest()) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

std::string sha256_file_hex(const std::filesystem::path& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error(path.string() + ": cannot open for hashing: " + std::strerror(errno));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) h.update(buf.data(), n);
  if (std::ferror(f.get()))
    throw std::runtime_error(path.string() + ": read error while hashing: " + std::strerror(errno));
  return h.hex_digest();
}

}  // namespace pipeline::datasets
