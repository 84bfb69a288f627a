// Stage API: what a stage type declares (ports, options, threading) and the base class its
// instances derive from. Stage types register by name (PIPELINE_STAGE) and the engine
// (graph/engine.h) builds a graph of them from TOML or from code.
//
// Example (a stage that doubles integers, 1 item in -> 1 item out):
//   class Doubler : public graph::Stage {
//    public:
//     explicit Doubler(const graph::StageContext& ctx) : factor_(ctx.options.get_int("factor")) {}
//     void process(graph::Item in, graph::Emitter& out) override { out.emit<int64_t>(in.get<int64_t>() * factor_); }
//    private:
//     int64_t factor_;
//   };
//   PIPELINE_STAGE(doubler, {.name = "doubler", .doc = "multiplies by factor",
//                            .input = graph::port<int64_t>("int"), .output = graph::port<int64_t>("int"),
//                            .options = config::Schema().integer("factor", 2, "multiplier", 1),
//                            .factory = graph::make_factory<Doubler>()});
#pragma once

#include <any>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "base/config.h"

namespace pipeline::graph {

/// Readable name of a C++ type (demangled), for messages.
std::string type_name_of(const std::type_info& t);
std::string type_name_of(std::type_index t);

/// A port's type: a name users see in TOML errors and `pipeline stages`, plus the C++ type
/// that flows through it. Ports connect when their names are the same; the registry holds each
/// name to one C++ type.
struct PortType {
  std::string name;                        // "" = no port (sources have no input, sinks no output)
  std::type_index type = typeid(void);     // typeid(void) with name "any": pass-through
  bool none() const { return name.empty(); }
  bool any() const { return name == "any"; }
};

template <class T>
PortType port(std::string name) {
  return PortType{std::move(name), std::type_index(typeid(T))};
}
/// A port named without its C++ type, for a stage type declared apart from its implementation
/// (PIPELINE_STAGE_DECLARE): the implementation supplies the type (PIPELINE_STAGE_IMPL).
inline PortType port(std::string name) { return PortType{std::move(name), std::type_index(typeid(void))}; }
inline PortType no_port() { return PortType{}; }
/// For pass-through stages (delay, spin): the output type is the input type, inferred per graph.
inline PortType any_port() { return PortType{"any", std::type_index(typeid(void))}; }

/// A message on an edge: a type-erased, shared payload plus its sequence number. Copying an
/// Item copies a pointer, never the payload, so fan-out (one producer, several consumers)
/// costs nothing; a consumer that is the only holder can take() the payload by move.
class Item {
 public:
  Item() = default;
  template <class T>
  static Item make(T value) {
    Item it;
    it.ptr_ = std::make_shared<std::decay_t<T>>(std::move(value));
    it.type_ = std::type_index(typeid(std::decay_t<T>));
    return it;
  }
  bool empty() const { return !ptr_; }
  std::type_index type() const { return type_; }
  uint64_t seq() const { return seq_; }
  void set_seq(uint64_t s) { seq_ = s; }

  /// Read access; throws std::logic_error naming both types if T is not the payload's type.
  template <class T>
  const T& get() const {
    check<T>();
    return *static_cast<const T*>(ptr_.get());
  }
  /// Mutable access: only safe when this stage is the payload's sole consumer (no fan-out).
  template <class T>
  T& get_mut() {
    check<T>();
    return *static_cast<T*>(ptr_.get());
  }
  /// Moves the payload out when this Item holds the only reference, else copies it
  /// (fan-out: other consumers still read it). Move-only payloads that are shared throw.
  template <class T>
  T take() {
    check<T>();
    T* p = static_cast<T*>(ptr_.get());
    if (ptr_.use_count() == 1) {
      T out = std::move(*p);
      ptr_.reset();
      return out;
    }
    if constexpr (std::is_copy_constructible_v<T>) {
      return *p;
    } else {
      throw std::logic_error("Item::take<" + type_name_of(typeid(T)) +
                             ">: payload is shared by several consumers (fan-out) and cannot be copied");
    }
  }

 private:
  template <class T>
  void check() const {
    if (!ptr_) throw std::logic_error("Item::get<" + type_name_of(typeid(T)) + ">: the item is empty");
    if (type_ != std::type_index(typeid(T)))
      throw std::logic_error("Item::get<" + type_name_of(typeid(T)) + ">: the payload is a " +
                             type_name_of_index(type_));
  }
  static std::string type_name_of_index(std::type_index t);

  std::shared_ptr<void> ptr_;
  std::type_index type_ = typeid(void);
  uint64_t seq_ = 0;
};

class Invocation;  // engine-side: one call of produce(), process() or finalize()

/// Where a stage's outputs go. emit() never blocks: the engine admitted this input only because
/// every output edge had room for its first output (see the README on bounds), and it holds
/// the stage's further inputs back until the edges drain. Items go to every consumer whose
/// routing filter accepts them, in emission order.
class Emitter {
 public:
  explicit Emitter(Invocation* impl, int worker) : impl_(impl), worker_(worker) {}
  template <class T>
  void emit(T value) {
    emit_item(Item::make(std::move(value)));
  }
  void emit_item(Item item);
  /// Index of the calling worker in [0, workers): per-worker scratch space in stages. No two
  /// calls running at the same time share an index.
  int worker() const { return worker_; }
  /// True once stop() was requested, or once every stage this one's outputs lead to has wound
  /// down (wind_down): sources return false from produce() when they see it (the engine stops
  /// calling produce() then anyway).
  bool stop_requested() const;
  /// This stage has all the input it will use (train after its last step). From now on it drops
  /// what reaches it, and so does every stage upstream of it (through its inputs, transitively)
  /// whose outputs all lead to stages that wound down; the sources among them stop producing.
  /// What is in flight towards it is dropped instead of drained, and the run still ends as
  /// "done". Stages elsewhere in the graph (a branch that does not feed this stage, or a
  /// producer that also feeds one that goes on) are not affected.
  void wind_down();
  /// Timed stages only (StageType::timed): complete this invocation `d` from now, without
  /// holding a thread; its outputs leave then. The stats count the held time as busy.
  void hold_for(std::chrono::nanoseconds d);
  /// This invocation spent `d` asleep waiting for the device (a CUDA event): the stats take it
  /// out of the stage's busy time and show it as its device wait (device_wait_s), a share of its
  /// own; the verdict judges the device by add_device_busy's time, and names the stage doing the
  /// device work rather than one that waits for it. Call it after the wait, inside the
  /// invocation (process() or finalize()) that waited.
  void add_device_wait(std::chrono::nanoseconds d);
  /// Device (GPU) time spent on behalf of stage `stage`, measured with device events by
  /// whichever stage reads them (log reads train's): the stats show it as that stage's
  /// GPU-busy share. `gpu` false: the host clock stood in (a CPU run), which the verdict says.
  /// Unknown stage names are ignored.
  void add_device_busy(const std::string& stage, std::chrono::nanoseconds d, bool gpu = true);

 private:
  Invocation* impl_;
  int worker_;
};

/// Thrown by the engine into a stage that calls it after the run failed or was aborted;
/// stages must not swallow it.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("graph cancelled") {}
};

/// What a factory gets to build a stage instance.
struct StageContext {
  std::string name;                // the stage's name in the graph ("tokenize")
  std::string type;                // its registered type ("tokenize")
  int workers = 1;                 // concurrent process() calls the engine will make
  const config::Section& options;  // common keys + the type's own keys, validated
  /// What the program running the engine hands to its stages (EngineOptions::host; `pipeline
  /// run`: its run context), empty when it hands nothing. The engine never looks inside; the
  /// stages that need it know its type and read it with std::any_cast.
  const std::any& host;
};

/// A fixed set of interchangeable resources (pinned host buffers, say), numbered 0..size-1, that
/// gates the stage owning it (Stage::resource_pool): the engine hands that stage an input only
/// while a resource is free and reserves one for the invocation, so process() never waits for
/// one. Resources are given back with release(), from any thread (a CUDA host callback
/// included), which lets the engine admit the next input.
///
/// Example (a stage that fills pooled buffers):
///   std::shared_ptr<graph::ResourcePool> resource_pool() override { return pool_; }
///   void process(graph::Item in, graph::Emitter& out) override {
///     int slot = pool_->acquire();  // the one reserved for this input
///     ...  // whoever finishes with buffer `slot` calls pool_->release(slot)
///   }
class ResourcePool {
 public:
  explicit ResourcePool(int size);
  ResourcePool(const ResourcePool&) = delete;
  ResourcePool& operator=(const ResourcePool&) = delete;
  int size() const { return size_; }
  /// Takes the resource the engine reserved for the current input (inside the owning stage's
  /// process()). Throws std::logic_error when there is none: called twice for one input (use
  /// try_acquire for more) or outside the stage.
  int acquire();
  /// Takes another resource if one is free now and not reserved for another input; never waits.
  std::optional<int> try_acquire();
  /// Gives a resource back. Never blocks; any thread.
  void release(int index);
  int free_count() const;

  /// Engine side: how the engine counts this pool's resources. Without a gate (a stage used
  /// outside an engine) acquire() takes any free resource.
  struct Gate {
    std::function<bool()> reserved;  // the current invocation's reservation, used now (false: none)
    std::function<bool()> extra;     // one more credit from the gate (false: none free)
    std::function<void()> released;  // a resource came back
  };
  void set_gate(Gate gate);

 private:
  int take_locked();
  int size_;
  mutable std::mutex mu_;
  std::condition_variable idle_;  // releasing_ fell to 0
  std::vector<int> free_;
  std::vector<bool> out_;  // per index: handed out
  Gate gate_;
  int releasing_ = 0;  // release() calls telling the gate, outside the lock (set_gate waits for them)
};

/// Base class of every stage instance. One instance per stage; with workers > 1, process() is
/// called concurrently from several threads and must be thread-safe (use out.worker() for
/// per-worker state). Sources override produce(), the others process().
class Stage {
 public:
  virtual ~Stage() = default;
  /// Called once before any item, on the thread that will run the stage when it owns one
  /// (own_thread: set the CUDA device, stream and grad mode here); on the engine thread otherwise.
  virtual void initialize() {}
  /// Sources: produce zero or more items and return true, or return false at end of input.
  /// Called repeatedly (never concurrently for one worker) until it returns false or a stop
  /// is requested.
  virtual bool produce(Emitter& /*out*/) { return false; }
  /// Middle stages and sinks: consume one input, emit zero, one or many outputs.
  virtual void process(Item /*in*/, Emitter& /*out*/) {}
  /// End of stream (input drained or stop): flush what is pending. Called once, after the last
  /// process(), on the stage's own thread when it has one. May emit. Not called after a failure.
  virtual void finalize(Emitter& /*out*/) {}
  /// A pool whose free resources gate this stage's inputs (see ResourcePool); null: none.
  /// Asked once, after construction.
  virtual std::shared_ptr<ResourcePool> resource_pool() { return nullptr; }
};

enum class OnStop {
  finish,   // on a stop request, process what is already queued (default)
  discard,  // on a stop request, drop queued inputs unprocessed (counted as discarded); so do the
            // stages whose every output leads only to discarding stages
};

/// A registered stage type. Ports connect by name; a port name stands for one C++ type across
/// every registered stage (the registry checks it).
///
/// A type is registered whole (PIPELINE_STAGE), or in two halves: its declaration (name, doc,
/// ports, options, rules; PIPELINE_STAGE_DECLARE) and its implementation (factory, routing filter,
/// the ports' C++ types; PIPELINE_STAGE_IMPL). The halves let a program that only lists or checks
/// graphs (`pipeline stages`, `check`, `graph`) know every type without linking the code behind it
/// (the training stages need LibTorch); such a type validates in a GraphSpec but cannot be built.
struct StageType {
  std::string name = {};
  std::string doc = {};
  PortType input = {};   // no_port(): a source
  PortType output = {};  // no_port(): a sink; any_port(): same type as the input
  config::Schema options = config::Schema();  // the type's own keys (the common keys are added by the engine)
  // Runs on a dedicated std::thread (device work); workers must be 1. A source that declares
  // it produces on a thread of its own (blocking reads: graph/source_thread.h).
  bool own_thread = false;
  bool ordered = false;     // needs its input in sequence order (the engine guarantees it)
  int max_workers = 0;      // 0 = no limit; 1 for stateful stages such as pack
  bool timed = false;       // process() may call Emitter::hold_for (delay): held on a timer, not a thread
  OnStop on_stop = OnStop::finish;
  /// Routing filter: which of its producer's items this stage wants (null: all). An item a
  /// consumer does not want never enters its queue, so a consumer that only acts on some items
  /// (eval on steps that carry eval weights) never holds its producer back on the others. Behind
  /// an own-thread producer the place is taken when a wanted item is emitted, so the producer
  /// waits only for an item the consumer takes; behind any other, when the producer is admitted.
  /// (See docs/engine.md, Routing.)
  std::function<bool(const Item&)> accepts = {};
  std::function<std::unique_ptr<Stage>(const StageContext&)> factory = {};  // empty: declared only
  /// What building the stage would open and check, done without building it (and without the
  /// code behind a declared-only type): `pipeline check`'s dry run (graph::dry_run). It throws
  /// what the factory would. Null: building it opens nothing that can fail.
  std::function<void(const StageContext&)> dry_run = {};
};

/// The implementation half of a stage type declared elsewhere (see StageType).
struct StageImpl {
  std::string name = {};
  std::type_index input = typeid(void);   // C++ type of the declared input port (void: none, or any)
  std::type_index output = typeid(void);  // likewise for the output port
  std::function<bool(const Item&)> accepts = {};
  std::function<std::unique_ptr<Stage>(const StageContext&)> factory = {};
};

template <class S>
std::function<std::unique_ptr<Stage>(const StageContext&)> make_factory() {
  return [](const StageContext& ctx) -> std::unique_ptr<Stage> { return std::make_unique<S>(ctx); };
}

/// Registry of stage types; registration happens at static-initialisation time. A type without
/// a factory is a declaration; its implementation may be registered before or after it.
void register_stage_type(StageType type);
void register_stage_impl(StageImpl impl);
/// nullptr when unknown.
const StageType* find_stage_type(const std::string& name);
/// Every registered type, sorted by name (the built-ins delay, spin, test_* included).
std::vector<const StageType*> stage_types();

/// The common keys every stage section accepts: type, input, workers, capacity.
const config::Schema& common_stage_schema();

struct StageRegistrar {
  explicit StageRegistrar(StageType t) { register_stage_type(std::move(t)); }
  explicit StageRegistrar(StageImpl i) { register_stage_impl(std::move(i)); }
};

}  // namespace pipeline::graph

#define PIPELINE_STAGE_CAT2(a, b) a##b
#define PIPELINE_STAGE_CAT(a, b) PIPELINE_STAGE_CAT2(a, b)
/// Registers a stage type at static-initialisation time: PIPELINE_STAGE(ident, {StageType fields}).
#define PIPELINE_STAGE(ident, ...) \
  static ::pipeline::graph::StageRegistrar PIPELINE_STAGE_CAT(pipeline_stage_, ident){::pipeline::graph::StageType __VA_ARGS__}
/// A stage type's declaration without its implementation: PIPELINE_STAGE_DECLARE(ident, {StageType
/// fields but factory and accepts; ports as graph::port("name")}).
#define PIPELINE_STAGE_DECLARE(ident, ...) \
  static ::pipeline::graph::StageRegistrar PIPELINE_STAGE_CAT(pipeline_stage_decl_, ident){::pipeline::graph::StageType __VA_ARGS__}
/// The implementation of a declared stage type: PIPELINE_STAGE_IMPL(ident, {StageImpl fields}).
#define PIPELINE_STAGE_IMPL(ident, ...) \
  static ::pipeline::graph::StageRegistrar PIPELINE_STAGE_CAT(pipeline_stage_impl_, ident){::pipeline::graph::StageImpl __VA_ARGS__}
