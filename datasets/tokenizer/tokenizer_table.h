// A vocabulary as one flat table of bytes that the tokenizer uses in place: token bytes, the
// piece and pair hash tables and the byte-pair shortcut, laid out once. The GPT-2 table is laid
// out at build time (datasets/tokenizer/gen/make_vocab_table.cpp) and compiled into the library, so
// start-up neither parses nor allocates per token; files given at run time are laid out the
// same way, by the same code.
//
// Layout, format version 1. Integers are little-endian uint32; each section starts at a
// multiple of 64 bytes (a cache line), in this order, after a 64-byte header:
//   header   "BPEVOCAB" (8 bytes), then version, n_tokens, pool_bytes, n_specials,
//            piece_slots, pair_slots, n_pairs, total_bytes
//   offsets     n_tokens + 1   token id -> start of its bytes in pool (the last: pool_bytes)
//   specials    n_specials     ids of the special tokens
//   byte_id     256            byte -> its one-byte token
//   pieces      piece_slots    token bytes -> id, open addressing (bpe::PieceTable)
//   pairs       3 * pair_slots (left, right) -> merged id, open addressing (bpe::PairTable)
//   byte_pairs  65536          256 * first byte + second -> merged id of the two bytes' tokens
//   pool        pool_bytes     token bytes, back to back
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "datasets/tokenizer/tokenizer_bpe.h"
#include "datasets/tokenizer/tokenizer_files.h"

namespace pipeline::datasets {

inline constexpr char vocab_table_magic[8] = {'B', 'P', 'E', 'V', 'O', 'C', 'A', 'B'};
inline constexpr uint32_t vocab_table_version = 1;

/// Lays out the table of checked tokens (tokenizer_files.h). Throws std::runtime_error if a
/// byte has no one-byte token.
std::vector<unsigned char> vocab_table_build(const VocabTokens& tokens);

/// Views a table's bytes, which must outlive the result (bpe::Vocab::storage may own them).
/// Checks the header only (magic, version, sizes against `table.size()`), so opening takes
/// microseconds and touches one page: the contents are trusted to come from vocab_table_build.
/// Throws std::runtime_error naming `name` and what is wrong. The view's serial is left 0.
bpe::Vocab vocab_table_open(std::span<const unsigned char> table, std::string_view name);

// The GPT-2 table, generated at build time from datasets/tokenizer/vocab/*.zst (datasets/CMakeLists.txt).
namespace embedded {
extern const unsigned char gpt2_vocab_table[];
extern const size_t gpt2_vocab_table_size;
}  // namespace embedded

}  // namespace pipeline::datasets
