// Hashing speed: SHA-256 of a shard-sized file (what opening a dataset verifies against its
// manifest) and CRC-32 of the same bytes in memory (what a checkpoint's payload costs).
//
//   bench_hash [--bytes 1G] [--repeats 5] [--file PATH]
//
// Without --file it writes a file of pseudo-random bytes to the temporary directory first and
// removes it after; the file is in the page cache when it is hashed, so the figure is the hash's
// speed, not the disk's. Prints each repeat and the min / median / max in MB/s.
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "datasets/shards/sha256.h"

namespace {

uint64_t parse_size(const std::string& s) {
  uint64_t v = std::stoull(s);
  switch (s.back()) {
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    default: return v;
  }
}

void report(const char* what, std::vector<double> mbps) {
  std::sort(mbps.begin(), mbps.end());
  std::printf("%-28s min %8.1f  median %8.1f  max %8.1f MB/s (%zu runs)\n", what, mbps.front(), mbps[mbps.size() / 2],
              mbps.back(), mbps.size());
}

}  // namespace

int main(int argc, char** argv) try {
  uint64_t bytes = uint64_t(1) << 30;
  int repeats = 5;
  std::filesystem::path file;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--bytes" && i + 1 < argc) bytes = parse_size(argv[++i]);
    else if (a == "--repeats" && i + 1 < argc) repeats = std::stoi(argv[++i]);
    else if (a == "--file" && i + 1 < argc) file = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_hash [--bytes 1G] [--repeats 5] [--file PATH]\n");
      return 2;
    }
  }
  const bool own_file = file.empty();
  std::vector<char> buf(size_t(1) << 24);
  if (own_file) {
    file = std::filesystem::temp_directory_path() / ("bench_hash_" + std::to_string(::getpid()) + ".bin");
    std::ofstream out(file, std::ios::binary);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t done = 0; done < bytes; done += buf.size()) {
      for (size_t i = 0; i < buf.size(); i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::memcpy(buf.data() + i, &x, 8);
      }
      out.write(buf.data(), static_cast<std::streamsize>(std::min<uint64_t>(buf.size(), bytes - done)));
    }
    if (!out) throw std::runtime_error("cannot write " + file.string());
  }
  bytes = std::filesystem::file_size(file);
  std::printf("file %s, %.1f MB\n", file.c_str(), static_cast<double>(bytes) / 1e6);

  std::vector<double> sha, crc;
  std::string digest;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    digest = pipeline::datasets::sha256_file_hex(file);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sha.push_back(static_cast<double>(bytes) / 1e6 / s);
    std::printf("sha256 run %d: %.2f s  %s\n", r + 1, s, digest.c_str());
  }
  // CRC-32 over the same bytes, read into memory once: a checkpoint's payload is in memory.
  std::vector<char> all(bytes);
  {
    std::ifstream in(file, std::ios::binary);
    in.read(all.data(), static_cast<std::streamsize>(bytes));
  }
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    uLong c = 0;
    for (uint64_t off = 0; off < bytes; off += uint64_t(1) << 30)
      c = ::crc32(c, reinterpret_cast<const Bytef*>(all.data() + off),
                  static_cast<uInt>(std::min<uint64_t>(uint64_t(1) << 30, bytes - off)));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    crc.push_back(static_cast<double>(bytes) / 1e6 / s);
    std::printf("crc32 run %d: %.2f s  %08lx\n", r + 1, s, c);
  }
  report("sha256 (file, page cache)", sha);
  report("crc32 (zlib, memory)", crc);
  if (own_file) std::filesystem::remove(file);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_hash: %s\n", e.what());
  return 1;
}
