// A remote store's fetch threads and read path (fetcher.h).
#include "datasets/io/fetcher.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/thread_name.h"
#include "datasets/dataset_error.h"
#include "datasets/io/url.h"

namespace pipeline::datasets::io {
namespace {

constexpr size_t kTailBytes = 256u << 10;  // reads this small that end at a file's end are kept
constexpr size_t kTails = 64;

}  // namespace

struct Fetcher::Slot {
  UnitRef unit;
  int lane = 0;
  enum class State { fetching, ready, failed, dropped } state = State::fetching;
  std::shared_ptr<UnitCache::Entry> entry;
  std::exception_ptr error;
  std::atomic<bool> give_up{false};  // a reader stopped waiting for room: it reads on demand
  bool reached = false;              // a read has reached it (it is no longer ahead)
  std::vector<std::pair<uint64_t, uint64_t>> covered;  // byte intervals read, merged
  uint64_t covered_bytes = 0;
};

Fetcher::Fetcher(const StoreOptions& options, Download download, FetchCounters& counters)
    : options_(options), download_(std::move(download)), counters_(counters) {
  cache_ = std::make_unique<UnitCache>(options_.cache_dir.empty() ? default_cache_dir() : options_.cache_dir,
                                       options_.cache_bytes);
  set_limits(options_.connections, options_.prefetch);
}

void Fetcher::set_limits(int connections, int prefetch) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (prefetch > 0) prefetch_ = prefetch;
    if (connections > 0) {
      connections_ = std::min(connections, 1024);
      // Threads beyond the count wait; more are started when it grows past them.
      while (static_cast<int>(threads_.size()) < connections_) {
        const int index = static_cast<int>(threads_.size());
        threads_.emplace_back([this, index] { thread_main(index); });
      }
    }
  }
  cv_.notify_all();
}

Fetcher::~Fetcher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    for (auto& lane : lanes_)
      for (auto& s : lane.slots) s->give_up = true;  // a thread waiting for room stops waiting
  }
  cv_.notify_all();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> l(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  std::lock_guard<std::mutex> l(mu_);
  by_file_.clear();
  lanes_.clear();
}

void Fetcher::plan(std::vector<LaneUnits> lanes) {
  std::vector<std::shared_ptr<UnitCache::Entry>> drop;
  {
    std::lock_guard<std::mutex> l(mu_);
    // The old plan's units go: the new plan fetches again what it needs (a resume: at most the
    // unit each lane stopped in). One in flight finishes, and its thread lets it go.
    std::vector<SlotPtr> old;
    for (auto& lane : lanes_) old.insert(old.end(), lane.slots.begin(), lane.slots.end());
    for (auto& s : old) drop.push_back(drop_locked(s));
    lanes_.clear();
    passed_.clear();
    read_whole_.clear();
    for (auto& next : lanes) {
      Lane lane;
      lane.next = std::move(next);
      lanes_.push_back(std::move(lane));
    }
  }
  cv_.notify_all();
}

Fetcher::SlotPtr Fetcher::take_next_locked() {
  if (ahead_ >= std::max(1, prefetch_.load(std::memory_order_relaxed))) return nullptr;
  Lane* best = nullptr;
  for (auto& lane : lanes_)
    if (!lane.ended && (!best || lane.planned_bytes < best->planned_bytes)) best = &lane;
  if (!best) return nullptr;
  std::optional<UnitRef> unit = best->next();
  if (!unit || unit->length == 0) {
    best->ended = !unit.has_value();
    return unit ? take_next_locked() : nullptr;
  }
  if (auto p = passed_.find(unit->file.uri); p != passed_.end()) {
    auto& ranges = p->second;
    const auto it = std::find(ranges.begin(), ranges.end(), std::make_pair(unit->offset, unit->length));
    if (it != ranges.end()) {
      ranges.erase(it);
      if (ranges.empty()) passed_.erase(p);
      best->planned_bytes += unit->length;
      return take_next_locked();  // read already: on to the lane's next
    }
  }
  auto slot = std::make_shared<Slot>();
  slot->unit = std::move(*unit);
  slot->lane = static_cast<int>(best - lanes_.data());
  best->planned_bytes += slot->unit.length;
  best->slots.push_back(slot);
  by_file_[slot->unit.file.uri][slot->unit.offset] = slot;
  ++ahead_;
  return slot;
}

void Fetcher::thread_main(int index) {
  name_this_thread("fetch");
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    SlotPtr slot = index < connections_.load(std::memory_order_relaxed) ? take_next_locked() : nullptr;
    if (!slot) {
      cv_.wait(l);
      continue;
    }
    l.unlock();
    fetch(slot);
    l.lock();
  }
}

void Fetcher::fetch(const SlotPtr& slot) {
  const UnitRef& u = slot->unit;
  std::shared_ptr<UnitCache::Entry> entry;
  std::exception_ptr error;
  try {
    bool downloaded = false;
    // The wait for room is cut short when the run stops or a reader gave up waiting for it.
    entry = cache_->get(
        {u.file.uri, u.file.version, u.offset, u.length},
        [&](int fd) {
          uint64_t at = 0;
          download_(u.file, u.offset, u.length, [&](const char* p, size_t n) {
            while (n > 0) {
              const ssize_t k = ::pwrite(fd, p, n, static_cast<off_t>(at));
              if (k < 0 && errno == EINTR) continue;
              if (k <= 0) throw DatasetError(cache_->dir().string() + ": cannot write a unit into the cache: " + std::strerror(errno));
              p += k;
              n -= static_cast<size_t>(k);
              at += static_cast<uint64_t>(k);
            }
          });
        },
        &slot->give_up, &downloaded);
    if (downloaded) counters_.units.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    error = std::current_exception();
  }
  std::shared_ptr<UnitCache::Entry> drop;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (slot->state == Slot::State::dropped || stop_) {
      drop = std::move(entry);  // the plan moved on while it was fetched
    } else if (error) {
      slot->state = Slot::State::failed;
      slot->error = error;
    } else if (!entry) {
      slot->state = Slot::State::failed;  // gave up waiting for room: the reader reads on demand
    } else {
      slot->state = Slot::State::ready;
      slot->entry = std::move(entry);
    }
  }
  cv_.notify_all();
}

std::shared_ptr<UnitCache::Entry> Fetcher::drop_locked(const SlotPtr& slot) {
  if (!slot->reached && slot->state != Slot::State::dropped) --ahead_;
  slot->reached = true;
  slot->state = Slot::State::dropped;
  auto file = by_file_.find(slot->unit.file.uri);
  if (file != by_file_.end()) {
    auto it = file->second.find(slot->unit.offset);
    if (it != file->second.end() && it->second == slot) file->second.erase(it);
    if (file->second.empty()) by_file_.erase(file);
  }
  if (slot->lane < static_cast<int>(lanes_.size())) {
    auto& slots = lanes_[static_cast<size_t>(slot->lane)].slots;
    slots.erase(std::remove(slots.begin(), slots.end(), slot), slots.end());
  }
  return std::move(slot->entry);
}

bool Fetcher::read_planned(const ObjectInfo& file, uint64_t offset, void* out, size_t n) {
  std::vector<std::shared_ptr<UnitCache::Entry>> drop;
  std::shared_ptr<UnitCache::Entry> entry;
  SlotPtr slot;
  {
    std::unique_lock<std::mutex> l(mu_);
    auto f = by_file_.find(file.uri);
    if (f == by_file_.end()) return false;
    auto it = f->second.upper_bound(offset);
    if (it == f->second.begin()) return false;
    slot = std::prev(it)->second;
    const UnitRef& u = slot->unit;
    if (u.file.version != file.version || offset + n > u.offset + u.length) return false;
    if (slot->state == Slot::State::fetching) {
      const auto start = std::chrono::steady_clock::now();
      slot->give_up = true;  // in flight: wait for it; waiting for room: read on demand instead
      cv_.wait(l, [&] { return slot->state != Slot::State::fetching || stop_; });
      counters_.wait_ns.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                            std::chrono::steady_clock::now() - start)
                                                            .count()),
                                  std::memory_order_relaxed);
    }
    if (slot->state == Slot::State::failed && slot->error) {
      auto error = slot->error;
      drop.push_back(drop_locked(slot));
      l.unlock();
      std::rethrow_exception(error);
    }
    if (slot->state != Slot::State::ready) {
      if (slot->state != Slot::State::dropped) drop.push_back(drop_locked(slot));
      return false;
    }
    // The first read in this unit: the lane is done with its units before it.
    if (!slot->reached) {
      slot->reached = true;
      --ahead_;
      auto& lane_slots = lanes_[static_cast<size_t>(slot->lane)].slots;
      while (!lane_slots.empty() && lane_slots.front() != slot) {
        SlotPtr older = lane_slots.front();
        if (older->state == Slot::State::fetching) break;
        drop.push_back(drop_locked(older));
      }
    }
    entry = slot->entry;  // held while this read goes on, whatever happens to the slot
  }
  cv_.notify_all();
  drop.clear();
  size_t done = 0;
  const uint64_t at = offset - slot->unit.offset;
  while (done < n) {
    const ssize_t k = ::pread(entry->fd(), static_cast<char*>(out) + done, n - done, static_cast<off_t>(at + done));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw DatasetError(file.uri + ": " + byte_range_text(offset, n) + ": cannot read the cached unit in " +
                         cache_->dir().string() + ": " + (k < 0 ? std::strerror(errno) : "it ends early"));
    done += static_cast<size_t>(k);
  }
  counters_.hit_bytes.fetch_add(n, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> l(mu_);
    // Merge [at, at + n) into what has been read; a unit read whole is done.
    auto& c = slot->covered;
    c.emplace_back(at, at + n);
    std::sort(c.begin(), c.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& iv : c) {
      if (!merged.empty() && iv.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, iv.second);
      else
        merged.push_back(iv);
    }
    c = std::move(merged);
    if (c.size() == 1 && c[0].first == 0 && c[0].second >= slot->unit.length && slot->state == Slot::State::ready) {
      drop.push_back(drop_locked(slot));
      read_whole_[slot->unit.file.uri].emplace_back(slot->unit.offset, slot->unit.length);
    }
  }
  entry.reset();
  drop.clear();
  cv_.notify_all();
  return true;
}

void Fetcher::read_direct(const ObjectInfo& file, uint64_t offset, void* out, size_t n) {
  const bool tail = n <= kTailBytes && offset > 0 && offset + n == file.size;
  const std::string key = file.uri + '\0' + file.version + '\0' + std::to_string(offset) + '\0' + std::to_string(n);
  if (tail) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = tails_.begin(); it != tails_.end(); ++it)
      if (it->key == key) {
        std::memcpy(out, it->bytes.data(), n);
        tails_.splice(tails_.begin(), tails_, it);
        counters_.hit_bytes.fetch_add(n, std::memory_order_relaxed);
        return;
      }
  }
  const auto start = std::chrono::steady_clock::now();
  size_t done = 0;
  download_(file, offset, n, [&](const char* p, size_t k) {
    if (done + k > n) throw DatasetError(file.uri + ": " + byte_range_text(offset, n) + ": more bytes than asked for");
    std::memcpy(static_cast<char*>(out) + done, p, k);
    done += k;
  });
  counters_.miss_bytes.fetch_add(n, std::memory_order_relaxed);
  counters_.wait_ns.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                        std::chrono::steady_clock::now() - start)
                                                        .count()),
                              std::memory_order_relaxed);
  if (tail) {
    std::lock_guard<std::mutex> l(mu_);
    tails_.push_front({key, std::string(static_cast<const char*>(out), n)});
    if (tails_.size() > kTails) tails_.pop_back();
  }
}

void Fetcher::release(const UnitRef& unit) {
  std::shared_ptr<UnitCache::Entry> drop;
  {
    std::lock_guard<std::mutex> l(mu_);
    const auto range = std::make_pair(unit.offset, unit.length);
    if (auto r = read_whole_.find(unit.file.uri); r != read_whole_.end()) {
      // Its slot went when its last byte was read: nothing left to do.
      auto it = std::find(r->second.begin(), r->second.end(), range);
      if (it != r->second.end()) {
        r->second.erase(it);
        if (r->second.empty()) read_whole_.erase(r);
        return;
      }
    }
    SlotPtr slot;
    if (auto f = by_file_.find(unit.file.uri); f != by_file_.end())
      if (auto it = f->second.find(unit.offset); it != f->second.end() && it->second->unit.length == unit.length)
        slot = it->second;
    if (!slot) {
      // Not planned yet: its reader went ahead of the threads. The plan passes over it.
      if (!lanes_.empty()) passed_[unit.file.uri].push_back(range);
      return;
    }
    drop = drop_locked(slot);  // in flight: the thread that fetches it lets it go when it lands
  }
  cv_.notify_all();
}

void Fetcher::read(const ObjectInfo& file, uint64_t offset, void* out, size_t n) {
  if (n == 0) return;
  if (!read_planned(file, offset, out, n)) read_direct(file, offset, out, n);
}

}  // namespace pipeline::datasets::io
