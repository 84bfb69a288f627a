// The local cache of a remote source's units: one file per unit (a byte range of one version of
// one object), in [data] cache_dir, shared safely by the processes of one machine (two ranks, a
// run and `pipeline eval --val`):
//   - a unit is downloaded once: the download holds an exclusive lock (flock) on the unit's lock
//     file, and a second process asking for it waits for that lock, then finds the unit there;
//   - never read half-written: bytes go to a temporary file that is renamed into place whole, and
//     an entry whose size is not the unit's is thrown away;
//   - a unit in use is never deleted: a process holds a shared lock on each entry it reads, and an
//     entry is deleted only by whoever can take it exclusively;
//   - the cap holds across processes: every process counts its downloads into one shared total
//     (DIR/usage, updated under a lock), and a download waits until the total is under the cap, so
//     the cache never exceeds it by more than one unit. The first process to open the cache
//     while no other holds it recounts the total from the files and removes what a killed
//     process left half-done.
// Entries are named by a hash of (object, version, offset, length): another version of an object
// is another entry, never a mix of two.
//
// Example:
//   io::UnitCache cache(dir, 2ull << 30);
//   auto entry = cache.get({"s3://b/k", "etag", 0, 65536}, [&](int fd) { download_into(fd); });
//   pread(entry->fd(), buf, 100, 0);   // read; the entry stays while `entry` lives
//   entry.reset();                      // done with it: deleted unless another process reads it
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace pipeline::datasets::io {

/// A unit as the cache names it.
struct UnitKey {
  std::string uri;      // the object, as its store names it (query-free)
  std::string version;  // its ETag (or what stands in for one)
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// The platform's cache directory for data: $XDG_CACHE_HOME/pipeline/data, else
/// ~/.cache/pipeline/data ([data] cache_dir's default; never a checkout).
std::filesystem::path default_cache_dir();

class UnitCache {
 public:
  /// An entry in use: its file, open, under this process's shared lock. Deleted from the cache
  /// when the last holder in this process lets go, unless another process holds it too.
  class Entry {
   public:
    ~Entry();
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    int fd() const { return fd_; }
    uint64_t size() const { return size_; }
    /// Keeps the file in the cache when this entry is let go (a unit that will be read again).
    void keep() { keep_ = true; }

   private:
    friend class UnitCache;
    Entry(std::filesystem::path path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
    std::filesystem::path path_;
    int fd_;
    uint64_t size_;
    bool keep_ = false;
  };

  /// Opens (creating) the cache in `dir` with a cap of `cap_bytes` across every process that
  /// uses it. Throws DatasetError naming the directory when it cannot be made or written.
  UnitCache(std::filesystem::path dir, uint64_t cap_bytes);
  ~UnitCache();
  UnitCache(const UnitCache&) = delete;
  UnitCache& operator=(const UnitCache&) = delete;

  /// The unit, if the cache has it now (this process or another put it there): held. Never waits.
  std::shared_ptr<Entry> find(const UnitKey& key);
  /// The unit: from the cache, or downloaded by `download`, which writes its `key.length` bytes
  /// to the file descriptor it is given (the temporary file) and throws on failure (nothing is
  /// kept then). Waits (on the calling thread: the fetch stage's own) for another process's
  /// download of the same unit, and for room under the cap; `cancel` cuts the wait for room short
  /// (returns null). `*downloaded` tells whether this call downloaded it.
  std::shared_ptr<Entry> get(const UnitKey& key, const std::function<void(int fd)>& download,
                             const std::atomic<bool>* cancel = nullptr, bool* downloaded = nullptr);

  /// Bytes the cache holds now, every process's entries and downloads in progress counted.
  uint64_t bytes() const;
  /// The most bytes seen at once (the total after each download started), for the tests and stats.
  uint64_t high_water() const { return high_water_.load(std::memory_order_relaxed); }
  uint64_t cap() const { return cap_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path entry_path(const UnitKey& key) const;
  // The shared total: add `delta` (which may be negative) under the usage lock; with `admit`,
  // only while the total plus delta stays within the cap (or the cache is empty). Returns whether
  // it was added.
  bool add_usage(int64_t delta, bool admit);
  // Removes entries no process holds (an earlier run's, a finished reader's kept ones), oldest
  // first, until `needed` bytes fit. Returns whether any went.
  bool evict_unheld(uint64_t needed);
  void release(Entry* e);
  void recount_when_alone();

  std::filesystem::path dir_;
  uint64_t cap_;
  int usage_fd_ = -1;  // DIR/usage: the shared total (8 bytes), locked while read and written
  int users_fd_ = -1;  // DIR/users: a shared lock per process using the cache
  std::atomic<uint64_t> high_water_{0};
  std::atomic<uint64_t> temp_counter_{0};
  std::mutex room_mu_;
  std::condition_variable room_cv_;  // this process let an entry go
};

}  // namespace pipeline::datasets::io
