// Internal to the tokenizer: views of the immutable lookup tables of an opened vocabulary
// (their layout is tokenizer_table.h's) and the byte-pair merge. Exposed in a header so tests can check the two merge paths against
// each other; nothing outside datasets/tokenizer/tokenizer*.cpp and the tests should need it.
#pragma once

#include <bit>
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

/// A little-endian uint32 array inside a table's bytes (tokenizer_table.h). Loads go through
/// memcpy, which compiles to one plain load and is defined for bytes of any origin and alignment.
class U32Array {
 public:
  U32Array() = default;
  U32Array(const unsigned char* data, size_t size) : data_(data), size_(size) {}
  uint32_t operator[](size_t i) const {
    uint32_t v;
    std::memcpy(&v, data_ + 4 * i, 4);
    if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
    return v;
  }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

/// Where a piece's probe starts in a PieceTable of `mask + 1` slots (a power of two).
inline size_t piece_home(const unsigned char* p, size_t n, size_t mask) { return hash_bytes(p, n) & mask; }

/// Where a pair's probe starts in a PairTable of 2^(64 - shift) slots.
inline size_t pair_home(uint32_t a, uint32_t b, unsigned shift) {
  return static_cast<size_t>((((uint64_t{a} << 32) | b) * 0x9E3779B97F4A7C15ull) >> shift);
}

/// Open-addressing map from token bytes to id: slot -> id or no_id, probed linearly from
/// piece_home. A view over the table's bytes, so any number of threads may look up at once.
class PieceTable {
 public:
  PieceTable() = default;
  PieceTable(U32Array slots, const char* pool, U32Array offsets)
      : slots_(slots), mask_(slots.size() - 1), pool_(pool), offsets_(offsets) {}
  uint32_t find(const unsigned char* p, size_t n) const {
    size_t i = piece_home(p, n, mask_);
    for (;;) {
      const uint32_t id = slots_[i];
      if (id == no_id) return no_id;
      const uint32_t off = offsets_[id];
      if (offsets_[id + 1] - off == n && std::memcmp(pool_ + off, p, n) == 0) return id;
      i = (i + 1) & mask_;
    }
  }

 private:
  U32Array slots_;
  size_t mask_ = 0;
  const char* pool_ = nullptr;
  U32Array offsets_;
};

/// Open-addressing map from an adjacent pair of ids to the id of their concatenation, which in
/// GPT-2 (as in tiktoken) is also the merge's rank: lower id, earlier merge. Entries are three
/// words (left, right, merged; merged == no_id: empty), probed linearly from pair_home, at a
/// load factor of at most 1/2, so GPT-2's ~108K pairs take 3 MB: lookups during a merge are
/// mostly cache misses, and a smaller table misses less.
class PairTable {
 public:
  PairTable() = default;
  explicit PairTable(U32Array words)
      : words_(words),
        mask_(words.size() / 3 - 1),
        shift_(64 - static_cast<unsigned>(std::countr_zero(words.size() / 3))) {}
  uint32_t find(uint32_t a, uint32_t b) const {
    size_t i = pair_home(a, b, shift_);
    for (;;) {
      const uint32_t merged = words_[3 * i + 2];
      if (words_[3 * i] == a && words_[3 * i + 1] == b) return merged;
      if (merged == no_id) return no_id;
      i = (i + 1) & mask_;
    }
  }

 private:
  U32Array words_;
  size_t mask_ = 0;
  unsigned shift_ = 63;
};

/// Everything encode/decode need: views over one table's bytes (tokenizer_table.h), immutable.
struct Vocab {
  const char* pool = nullptr;  // token bytes, back to back
  U32Array offsets;            // token id -> [offsets[id], offsets[id + 1]) in pool
  uint32_t byte_id[256] = {};  // single byte -> its token id
  U32Array specials;           // ids of the special tokens, e.g. 50256 "<|endoftext|>"
  PieceTable pieces;           // whole piece -> id (special tokens left out)
  PairTable pairs;             // (left id, right id) -> merged id
  U32Array byte_pairs;         // 256 * first byte + second -> merged id or no_id: the first
                               // round of every merge, from a 256 KB table instead of `pairs`
  uint32_t serial = 0;         // unique per opened vocabulary; tags per-thread cache entries
  std::vector<unsigned char> storage;  // the table's bytes when built at run time (a moved vector
                                       // keeps its buffer); empty for the embedded table

  size_t size() const { return offsets.size() - 1; }
  std::string_view bytes_of(uint32_t id) const { return {pool + offsets[id], offsets[id + 1] - offsets[id]}; }
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
