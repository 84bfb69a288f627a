// The local file system as a store (store.h): files listed by walking a directory, read with
// pread, and checked at open against what the listing saw.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "datasets/dataset_error.h"
#include "datasets/io/remote_module.h"
#include "datasets/io/store.h"

namespace pipeline::datasets::io {
namespace fs = std::filesystem;
namespace {

std::string version_of(const struct stat& st) {
  const int64_t ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return std::to_string(ns) + ":" + std::to_string(st.st_size);
}

DatasetError changed(const std::string& uri, uint64_t listed_size, uint64_t size_now) {
  return DatasetError(uri + ": the file changed after the run listed it (" + std::to_string(listed_size) + " bytes then, " +
                      std::to_string(size_now) + " now): a run never mixes two versions of a file");
}

class LocalFile : public RangeFile {
 public:
  LocalFile(int fd, fs::path path, uint64_t size) : fd_(fd), path_(std::move(path)), name_(path_.string()), size_(size) {}
  /// Every read first checks that the file is still the version a listing recorded (its
  /// modification time and size): a reader that keeps the file open across units (unit_reader)
  /// never reads a file rewritten in place. One replaced by a rename is still the open one.
  void expect_version(std::string listed) { listed_ = std::move(listed); }
  ~LocalFile() override { ::close(fd_); }
  LocalFile(const LocalFile&) = delete;
  LocalFile& operator=(const LocalFile&) = delete;

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }
  fs::path local_path() const override { return path_; }

  size_t read_at(uint64_t offset, void* out, size_t n) override {
    if (!listed_.empty()) check_listed();
    size_t done = 0;
    while (done < n && offset + done < size_) {
      const ssize_t k = ::pread(fd_, static_cast<char*>(out) + done, n - done, static_cast<off_t>(offset + done));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0)
        throw DatasetError(name_ + ": byte " + std::to_string(offset + done) + ": cannot read: " + std::strerror(errno));
      if (k == 0)
        throw DatasetError(name_ + ": byte " + std::to_string(offset + done) + ": the file ends before its " +
                           std::to_string(size_) + " bytes (it was cut short while the run read it)");
      done += static_cast<size_t>(k);
    }
    return done;
  }

 private:
  int fd_;
  fs::path path_;
  std::string name_;
  uint64_t size_;
  std::string listed_;

  void check_listed() const {
    struct stat st{};
    if (::fstat(fd_, &st) != 0 || version_of(st) != listed_)
      throw changed(name_, size_, static_cast<uint64_t>(st.st_size));
  }
};

}  // namespace

std::unique_ptr<RangeFile> open_local_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DatasetError(path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    throw DatasetError(path.string() + ": not a regular file" + (err ? std::string(": ") + std::strerror(err) : ""));
  }
  return std::make_unique<LocalFile>(fd, path, static_cast<uint64_t>(st.st_size));
}

std::vector<ObjectInfo> LocalStore::list(const std::string& prefix) {
  std::error_code ec;
  const fs::path root(prefix);
  const auto status = fs::status(root, ec);
  if (ec || !fs::exists(status)) throw DatasetError(prefix + ": no such file or directory");
  std::vector<ObjectInfo> out;
  if (fs::is_regular_file(status)) {
    out.push_back(stat(prefix));
    return out;
  }
  // Names starting with '.' (hidden files, a writer's temporary files) are not the source's.
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec), end;
  if (ec) throw DatasetError(prefix + ": cannot list: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw DatasetError(prefix + ": cannot list: " + ec.message());
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) out.push_back(stat(it->path().string()));
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.uri < b.uri; });
  return out;
}

ObjectInfo LocalStore::stat(const std::string& uri) {
  struct stat st{};
  if (::stat(uri.c_str(), &st) != 0) throw DatasetError(uri + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw DatasetError(uri + ": not a regular file");
  return {uri, static_cast<uint64_t>(st.st_size), version_of(st)};
}

std::unique_ptr<RangeFile> LocalStore::open(const ObjectInfo& info) {
  auto file = open_local_file(info.uri);
  struct stat st{};
  if (::stat(info.uri.c_str(), &st) != 0 || version_of(st) != info.version || file->size() != info.size)
    throw changed(info.uri, info.size, file->size());
  static_cast<LocalFile&>(*file).expect_version(info.version);
  return file;
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

bool is_remote_source(const std::string& source) {
  const size_t colon = source.find("://");
  if (colon == std::string::npos || colon == 0) return false;
  return std::all_of(source.begin(), source.begin() + static_cast<std::ptrdiff_t>(colon), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
  });
}

std::unique_ptr<Store> open_store(const std::string& source, const StoreOptions& options) {
  if (!is_remote_source(source)) return std::make_unique<LocalStore>();
  return remote_module(source).open_store(source, options);
}

}  // namespace pipeline::datasets::io
