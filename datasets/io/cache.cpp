// The unit cache shared by the processes of one machine (cache.h). Locks are flock(2): the kernel
// drops them when a process ends, however it ends, so a killed run never leaves a unit locked.
#include "datasets/io/cache.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "datasets/dataset_error.h"

namespace pipeline::datasets::io {
namespace fs = std::filesystem;
namespace {

constexpr const char* kEntrySuffix = ".unit";
constexpr const char* kLockSuffix = ".lock";
constexpr const char* kPartMark = ".part.";

std::string errno_text() { return std::strerror(errno); }

// flock, retried when a signal interrupts it.
int lock_fd(int fd, int op) {
  int r;
  do r = ::flock(fd, op);
  while (r != 0 && errno == EINTR);
  return r;
}

std::string hex_sha256(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &n, EVP_sha256(), nullptr) != 1)
    throw DatasetError("cache: SHA-256 failed (OpenSSL)");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

int64_t read_total(int fd) {
  int64_t v = 0;
  if (::pread(fd, &v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) return 0;
  return v;
}

void write_total(int fd, int64_t v, const fs::path& dir) {
  if (::pwrite(fd, &v, sizeof v, 0) != static_cast<ssize_t>(sizeof v))
    throw DatasetError((dir / "usage").string() + ": cannot write the cache's total: " + errno_text());
}

}  // namespace

fs::path default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "pipeline" / "data";
  const char* home = std::getenv("HOME");
  return fs::path(home && *home ? home : "/tmp") / ".cache" / "pipeline" / "data";
}

UnitCache::UnitCache(fs::path dir, uint64_t cap_bytes) : dir_(std::move(dir)), cap_(cap_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw DatasetError(dir_.string() + ": cannot make the cache directory ([data] cache_dir): " + ec.message());
  users_fd_ = ::open((dir_ / "users").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  usage_fd_ = ::open((dir_ / "usage").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (users_fd_ < 0 || usage_fd_ < 0) {
    const std::string why = errno_text();
    if (users_fd_ >= 0) ::close(users_fd_);
    if (usage_fd_ >= 0) ::close(usage_fd_);
    throw DatasetError(dir_.string() + ": cannot use it as the cache directory ([data] cache_dir): " + why);
  }
  recount_when_alone();
  if (lock_fd(users_fd_, LOCK_SH) != 0) throw DatasetError(dir_.string() + ": cannot lock the cache: " + errno_text());
}

UnitCache::~UnitCache() {
  ::close(usage_fd_);
  ::close(users_fd_);  // drops this process's shared hold
}

void UnitCache::recount_when_alone() {
  // Only a process alone in the cache may recount: the others' downloads in progress are in the
  // total and not yet in files.
  if (lock_fd(users_fd_, LOCK_EX | LOCK_NB) != 0) return;
  int64_t total = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_, ec)) {
    const std::string name = f.path().filename().string();
    if (name.find(kPartMark) != std::string::npos || name.ends_with(kLockSuffix)) {
      fs::remove(f.path(), ec);  // a killed process's download, or its lock file
    } else if (name.ends_with(kEntrySuffix)) {
      total += static_cast<int64_t>(f.file_size(ec));
    }
  }
  lock_fd(usage_fd_, LOCK_EX);
  write_total(usage_fd_, total, dir_);
  lock_fd(usage_fd_, LOCK_UN);
  lock_fd(users_fd_, LOCK_UN);
}

fs::path UnitCache::entry_path(const UnitKey& key) const {
  const std::string id = key.uri + '\0' + key.version + '\0' + std::to_string(key.offset) + '\0' + std::to_string(key.length);
  return dir_ / (hex_sha256(id) + kEntrySuffix);
}

uint64_t UnitCache::bytes() const {
  lock_fd(usage_fd_, LOCK_SH);
  const int64_t v = read_total(usage_fd_);
  lock_fd(usage_fd_, LOCK_UN);
  return v < 0 ? 0 : static_cast<uint64_t>(v);
}

bool UnitCache::add_usage(int64_t delta, bool admit) {
  lock_fd(usage_fd_, LOCK_EX);
  int64_t total = read_total(usage_fd_);
  // Admitted while the total stays within the cap, or into an empty cache (a unit larger than
  // the cap still goes, alone): never more than one unit over.
  if (admit && total > 0 && total + delta > static_cast<int64_t>(cap_)) {
    lock_fd(usage_fd_, LOCK_UN);
    return false;
  }
  total = std::max<int64_t>(0, total + delta);
  write_total(usage_fd_, total, dir_);
  lock_fd(usage_fd_, LOCK_UN);
  uint64_t seen = high_water_.load(std::memory_order_relaxed);
  while (static_cast<uint64_t>(total) > seen &&
         !high_water_.compare_exchange_weak(seen, static_cast<uint64_t>(total), std::memory_order_relaxed)) {
  }
  return true;
}

std::shared_ptr<UnitCache::Entry> UnitCache::find(const UnitKey& key) {
  const fs::path path = entry_path(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st{};
  if (lock_fd(fd, LOCK_SH) != 0 || ::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != key.length ||
      st.st_nlink == 0) {
    // Another size: not this unit whole (a file put there by hand, a disk that lost a write). A
    // file deleted between our open and our lock is gone from the cache: fetch it again.
    const bool wrong_size = st.st_nlink > 0 && static_cast<uint64_t>(st.st_size) != key.length;
    ::close(fd);
    if (wrong_size) {
      std::error_code ec;
      if (fs::remove(path, ec)) add_usage(-static_cast<int64_t>(st.st_size), false);
    }
    return nullptr;
  }
  return std::shared_ptr<Entry>(new Entry(path, fd, key.length), [this](Entry* e) { release(e); });
}

std::shared_ptr<UnitCache::Entry> UnitCache::get(const UnitKey& key, const std::function<void(int fd)>& download,
                                                 const std::atomic<bool>* cancel, bool* downloaded) {
  if (downloaded) *downloaded = false;
  if (auto e = find(key)) return e;
  const fs::path path = entry_path(key);
  const fs::path lock_path = fs::path(path.string() + kLockSuffix);
  while (true) {
    // One download per unit on the machine: whoever holds the unit's lock file downloads it.
    const int lk = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lk < 0) throw DatasetError(lock_path.string() + ": cannot make a lock file in the cache: " + errno_text());
    if (lock_fd(lk, LOCK_EX) != 0) {
      ::close(lk);
      throw DatasetError(lock_path.string() + ": cannot lock: " + errno_text());
    }
    // The holder before us removes the lock file when it is done: a lock on a removed file
    // guards nothing, so take the one now at that path.
    struct stat held{}, now{};
    if (::fstat(lk, &held) != 0 || ::stat(lock_path.c_str(), &now) != 0 || held.st_ino != now.st_ino) {
      ::close(lk);
      if (auto e = find(key)) return e;
      continue;
    }
    auto done = [&] {
      std::error_code ec;
      fs::remove(lock_path, ec);
      ::close(lk);
    };
    if (auto e = find(key)) {
      done();
      return e;
    }
    // Room under the cap: entries no one holds go first, then wait for the holders to let go.
    while (!add_usage(static_cast<int64_t>(key.length), true)) {
      if (evict_unheld(key.length)) continue;
      if (cancel && cancel->load(std::memory_order_relaxed)) {
        done();
        return nullptr;
      }
      std::unique_lock<std::mutex> l(room_mu_);
      room_cv_.wait_for(l, std::chrono::milliseconds(20));  // other processes' releases are not signalled
    }
    const fs::path temp = fs::path(path.string() + kPartMark + std::to_string(::getpid()) + "." +
                                   std::to_string(temp_counter_.fetch_add(1)));
    const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      const std::string why = errno_text();
      add_usage(-static_cast<int64_t>(key.length), false);
      done();
      throw DatasetError(temp.string() + ": cannot write into the cache ([data] cache_dir): " + why);
    }
    try {
      download(fd);
      struct stat st{};
      if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != key.length)
        throw DatasetError(key.uri + ": " + std::to_string(st.st_size) + " bytes written into the cache for a unit of " +
                           std::to_string(key.length));
      // Held before it is in place, so that no eviction can take it between the two.
      lock_fd(fd, LOCK_SH);
      if (::rename(temp.c_str(), path.c_str()) != 0)
        throw DatasetError(path.string() + ": cannot move a unit into place in the cache: " + errno_text());
    } catch (...) {
      ::close(fd);
      std::error_code ec;
      fs::remove(temp, ec);
      add_usage(-static_cast<int64_t>(key.length), false);
      done();
      throw;
    }
    done();
    if (downloaded) *downloaded = true;
    return std::shared_ptr<Entry>(new Entry(path, fd, key.length), [this](Entry* e) { release(e); });
  }
}

bool UnitCache::evict_unheld(uint64_t needed) {
  struct Candidate {
    fs::path path;
    fs::file_time_type time;
    uint64_t size;
  };
  std::vector<Candidate> found;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_, ec)) {
    const std::string name = f.path().filename().string();
    if (!name.ends_with(kEntrySuffix)) continue;
    found.push_back({f.path(), f.last_write_time(ec), f.file_size(ec)});
  }
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) { return a.time < b.time; });
  bool any = false;
  uint64_t freed = 0;
  for (const auto& c : found) {
    if (freed >= needed) break;
    const int fd = ::open(c.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st{};
    if (lock_fd(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &st) == 0 && st.st_nlink > 0 && fs::remove(c.path, ec)) {
      add_usage(-static_cast<int64_t>(st.st_size), false);
      freed += static_cast<uint64_t>(st.st_size);
      any = true;
    }
    ::close(fd);
  }
  return any;
}

void UnitCache::release(Entry* e) {
  // Deleted only when no other process holds it: the exclusive lock is granted to the last holder.
  if (!e->keep_ && lock_fd(e->fd_, LOCK_EX | LOCK_NB) == 0) {
    struct stat st{};
    std::error_code ec;
    if (::fstat(e->fd_, &st) == 0 && st.st_nlink > 0 && fs::remove(e->path_, ec))
      add_usage(-static_cast<int64_t>(st.st_size), false);
  }
  ::close(e->fd_);
  delete e;
  room_cv_.notify_all();
}

UnitCache::Entry::~Entry() = default;

}  // namespace pipeline::datasets::io
