// splitmix64's finaliser: the one 64-bit mixing function behind every seeded, stateless choice in
// datasets/ (which split a document goes to, the order of Parquet row groups, a mix's draws), so
// that a choice is a pure function of (seed, index) and resumes without stored RNG state.
#pragma once

#include <cstdint>

namespace pipeline::datasets {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace pipeline::datasets
