// The hash of a training row, and of a step's rows (docs/data_order.md): a row's T+1 tokens hash
// to 64 bits (xxHash's XXH3, from Debian's libxxhash-dev), and a step's hash is the sum of its
// rows' hashes modulo 2^64, so it does not depend on the order of the rows or of the ranks (each
// rank sums its rows, an all-reduce sums the ranks). Two runs of one data order print the same
// step hashes; a run on any number of ranks, too.
#pragma once

#include <cstdint>
#include <span>

namespace pipeline::datasets {

/// XXH3-64 of the row's tokens as little-endian uint16 bytes, seed 0.
uint64_t row_hash(std::span<const uint16_t> row);

/// The hash of rows laid out back to back, `row_tokens` (T+1) each: the sum of their hashes.
uint64_t rows_hash(std::span<const uint16_t> rows, size_t row_tokens);

}  // namespace pipeline::datasets
