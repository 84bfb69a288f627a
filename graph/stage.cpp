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
  // gate, which must not run under a lock that other threads (a CUDA host callback, the
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
  std::map<std::string, StageImpl> pending;         // implementations registered before their declaration
  std::map<std::string, std::type_index> port_types;  // port name -> the C++ type it carries
};

Registry& raw_registry() {
  static Registry r;
  return r;
}

// A port name stands for one C++ type across all stages: what lets ports connect by name.
void check_port(const Registry& r, const std::string& stage, const PortType& p) {
  if (p.none() || p.any() || p.type == std::type_index(typeid(void))) return;
  auto it = r.port_types.find(p.name);
  if (it != r.port_types.end() && it->second != p.type)
    throw std::logic_error("stage type '" + stage + "': port '" + p.name + "' carries " + type_name_of(p.type) +
                           ", but other stages' port '" + p.name + "' carries " + type_name_of(it->second));
}

void bind_port(Registry& r, const PortType& p) {
  if (p.none() || p.any() || p.type == std::type_index(typeid(void))) return;
  r.port_types.emplace(p.name, p.type);
}

// The declared port with the implementation's C++ type: none and any carry no type of their own.
PortType implemented_port(const std::string& stage, const char* side, PortType p, std::type_index type) {
  const bool typed = !p.none() && !p.any();
  if (typed && type == std::type_index(typeid(void)))
    throw std::logic_error("stage type '" + stage + "': the implementation gives no C++ type for the " + side +
                           " port '" + p.name + "'");
  if (!typed && type != std::type_index(typeid(void)))
    throw std::logic_error("stage type '" + stage + "': the declaration has no typed " + side +
                           " port, but the implementation gives " + type_name_of(type));
  if (typed && p.type != std::type_index(typeid(void)) && p.type != type)
    throw std::logic_error("stage type '" + stage + "': the " + side + " port '" + p.name + "' is declared as " +
                           type_name_of(p.type) + " but implemented as " + type_name_of(type));
  if (typed) p.type = type;
  return p;
}

// Checks everything before changing anything: a refused implementation leaves the type as it was.
void implement_locked(Registry& r, StageType& t, StageImpl impl) {
  if (t.factory) throw std::logic_error("register_stage_impl: stage type '" + t.name + "' is implemented twice");
  if (!impl.factory) throw std::logic_error("register_stage_impl: stage type '" + t.name + "' has no factory");
  PortType in = implemented_port(t.name, "input", t.input, impl.input);
  PortType out = implemented_port(t.name, "output", t.output, impl.output);
  check_port(r, t.name, in);
  check_port(r, t.name, out);
  if (in.name == out.name && in.type != out.type)
    throw std::logic_error("stage type '" + t.name + "': its input and output ports are both '" + in.name +
                           "' but carry different C++ types");
  bind_port(r, in);
  bind_port(r, out);
  t.input = std::move(in);
  t.output = std::move(out);
  t.accepts = std::move(impl.accepts);
  t.factory = std::move(impl.factory);
}

void add(StageType t) {
  if (t.name.empty()) throw std::logic_error("register_stage_type: a stage type needs a name");
  if (t.own_thread && t.max_workers == 0) t.max_workers = 1;
  auto& r = raw_registry();
  std::lock_guard lock(r.mu);
  if (r.types.count(t.name)) throw std::logic_error("register_stage_type: stage type '" + t.name + "' registered twice");
  check_port(r, t.name, t.input);
  check_port(r, t.name, t.output);
  if (!t.input.none() && t.input.name == t.output.name && t.input.type != t.output.type)
    throw std::logic_error("stage type '" + t.name + "': its input and output ports are both '" + t.input.name +
                           "' but carry different C++ types");
  bind_port(r, t.input);
  bind_port(r, t.output);
  auto owned = std::make_unique<StageType>(std::move(t));
  if (auto p = r.pending.find(owned->name); p != r.pending.end()) {
    implement_locked(r, *owned, std::move(p->second));
    r.pending.erase(p);
  }
  std::string name = owned->name;
  r.types.emplace(std::move(name), std::move(owned));
}

Registry& registry() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_stages(); });
  return raw_registry();
}

// An implementation whose declaration never came is a program error, reported on first lookup.
void check_pending_locked(const Registry& r) {
  if (r.pending.empty()) return;
  throw std::logic_error("stage type '" + r.pending.begin()->first +
                         "' has an implementation (PIPELINE_STAGE_IMPL) but no declaration (PIPELINE_STAGE_DECLARE)");
}

}  // namespace

void register_builtin_type(StageType t) { add(std::move(t)); }

void register_stage_type(StageType t) {
  registry();  // built-ins first, so a clash with a built-in name is reported
  add(std::move(t));
}

void register_stage_impl(StageImpl impl) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  if (impl.name.empty()) throw std::logic_error("register_stage_impl: an implementation needs the type's name");
  auto it = r.types.find(impl.name);
  if (it != r.types.end()) {
    implement_locked(r, *it->second, std::move(impl));
    return;
  }
  std::string name = impl.name;
  if (!r.pending.emplace(name, std::move(impl)).second)
    throw std::logic_error("register_stage_impl: stage type '" + name + "' is implemented twice");
}

const StageType* find_stage_type(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  check_pending_locked(r);
  auto it = r.types.find(name);
  return it == r.types.end() ? nullptr : it->second.get();
}

std::vector<const StageType*> stage_types() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  check_pending_locked(r);
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
