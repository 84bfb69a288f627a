// Internal to the tokenizer: the immutable lookup tables of a loaded vocabulary and the
// byte-pair merge. Exposed in a header so tests can check the two merge paths against
// each other; nothing outside datasets/tokenizer*.cpp and the tests should need it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline::datasets::bpe {

inline constexpr uint32_t no_id = 0xFFFFFFFFu;

/// Hash of a short byte string (pieces are a few bytes long on average).
inline uint64_t hash_bytes(const unsigned char* p, size_t n) {
  constexpr uint64_t k = 0x9E3779B97F4A7C15ull;
  uint64_t h = n * k;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * k;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  for (size_t i = 0; i < n; ++i) w |= uint64_t{p[i]} << (8 * i);
  h = (h ^ w) * k;
  h ^= h >> 32;
  return h;
}

/// Open-addressing map from token bytes to id, over the vocabulary's byte pool. Read-only after
/// build, so any number of threads may look up at once.
class PieceTable {
 public:
  void build(const std::string& pool, const std::vector<uint32_t>& offsets, const std::vector<bool>& skip);
  uint32_t find(const unsigned char* p, size_t n) const {
    size_t i = hash_bytes(p, n) & mask_;
    for (;;) {
      const uint32_t id = slots_[i];
      if (id == no_id) return no_id;
      const uint32_t off = offsets_[id];
      if (offsets_[id + 1] - off == n && std::memcmp(pool_ + off, p, n) == 0) return id;
      i = (i + 1) & mask_;
    }
  }

 private:
  std::vector<uint32_t> slots_;
  size_t mask_ = 0;
  const char* pool_ = nullptr;
  const uint32_t* offsets_ = nullptr;
};

/// Open-addressing map from an adjacent pair of ids to the id of their concatenation, which in
/// GPT-2 (as in tiktoken) is also the merge's rank: lower id, earlier merge. Sized exactly (load
/// factor at most 1/2) with 12-byte entries, so GPT-2's ~108K pairs take 3 MB: lookups during a
/// merge are mostly cache misses, and a smaller table misses less.
class PairTable {
 public:
  void reserve(size_t n);
  void insert(uint32_t a, uint32_t b, uint32_t merged);
  size_t size() const { return size_; }
  uint32_t find(uint32_t a, uint32_t b) const {
    size_t i = slot_of(a, b);
    for (;;) {
      const Entry& e = entries_[i];
      if (e.a == a && e.b == b) return e.merged;
      if (e.merged == no_id) return no_id;
      i = (i + 1) & mask_;
    }
  }

 private:
  struct Entry {
    uint32_t a, b;
    uint32_t merged;  // no_id: empty slot
  };
  size_t slot_of(uint32_t a, uint32_t b) const {
    return static_cast<size_t>((((uint64_t{a} << 32) | b) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  unsigned shift_ = 63;
  size_t size_ = 0;
};

/// Everything encode/decode need, immutable once built.
struct Vocab {
  std::string pool;               // token bytes, back to back
  std::vector<uint32_t> offsets;  // token id -> [offsets[id], offsets[id + 1]) in pool
  uint32_t byte_id[256] = {};     // single byte -> its token id
  PieceTable pieces;              // whole piece -> id (special tokens left out)
  PairTable pairs;                // (left id, right id) -> merged id
  std::vector<uint32_t> byte_pairs;  // 256 * first byte + second -> merged id or no_id: the first
                                     // round of every merge, from a 256 KB table instead of `pairs`
  uint32_t serial = 0;            // unique per loaded vocabulary; tags per-thread cache entries
  std::vector<std::pair<std::string, uint32_t>> specials;  // e.g. "<|endoftext|>" -> 50256

  std::string_view bytes_of(uint32_t id) const { return {pool.data() + offsets[id], offsets[id + 1] - offsets[id]}; }
};

/// Pieces up to this many bytes use the quadratic scan (fast for short words); longer ones use
/// the heap, which keeps pathological inputs (megabyte runs of digits or spaces) O(n log n).
inline constexpr size_t small_piece_max = 64;

/// Appends the ids of one pre-token piece. Both paths give tiktoken's result: repeatedly merge
/// the adjacent pair with the lowest rank, leftmost first on ties.
void merge_small(const Vocab& v, const unsigned char* p, size_t n, std::vector<uint32_t>& out);
void merge_large(const Vocab& v, const unsigned char* p, size_t n, std::vector<uint32_t>& out);

/// A per-thread, direct-mapped cache of recent pieces and their ids. Natural text repeats its
/// words, so most multi-token words are merged once per thread and then copied. Entries are
/// tagged with the vocabulary's serial, so one thread may use several tokenizers. 512 KB per
/// thread that encodes, allocated on its first encode.
struct PieceCache {
  static constexpr size_t max_bytes = 24;
  static constexpr size_t max_ids = 8;
  static constexpr size_t n_entries = 8192;
  struct alignas(64) Entry {
    uint64_t key[3];  // the piece, zero-padded
    uint32_t tag;     // Vocab::serial; 0 = empty
    uint8_t len;
    uint8_t n_ids;
    uint32_t ids[max_ids];
  };
  Entry entries[n_entries];
};
static_assert(sizeof(PieceCache::Entry) == 64);

/// The calling thread's cache.
PieceCache& thread_piece_cache();

inline void encode_uncached(const Vocab& v, const unsigned char* p, size_t n, std::vector<uint32_t>& out) {
  // tiktoken emits a whole piece that is itself a token without merging (usually the same
  // answer, but this is the rule that defines parity).
  if (const uint32_t id = v.pieces.find(p, n); id != no_id) {
    out.push_back(id);
  } else if (n <= small_piece_max) {
    merge_small(v, p, n, out);
  } else {
    merge_large(v, p, n, out);
  }
}

/// Appends the ids of one pre-token piece.
inline void encode_piece(const Vocab& v, PieceCache& cache, std::string_view piece, std::vector<uint32_t>& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(v.byte_id[p[0]]);
    return;
  }
  if (n > PieceCache::max_bytes) {
    encode_uncached(v, p, n, out);
    return;
  }
  uint64_t key[3] = {0, 0, 0};
  std::memcpy(key, p, n);
  const uint64_t h = (key[0] * 0x9E3779B97F4A7C15ull) ^ (key[1] * 0xC2B2AE3D27D4EB4Full) ^
                     (key[2] * 0x165667B19E3779F9ull) ^ n;
  PieceCache::Entry& e = cache.entries[(h ^ (h >> 29)) & (PieceCache::n_entries - 1)];
  if (e.tag == v.serial && e.len == n && e.key[0] == key[0] && e.key[1] == key[1] && e.key[2] == key[2]) {
    out.insert(out.end(), e.ids, e.ids + e.n_ids);
    return;
  }
  const size_t before = out.size();
  encode_uncached(v, p, n, out);
  const size_t n_ids = out.size() - before;
  if (n_ids <= PieceCache::max_ids) {
    std::memcpy(e.key, key, sizeof key);
    e.tag = v.serial;
    e.len = static_cast<uint8_t>(n);
    e.n_ids = static_cast<uint8_t>(n_ids);
    std::memcpy(e.ids, out.data() + before, n_ids * sizeof(uint32_t));
  }
}

}  // namespace pipeline::datasets::bpe
