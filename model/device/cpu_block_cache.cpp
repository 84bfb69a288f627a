// See cpu_block_cache.h.
#include "model/device/cpu_block_cache.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pipeline::model {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;    // blocks this large are huge-page aligned and advised
constexpr size_t kSmallGrain = size_t{256} << 10;  // smaller cached blocks round up to this

size_t round_up(size_t n, size_t grain) { return (n + grain - 1) / grain * grain; }

// The size a request is served with: requests that round alike share blocks.
size_t block_size(size_t n) { return n >= kHugePage ? round_up(n, kHugePage) : round_up(n, kSmallGrain); }

// A fresh block from the kernel, on a 2 MiB boundary when it is that large, so that the kernel
// can back it with transparent huge pages. Null when the kernel refuses.
void* map_block(size_t size) {
  const size_t align = size >= kHugePage ? kHugePage : 0;
  void* raw = ::mmap(nullptr, size + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  if (!align) return raw;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + align - 1) / align * align;
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t end = start + size + align;
  if (end > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, size, MADV_HUGEPAGE);  // a hint: where the kernel has THP off, it does nothing
  return p;
}

class CpuBlockCache final : public c10::Allocator {
 public:
  CpuBlockCache(const CpuBlockCacheOptions& options, c10::Allocator* fallback)
      : options_(options), fallback_(fallback) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < options_.min_bytes) return fallback_->allocate(n);
    void* p = take(block_size(n));
    return {p, p, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  // raw_allocate() hands out the data pointer and raw_deallocate() returns it here: a cached block,
  // or one of the fallback's (a small request).
  c10::DeleterFnPtr raw_deleter() const override { return &give_back; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  CpuBlockCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  // Set once, before the cache is registered with c10, and never cleared: the deleter of a
  // DataPtr is a plain function, and tensors may be freed until the process exits.
  static CpuBlockCache* instance;

 private:
  struct Kept {
    void* block;
    size_t size;
  };

  void* take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.requests;
      if (auto it = by_size_.find(size); it != by_size_.end()) {
        void* p = it->second->block;
        kept_.erase(it->second);
        by_size_.erase(it);
        stats_.kept_bytes -= size;
        ++stats_.reused;
        hand_out_locked(p, size);
        return p;
      }
    }
    void* p = map_block(size);
    if (!p) {  // give every kept block back and try once more
      release_all_kept();
      p = map_block(size);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "CPU out of memory: cannot map ", size, " bytes: ",
                     std::strerror(errno));
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.mapped;
    hand_out_locked(p, size);
    return p;
  }

  void hand_out_locked(void* p, size_t size) {
    in_use_.emplace(p, size);
    stats_.in_use_bytes += size;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }

  static void give_back(void* p) { instance->keep(p); }

  void keep(void* p) {
    std::vector<Kept> unmap;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = in_use_.find(p);
      if (it == in_use_.end()) {
        // Not one of ours: a small raw allocation, which the fallback made.
        fallback_->raw_deleter()(p);
        return;
      }
      const size_t size = it->second;
      in_use_.erase(it);
      stats_.in_use_bytes -= size;
      kept_.push_back({p, size});
      by_size_.emplace(size, std::prev(kept_.end()));
      stats_.kept_bytes += size;
      // The bound (the header says why twice the peak): never more kept than that (at least
      // min_kept_bytes).
      const size_t bound = std::max(kCpuBlocksKeptPerPeak * stats_.peak_in_use_bytes, options_.min_kept_bytes);
      while (stats_.kept_bytes > bound && !kept_.empty()) unmap.push_back(forget_oldest_locked());
    }
    for (const Kept& k : unmap) ::munmap(k.block, k.size);
  }

  Kept forget_oldest_locked() {
    const Kept k = kept_.front();
    auto range = by_size_.equal_range(k.size);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second == kept_.begin()) {
        by_size_.erase(it);
        break;
      }
    kept_.pop_front();
    stats_.kept_bytes -= k.size;
    ++stats_.unmapped;
    return k;
  }

  void release_all_kept() {
    std::vector<Kept> unmap;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!kept_.empty()) unmap.push_back(forget_oldest_locked());
    }
    for (const Kept& k : unmap) ::munmap(k.block, k.size);
  }

  const CpuBlockCacheOptions options_;
  c10::Allocator* const fallback_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> in_use_;                     // block -> its size
  std::list<Kept> kept_;                                         // free blocks, freed longest ago first
  std::multimap<size_t, std::list<Kept>::iterator> by_size_;    // free blocks by size
  CpuBlockCacheStats stats_;
};

CpuBlockCache* CpuBlockCache::instance = nullptr;
std::once_flag installed;

}  // namespace

bool install_cpu_block_cache(const CpuBlockCacheOptions& options) {
  if (const char* env = std::getenv("PIPELINE_CPU_ALLOC"); env && std::string(env) == "glibc") return false;
  std::call_once(installed, [&] {
    // Never destroyed (see the header): the process's CPU tensors live in it until exit.
    CpuBlockCache::instance = new CpuBlockCache(options, c10::GetCPUAllocator());
    c10::SetCPUAllocator(CpuBlockCache::instance, /*priority=*/1);
  });
  return true;
}

CpuBlockCacheStats cpu_block_cache_stats() {
  return CpuBlockCache::instance ? CpuBlockCache::instance->stats() : CpuBlockCacheStats{};
}

}  // namespace pipeline::model
