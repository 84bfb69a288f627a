// Where a source's bytes come from: a store (the local file system; S3 and HTTPS come with remote
// sources) lists and opens files, and a RangeFile reads one file's bytes at offsets. Everything
// that decodes data (shards, llm.c shards, Parquet) reads through these, so a remote source reads
// like a local one: its store's files read through the cache.
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
#include <memory>
#include <string>
#include <vector>

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

/// The store of `source`: the local file system for a path. Throws DatasetError naming the
/// source for a URL whose scheme this build does not read.
std::unique_ptr<Store> open_store(const std::string& source);

}  // namespace pipeline::datasets::io
