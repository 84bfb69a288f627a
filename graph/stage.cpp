// The stage-type registry and the common stage keys. Built-in types (graph/builtin_stages.cpp)
// are registered on first use of the registry, because graph/ is a static library and a
// registration object alone would not pull its translation unit into the executable.
#include "graph/stage.h"

#include <cxxabi.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>

namespace pipeline::graph {

void register_builtin_stages();  // builtin_stages.cpp

std::string type_name_of(const std::type_info& t) {
  int status = 0;
  char* s = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = (status == 0 && s) ? s : t.name();
  std::free(s);
  return out;
}

std::string type_name_of(std::type_index t) {
  int status = 0;
  char* s = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = (status == 0 && s) ? s : t.name();
  std::free(s);
  return out;
}

ResourcePool::ResourcePool(int size) : size_(size), out_(static_cast<size_t>(std::max(size, 0)), false) {
  if (size < 1) throw std::invalid_argument("ResourcePool: size must be >= 1, got " + std::to_string(size));
  for (int i = size - 1; i >= 0; --i) free_.push_back(i);
}

int ResourcePool::take_locked() {
  int i = free_.back();
  free_.pop_back();
  out_[static_cast<size_t>(i)] = true;
  return i;
}

int ResourcePool::acquire() {
  std::lock_guard lock(mu_);
  if (gate_.reserved && !gate_.reserved())
    throw std::logic_error("ResourcePool::acquire: no reservation left: called twice for one input (use try_acquire "
                           "for more) or outside the owning stage's process()");
  if (free_.empty())
    throw std::logic_error("ResourcePool::acquire: all " + std::to_string(size_) + " resources are in use");
  return take_locked();
}

std::optional<int> ResourcePool::try_acquire() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return std::nullopt;
  if (gate_.extra && !gate_.extra()) return std::nullopt;
  return take_locked();
}

void ResourcePool::release(int index) {
  {
    std::lock_guard lock(mu_);
    if (index < 0 || index >= size_ || !out_[static_cast<size_t>(index)])
      throw std::logic_error("ResourcePool::release(" + std::to_string(index) + "): not handed out (size " +
                             std::to_string(size_) + ")");
    out_[static_cast<size_t>(index)] = false;
    free_.push_back(index);
    if (!gate_.released) return;
    ++releasing_;
  }
  // Without the lock: telling the engine may forward the owning stage's next input through its
  // limiters, which must not run under a lock that other threads (a CUDA host callback, the
  // stage's own acquire) wait for. set_gate() waits until this call is over, so the engine's
  // teardown never races with it.
  gate_.released();
  std::lock_guard lock(mu_);
  if (--releasing_ == 0) idle_.notify_all();
}

int ResourcePool::free_count() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(free_.size());
}

void ResourcePool::set_gate(Gate gate) {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return releasing_ == 0; });
  gate_ = std::move(gate);
}

std::string Item::type_name_of_index(std::type_index t) { return type_name_of(t); }

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<StageType>> types;
};

Registry& raw_registry() {
  static Registry r;
  return r;
}

void add(StageType t) {
  if (t.name.empty()) throw std::logic_error("register_stage_type: a stage type needs a name");
  if (!t.factory) throw std::logic_error("register_stage_type: stage type '" + t.name + "' has no factory");
  if (t.own_thread && t.max_workers == 0) t.max_workers = 1;
  auto& r = raw_registry();
  std::lock_guard lock(r.mu);
  if (r.types.count(t.name)) throw std::logic_error("register_stage_type: stage type '" + t.name + "' registered twice");
  std::string name = t.name;
  r.types.emplace(std::move(name), std::make_unique<StageType>(std::move(t)));
}

Registry& registry() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_stages(); });
  return raw_registry();
}

}  // namespace

void register_builtin_type(StageType t) { add(std::move(t)); }

void register_stage_type(StageType t) {
  registry();  // built-ins first, so a clash with a built-in name is reported
  add(std::move(t));
}

const StageType* find_stage_type(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.types.find(name);
  return it == r.types.end() ? nullptr : it->second.get();
}

std::vector<const StageType*> stage_types() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<const StageType*> out;
  for (const auto& [name, t] : r.types) out.push_back(t.get());
  return out;
}

const config::Schema& common_stage_schema() {
  static const config::Schema schema = [] {
    config::Schema s("stage");
    s.string("type", std::nullopt, "registered stage type (see `pipeline stages`)")
        .string_list("input", std::vector<std::string>{}, "stage(s) feeding this one; absent for a source")
        .integer_or_auto("workers", int64_t{1}, "concurrent workers, or \"auto\": as many as the machine has cores (own-thread stages: 1)", 1, 1024)
        .integer_or_auto("capacity", int64_t{8}, "items each input edge of this stage holds at most, or \"auto\": tuned while the run goes", 1, 100000);
    return s;
  }();
  return schema;
}

}  // namespace pipeline::graph
