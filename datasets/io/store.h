// Where a source's bytes come from: a store (the local file system, S3, HTTPS) lists and opens
// files, and a RangeFile reads one file's bytes at offsets. Everything that decodes data (shards,
// llm.c shards, Parquet) reads through these, so a remote source reads like a local one: a remote
// store's files read through its cache (cache.h), which its fetch threads fill ahead of the lanes
// in the order of the plan (prefetch; the remote stores are in remote_store.h, built as a module
// loaded at the first remote source: remote_module.h; docs/remote.md).
//
// Example:
//   auto store = io::open_store("datasets/data/tinyshakespeare/tokens");
//   for (const io::ObjectInfo& f : store->list("datasets/data/tinyshakespeare/tokens")) {
//     auto file = store->open(f);
//     char head[40];
//     file->read_at(0, head, sizeof head);
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "datasets/io/credentials.h"

namespace pipeline::datasets::io {

/// One file's bytes, read at offsets. Not shared between threads (open it once per reader).
class RangeFile {
 public:
  virtual ~RangeFile() = default;
  virtual uint64_t size() const = 0;
  /// Up to n bytes at `offset` into `out`; fewer only at the end of the file. Throws DatasetError
  /// naming the file (name()), the offset and why.
  virtual size_t read_at(uint64_t offset, void* out, size_t n) = 0;
  /// The file as printed: a path, or a URL with its query string redacted.
  virtual const std::string& name() const = 0;
  /// A local path that holds the whole file, when there is one (a local source, or a remote file
  /// cached whole), else empty: for decoders that stream a path.
  virtual std::filesystem::path local_path() const { return {}; }
};

/// A file of a store, as it was when it was listed or looked at.
struct ObjectInfo {
  std::string uri;      // as the store names it: a path, s3://bucket/key, https://host/path
  uint64_t size = 0;
  std::string version;  // what tells two contents apart: "mtime:size" locally, the ETag remotely
};

/// A unit to fetch ahead: a byte range of one file (a shard's block, a row group's column chunk,
/// a range of an llm.c shard's tokens).
struct UnitRef {
  ObjectInfo file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// One lane's units from where it stands, in the order it will read them; nullopt after its last.
/// Called by the store's fetch threads (under the store's lock: it must be cheap and not block).
using LaneUnits = std::function<std::optional<UnitRef>()>;

/// What a remote store has done since it opened, for the fetch stage's figures.
struct FetchStats {
  uint64_t bytes = 0;             // downloaded (units ahead and reads on demand)
  uint64_t requests = 0;          // requests answered, retries included
  double busy_s = 0;              // connection seconds spent in requests (all connections together)
  int64_t in_flight = 0;          // requests in progress now
  uint64_t retries = 0;           // attempts made again after a passing fault
  uint64_t units = 0;             // units fetched ahead into the cache
  uint64_t hit_bytes = 0;         // bytes read from the cache (or waited for while it fetched them)
  uint64_t miss_bytes = 0;        // bytes read from the network on demand: the plan had not fetched them
  double wait_s = 0;              // readers' time waiting for bytes (a unit in flight, a read on demand)
  uint64_t cache_bytes = 0;       // the cache's total now, every process's entries counted
  uint64_t cache_high_water = 0;  // its most, seen by this process
  uint64_t cache_cap = 0;
  int connections = 0;            // the limits in force
  int prefetch = 0;
};

/// How a store reaches its files, and the cache and fetching of a remote one: [data] endpoint,
/// region, profile, allow_http, cache_dir and [stages.fetch]'s keys. A local store ignores them.
struct StoreOptions {
  std::string endpoint;                 // S3: an S3-compatible server (MinIO, R2, rclone)
  std::string region;
  std::string profile;                  // S3: the profile in ~/.aws/credentials
  bool allow_http = false;              // http:// (no TLS) only when asked for
  std::filesystem::path cache_dir;      // "" : default_cache_dir() (cache.h)
  uint64_t cache_bytes = 4ull << 30;    // the cache's cap, across the processes sharing cache_dir
  int prefetch = 16;                    // units fetched ahead of the lanes
  int connections = 8;                  // requests at once
  double retry_for_s = 300;             // how long a failing request is tried again
  double stall_timeout_s = 30;          // a transfer with no byte for this long has timed out
  EnvLookup env = process_env();        // where the environment's settings and keys come from
};

/// Where a source's files live.
class Store {
 public:
  virtual ~Store() = default;
  /// Whether its files cross a network (and so go through the cache).
  virtual bool remote() const = 0;
  /// The files under `prefix` (a directory and its subdirectories; an object key prefix), sorted
  /// by uri. Throws DatasetError naming the prefix when there is nothing there to list.
  virtual std::vector<ObjectInfo> list(const std::string& prefix) = 0;
  /// One file. Throws DatasetError naming it when it is missing or not a file.
  virtual ObjectInfo stat(const std::string& uri) = 0;
  /// The file, for reading at offsets. A read that finds the file changed since `info` (another
  /// size or version) throws DatasetError naming it: a run never mixes two versions of a file.
  virtual std::unique_ptr<RangeFile> open(const ObjectInfo& info) = 0;
  /// Remote stores: fetch these lanes' units into the cache ahead of their reads, in the order they
  /// will be read, replacing any earlier plan (the fetch stage calls it). Local stores: nothing.
  virtual void prefetch(std::vector<LaneUnits> /*lanes*/) {}
  /// Remote stores: a lane is done with this unit (its reader closed it): what was fetched for it
  /// goes from the cache, unless another process reads it. Local stores: nothing.
  virtual void release(const UnitRef& /*unit*/) {}
  /// Remote stores: what fetching has done so far; local stores: zeros.
  virtual FetchStats fetch_stats() const { return {}; }
  /// Remote stores: moves the fetch threads' limits while they run (autotune): requests at once
  /// and units ahead (0: unchanged). Local stores: nothing.
  virtual void set_fetch_limits(int /*connections*/, int /*prefetch*/) {}
  /// One line for the log and `pipeline check`: where the files are and how they are reached
  /// (an endpoint, a region, where the keys came from: never a key).
  virtual std::string describe() const { return remote() ? "a remote store" : "the local file system"; }
};

/// The remote stores a run reads through: the readers add the stores they open, and the fetch
/// stage reports what they have done together. Thread-safe.
class StoreSet {
 public:
  /// `source`: the source as printed (a URL, its query redacted).
  void add(std::shared_ptr<Store> store, std::string source);
  /// Every store's figures, summed (the cache's: the largest, as the stores may share one).
  FetchStats total() const;
  /// The sources added, as printed.
  std::vector<std::string> sources() const;
  /// Every store's fetch limits (Store::set_fetch_limits).
  void set_fetch_limits(int connections, int prefetch);

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::shared_ptr<Store>, std::string>> stores_;
};

/// The local file system.
class LocalStore : public Store {
 public:
  bool remote() const override { return false; }
  std::vector<ObjectInfo> list(const std::string& prefix) override;
  ObjectInfo stat(const std::string& uri) override;
  std::unique_ptr<RangeFile> open(const ObjectInfo& info) override;
};

/// A local file, read with pread.
std::unique_ptr<RangeFile> open_local_file(const std::filesystem::path& path);

/// Whether `source` names a remote store (a URL with a scheme, such as s3:// or https://), rather
/// than a local path.
bool is_remote_source(const std::string& source);

/// The store of `source`: the local file system for a path; S3 for s3://BUCKET/PREFIX; HTTPS for
/// https:// (and hf://, through the Hub or HF_ENDPOINT); http:// only with `allow_http`. Touches no
/// network and makes no cache directory (that waits for the first read): `pipeline check` calls
/// it. Throws DatasetError naming the source (redacted) for a URL it does not take, or settings
/// that do not resolve (credentials.h).
std::unique_ptr<Store> open_store(const std::string& source, const StoreOptions& options = {});

}  // namespace pipeline::datasets::io
