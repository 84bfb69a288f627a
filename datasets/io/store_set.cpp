// The remote stores of a run, for the fetch stage's figures (store.h, StoreSet).
#include <algorithm>

#include "datasets/io/store.h"

namespace pipeline::datasets::io {

void StoreSet::add(std::shared_ptr<Store> store, std::string source) {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [s, name] : stores_)
    if (s == store) return;
  stores_.emplace_back(std::move(store), std::move(source));
}

FetchStats StoreSet::total() const {
  std::vector<std::shared_ptr<Store>> stores;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [s, name] : stores_) stores.push_back(s);
  }
  FetchStats t;
  for (const auto& s : stores) {
    const FetchStats f = s->fetch_stats();
    t.bytes += f.bytes;
    t.requests += f.requests;
    t.busy_s += f.busy_s;
    t.in_flight += f.in_flight;
    t.retries += f.retries;
    t.units += f.units;
    t.hit_bytes += f.hit_bytes;
    t.miss_bytes += f.miss_bytes;
    t.wait_s += f.wait_s;
    // Stores of one run share [data] cache_dir: its total is one figure, not a sum.
    t.cache_bytes = std::max(t.cache_bytes, f.cache_bytes);
    t.cache_high_water = std::max(t.cache_high_water, f.cache_high_water);
    t.cache_cap = std::max(t.cache_cap, f.cache_cap);
    t.connections = std::max(t.connections, f.connections);
    t.prefetch = std::max(t.prefetch, f.prefetch);
  }
  return t;
}

void StoreSet::set_fetch_limits(int connections, int prefetch) {
  std::vector<std::shared_ptr<Store>> stores;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [s, name] : stores_) stores.push_back(s);
  }
  for (const auto& s : stores) s->set_fetch_limits(connections, prefetch);
}

std::vector<std::string> StoreSet::sources() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> out;
  for (const auto& [s, name] : stores_) out.push_back(name);
  return out;
}

}  // namespace pipeline::datasets::io
