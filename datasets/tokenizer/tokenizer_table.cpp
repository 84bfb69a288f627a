// Laying out and opening a vocabulary table (see tokenizer_table.h for the layout).
#include "datasets/tokenizer/tokenizer_table.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace pipeline::datasets {

namespace {

constexpr size_t header_bytes = 64;
constexpr size_t align = 64;
constexpr size_t n_byte_pairs = 256 * 256;

// Header words after the magic, in order.
enum HeaderWord : size_t {
  HeaderWord_version = 2,
  HeaderWord_n_tokens,
  HeaderWord_pool_bytes,
  HeaderWord_n_specials,
  HeaderWord_piece_slots,
  HeaderWord_pair_slots,
  HeaderWord_n_pairs,
  HeaderWord_total_bytes,
};

// Where each section starts; computed the same way when building and when opening. Sizes come
// from 32-bit header fields, so none of this can overflow 64 bits.
struct Layout {
  uint64_t offsets, specials, byte_id, pieces, pairs, byte_pairs, pool, total;
};

uint64_t aligned(uint64_t at) { return (at + align - 1) / align * align; }

Layout layout_of(uint64_t n_tokens, uint64_t pool_bytes, uint64_t n_specials, uint64_t piece_slots,
                 uint64_t pair_slots) {
  Layout l{};
  l.offsets = header_bytes;
  l.specials = aligned(l.offsets + 4 * (n_tokens + 1));
  l.byte_id = aligned(l.specials + 4 * n_specials);
  l.pieces = aligned(l.byte_id + 4 * 256);
  l.pairs = aligned(l.pieces + 4 * piece_slots);
  l.byte_pairs = aligned(l.pairs + 12 * pair_slots);
  l.pool = aligned(l.byte_pairs + 4 * n_byte_pairs);
  l.total = l.pool + pool_bytes;
  return l;
}

void put_u32(std::vector<unsigned char>& out, uint64_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

void put_u32s(std::vector<unsigned char>& out, uint64_t at, const std::vector<uint32_t>& values) {
  for (size_t i = 0; i < values.size(); ++i) put_u32(out, at + 4 * i, values[i]);
}

bpe::U32Array u32s_at(std::span<const unsigned char> table, uint64_t at, uint64_t count) {
  return bpe::U32Array(table.data() + at, count);
}

}  // namespace

std::vector<unsigned char> vocab_table_build(const VocabTokens& tokens) {
  const size_t n = tokens.size();
  std::vector<bool> special(n, false);
  for (uint32_t id : tokens.special_ids) special.at(id) = true;
  std::unordered_map<std::string_view, uint32_t> id_of;
  id_of.reserve(n * 2);
  for (uint32_t id = 0; id < n; ++id)
    if (!special[id]) id_of.emplace(tokens.bytes_of(id), id);

  std::vector<uint32_t> byte_id(256);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const auto it = id_of.find(std::string_view(&c, 1));
    if (it == id_of.end()) throw std::runtime_error("vocabulary table: no token for byte " + std::to_string(b));
    byte_id[b] = it->second;
  }

  // Load factor at most 1/4: probes stay short and misses (most multi-token words) end fast.
  const size_t piece_slots = std::bit_ceil(std::max<size_t>(n * 4, 16));
  std::vector<uint32_t> pieces(piece_slots, bpe::no_id);
  for (uint32_t id = 0; id < n; ++id) {
    if (special[id]) continue;
    const std::string_view t = tokens.bytes_of(id);
    size_t i = bpe::piece_home(reinterpret_cast<const unsigned char*>(t.data()), t.size(), piece_slots - 1);
    while (pieces[i] != bpe::no_id) i = (i + 1) & (piece_slots - 1);
    pieces[i] = id;
  }

  // Every way to cut a token into two tokens is a pair that merges into it: tiktoken merges on
  // "the concatenation is a token", so this reproduces it exactly with one pair lookup.
  std::vector<uint32_t> pair_list;  // (left, right, merged) triples
  for (uint32_t id = 0; id < n; ++id) {
    if (special[id]) continue;
    const std::string_view t = tokens.bytes_of(id);
    for (size_t k = 1; k < t.size(); ++k) {
      const auto left = id_of.find(t.substr(0, k));
      if (left == id_of.end()) continue;
      const auto right = id_of.find(t.substr(k));
      if (right != id_of.end()) pair_list.insert(pair_list.end(), {left->second, right->second, id});
    }
  }
  const size_t n_pairs = pair_list.size() / 3;
  const size_t pair_slots = std::bit_ceil(std::max<size_t>(n_pairs * 2, 16));
  const unsigned pair_shift = 64 - static_cast<unsigned>(std::countr_zero(pair_slots));
  std::vector<uint32_t> pairs(3 * pair_slots, bpe::no_id);
  for (size_t k = 0; k < n_pairs; ++k) {
    const uint32_t a = pair_list[3 * k], b = pair_list[3 * k + 1], merged = pair_list[3 * k + 2];
    size_t i = bpe::pair_home(a, b, pair_shift);
    while (pairs[3 * i + 2] != bpe::no_id && !(pairs[3 * i] == a && pairs[3 * i + 1] == b))
      i = (i + 1) & (pair_slots - 1);
    // A pair's concatenation is one byte string, hence one token: a repeat cannot disagree.
    pairs[3 * i] = a;
    pairs[3 * i + 1] = b;
    pairs[3 * i + 2] = std::min(pairs[3 * i + 2], merged);
  }

  const Layout l = layout_of(n, tokens.pool.size(), tokens.special_ids.size(), piece_slots, pair_slots);
  if (l.total > 0xFFFFFFFFull) throw std::runtime_error("vocabulary table: over 4 GB");
  std::vector<unsigned char> out(l.total, 0);
  std::memcpy(out.data(), vocab_table_magic, sizeof vocab_table_magic);
  put_u32(out, 4 * HeaderWord_version, vocab_table_version);
  put_u32(out, 4 * HeaderWord_n_tokens, static_cast<uint32_t>(n));
  put_u32(out, 4 * HeaderWord_pool_bytes, static_cast<uint32_t>(tokens.pool.size()));
  put_u32(out, 4 * HeaderWord_n_specials, static_cast<uint32_t>(tokens.special_ids.size()));
  put_u32(out, 4 * HeaderWord_piece_slots, static_cast<uint32_t>(piece_slots));
  put_u32(out, 4 * HeaderWord_pair_slots, static_cast<uint32_t>(pair_slots));
  put_u32(out, 4 * HeaderWord_n_pairs, static_cast<uint32_t>(n_pairs));
  put_u32(out, 4 * HeaderWord_total_bytes, static_cast<uint32_t>(l.total));
  put_u32s(out, l.offsets, tokens.offsets);
  put_u32s(out, l.specials, tokens.special_ids);
  put_u32s(out, l.byte_id, byte_id);
  put_u32s(out, l.pieces, pieces);
  put_u32s(out, l.pairs, pairs);
  std::memcpy(out.data() + l.pool, tokens.pool.data(), tokens.pool.size());

  // The first merge of any piece joins two single bytes; the table answers it without hashing.
  const bpe::PairTable pair_table(u32s_at(out, l.pairs, 3 * pair_slots));
  std::vector<uint32_t> byte_pairs(n_byte_pairs);
  for (size_t x = 0; x < 256; ++x)
    for (size_t y = 0; y < 256; ++y) byte_pairs[x * 256 + y] = pair_table.find(byte_id[x], byte_id[y]);
  put_u32s(out, l.byte_pairs, byte_pairs);
  return out;
}

bpe::Vocab vocab_table_open(std::span<const unsigned char> table, std::string_view name) {
  const std::string where = std::string(name) + ": ";
  const char* hint =
      " (a table comes from vocab_table_build; the embedded one is generated at build time by "
      "datasets/tokenizer/gen/make_vocab_table: rebuild)";
  if (table.size() < header_bytes)
    throw std::runtime_error(where + std::to_string(table.size()) + " bytes, shorter than the " +
                             std::to_string(header_bytes) + "-byte header of a vocabulary table" + hint);
  if (std::memcmp(table.data(), vocab_table_magic, sizeof vocab_table_magic) != 0)
    throw std::runtime_error(where + "does not start with the magic \"BPEVOCAB\": not a vocabulary table" + hint);
  const bpe::U32Array header(table.data(), header_bytes / 4);
  if (header[HeaderWord_version] != vocab_table_version)
    throw std::runtime_error(where + "vocabulary table format version " + std::to_string(header[HeaderWord_version]) +
                             ", this build reads version " + std::to_string(vocab_table_version) + hint);
  const uint64_t n = header[HeaderWord_n_tokens];
  const uint64_t n_specials = header[HeaderWord_n_specials];
  const uint64_t piece_slots = header[HeaderWord_piece_slots];
  const uint64_t pair_slots = header[HeaderWord_pair_slots];
  // Lookups probe until an empty slot: a table must never be full.
  if (n < 256 || n_specials > n || !std::has_single_bit(piece_slots) || piece_slots < 2 * n ||
      !std::has_single_bit(pair_slots) || pair_slots < 2 * uint64_t{header[HeaderWord_n_pairs]} || pair_slots < 16)
    throw std::runtime_error(where + "inconsistent header: " + std::to_string(n) + " tokens, " +
                             std::to_string(n_specials) + " special, " + std::to_string(piece_slots) +
                             " piece slots, " + std::to_string(pair_slots) + " pair slots for " +
                             std::to_string(header[HeaderWord_n_pairs]) + " pairs" + hint);
  const Layout l = layout_of(n, header[HeaderWord_pool_bytes], n_specials, piece_slots, pair_slots);
  if (l.total != header[HeaderWord_total_bytes] || l.total != table.size())
    throw std::runtime_error(where + std::to_string(table.size()) + " bytes, but its header describes " +
                             std::to_string(l.total) + " (header says " +
                             std::to_string(header[HeaderWord_total_bytes]) + "): truncated or damaged" + hint);

  bpe::Vocab v;
  v.pool = reinterpret_cast<const char*>(table.data() + l.pool);
  v.offsets = u32s_at(table, l.offsets, n + 1);
  if (v.offsets[0] != 0 || v.offsets[n] != header[HeaderWord_pool_bytes])
    throw std::runtime_error(where + "token offsets do not span the token bytes: truncated or damaged" + hint);
  v.specials = u32s_at(table, l.specials, n_specials);
  for (size_t i = 0; i < n_specials; ++i)
    if (v.specials[i] >= n)
      throw std::runtime_error(where + "special token id " + std::to_string(v.specials[i]) + " is not below " +
                               std::to_string(n) + hint);
  const bpe::U32Array byte_id = u32s_at(table, l.byte_id, 256);
  for (size_t b = 0; b < 256; ++b) {
    v.byte_id[b] = byte_id[b];
    if (v.byte_id[b] >= n)
      throw std::runtime_error(where + "token id " + std::to_string(v.byte_id[b]) + " of byte " + std::to_string(b) +
                               " is not below " + std::to_string(n) + hint);
  }
  v.pieces = bpe::PieceTable(u32s_at(table, l.pieces, piece_slots), v.pool, v.offsets);
  v.pairs = bpe::PairTable(u32s_at(table, l.pairs, 3 * pair_slots));
  v.byte_pairs = u32s_at(table, l.byte_pairs, n_byte_pairs);
  return v;
}

}  // namespace pipeline::datasets
