// A remote store's fetching: threads of its own (as oneTBB's fgbzip2 example does its I/O: blocking
// calls never on a TBB worker) that download the lanes' next units into the cache in the order the
// plan gives, and the read path that serves a RangeFile's reads from them.
//
// Order. Lanes consume at the same rate, so the lane that has the fewest bytes planned before its
// next unit will need that unit first: the threads take units lane by lane in that order, at most
// `prefetch` units ahead of the reads (fetched or in flight, not read yet) and within the cache's
// cap.
//
// Reads. A read inside a unit of the plan waits for it if it is in flight, then reads the cached
// file (a hit); the first read in a lane's unit means the lane is done with its earlier ones,
// which are let go (deleted unless another process reads them), as is a unit every byte of which
// has been read. A read outside the plan (a Parquet footer, a lane the plan does not cover) goes
// to the network at once (a miss); small reads at a file's end (footers, not a whole file) are kept in memory.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/cache_line.h"
#include "datasets/io/cache.h"
#include "datasets/io/store.h"

namespace pipeline::datasets::io {

/// The fetcher's counters, each on a line of its own (fetch threads and readers bump them).
struct FetchCounters {
  alignas(kCacheLine) std::atomic<uint64_t> bytes{0};
  alignas(kCacheLine) std::atomic<uint64_t> requests{0};
  alignas(kCacheLine) std::atomic<int64_t> busy_ns{0};
  alignas(kCacheLine) std::atomic<int64_t> in_flight{0};
  alignas(kCacheLine) std::atomic<uint64_t> retries{0};
  alignas(kCacheLine) std::atomic<uint64_t> units{0};
  alignas(kCacheLine) std::atomic<uint64_t> hit_bytes{0};
  alignas(kCacheLine) std::atomic<uint64_t> miss_bytes{0};
  alignas(kCacheLine) std::atomic<uint64_t> wait_ns{0};
};

class Fetcher {
 public:
  /// Downloads bytes [offset, offset + length) of `file`, retried and checked, handing them to
  /// `out` in order; throws DatasetError when it gives up. Called from several threads at once.
  using Download = std::function<void(const ObjectInfo& file, uint64_t offset, uint64_t length,
                                      const std::function<void(const char*, size_t)>& out)>;

  Fetcher(const StoreOptions& options, Download download, FetchCounters& counters);
  ~Fetcher();
  Fetcher(const Fetcher&) = delete;
  Fetcher& operator=(const Fetcher&) = delete;

  /// Replaces the plan: these lanes' units from now on. Units already fetched stay until read.
  void plan(std::vector<LaneUnits> lanes);
  /// Moves the limits while it runs (autotune): requests at once, units ahead (0: unchanged).
  void set_limits(int connections, int prefetch);
  int connections() const { return connections_.load(std::memory_order_relaxed); }
  int prefetch() const { return prefetch_.load(std::memory_order_relaxed); }
  /// A reader is done with this unit: its slot (the oldest of its lane's if the plan holds it
  /// twice) goes, and with it the cached file.
  void release(const UnitRef& unit);
  /// Up to n bytes of `file` at `offset` (the caller has clipped n to the file's end).
  void read(const ObjectInfo& file, uint64_t offset, void* out, size_t n);
  UnitCache& cache() { return *cache_; }

 private:
  struct Slot;
  using SlotPtr = std::shared_ptr<Slot>;
  struct Lane {
    LaneUnits next;
    uint64_t planned_bytes = 0;  // bytes of the units taken from it so far: its place in the order
    std::deque<SlotPtr> slots;   // its units fetched or in flight, oldest first
    bool ended = false;
  };

  void thread_main(int index);
  // The next unit to fetch, taken from the lane that needs one first; null when none may go now.
  SlotPtr take_next_locked();
  void fetch(const SlotPtr& slot);
  // Lets go of a slot (and its entry, returned so the caller drops it outside the lock).
  std::shared_ptr<UnitCache::Entry> drop_locked(const SlotPtr& slot);
  bool read_planned(const ObjectInfo& file, uint64_t offset, void* out, size_t n);
  void read_direct(const ObjectInfo& file, uint64_t offset, void* out, size_t n);

  StoreOptions options_;
  Download download_;
  FetchCounters& counters_;
  std::unique_ptr<UnitCache> cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Lane> lanes_;
  // The units in flight or fetched, by file then offset: where a read looks first.
  std::map<std::string, std::map<uint64_t, SlotPtr>> by_file_;
  int ahead_ = 0;  // slots fetched or in flight that no read has reached yet
  // Units their readers were done with before the threads came to them (the readers ran ahead
  // and read them from the network): skipped when a lane's plan reaches them.
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> passed_;
  // Units read whole, whose release by their reader is still to come.
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> read_whole_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{1}, prefetch_{1};  // threads at work (of threads_), units ahead
  std::vector<std::thread> threads_;
  // Small reads that end at a file's end (Parquet footers), kept: every unit of a file needs them.
  struct Tail {
    std::string key;
    std::string bytes;
  };
  std::list<Tail> tails_;
};

}  // namespace pipeline::datasets::io
