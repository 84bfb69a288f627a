// Per-thread mutable state kept side by side (one slot per worker in an array, counters of
// different threads in one object) must not share a cache line: every write by one thread
// would evict the line from the others' caches (false sharing), and the cost moves with the
// heap's layout from run to run. Pad such state to a line of its own.
#pragma once

#include <cstddef>

namespace pipeline {

/// The line that false sharing is about: 64 bytes on x86-64 and the ARM cores we run on.
/// (std::hardware_destructive_interference_size says the same, but GCC warns that its value
/// may differ between compilations, which our warnings-as-errors builds reject.)
inline constexpr std::size_t kCacheLine = 64;

/// A value on cache lines of its own, for arrays of per-worker or per-thread state.
template <class T>
struct alignas(kCacheLine) CacheLinePadded {
  T value{};
};

}  // namespace pipeline
