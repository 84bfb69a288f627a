// Row hashes (row_hash.h) through xxHash.
#include "datasets/lanes/row_hash.h"

#include <xxhash.h>

#include <bit>

#include "datasets/dataset_error.h"

namespace pipeline::datasets {

static_assert(std::endian::native == std::endian::little, "rows hash as little-endian uint16 bytes in place");

uint64_t row_hash(std::span<const uint16_t> row) { return XXH3_64bits(row.data(), row.size_bytes()); }

uint64_t rows_hash(std::span<const uint16_t> rows, size_t row_tokens) {
  if (row_tokens == 0 || rows.size() % row_tokens != 0)
    throw DatasetError("rows_hash: " + std::to_string(rows.size()) + " tokens are not whole rows of " +
                       std::to_string(row_tokens));
  uint64_t sum = 0;  // unsigned: wraps modulo 2^64
  for (size_t at = 0; at < rows.size(); at += row_tokens) sum += row_hash(rows.subspan(at, row_tokens));
  return sum;
}

}  // namespace pipeline::datasets
