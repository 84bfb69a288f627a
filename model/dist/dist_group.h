// The data-parallel group of one training run: the ranks torchrun started, joined through a c10d
// TCPStore, with a c10d ProcessGroup for collectives (Gloo for CPU tensors always; NCCL for CUDA
// tensors when asked), the store for small messages between ranks, and failure detection
// (heartbeats and exit records in the store) so a rank whose peer died stops with a message that
// names it instead of hanging.
//
// The group is built the way torch.distributed's init_process_group builds its default group:
// TCPStore client (or server on rank 0 without torchrun's agent) -> PrefixStore -> ProcessGroup
// -> setBackend(device type, backend) -> setDefaultBackend. c10d's headers stay in the .cpp files.
//
// Example:
//   auto env = dist::launch_env();                       // nullopt without torchrun
//   auto group = dist::Group::join(*env, {.backend = dist::BackendKind::gloo});
//   auto t = torch::ones({2});
//   group->allreduce_sum(t)->wait();                     // t == world size on every rank
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/dist/dist_env.h"

namespace pipeline::dist {

enum class BackendKind { gloo, nccl };
const char* backend_name(BackendKind kind);  // "gloo" / "nccl"

struct GroupOptions {
  BackendKind backend = BackendKind::gloo;  // for tensors on `device`; host tensors always use Gloo
  torch::Device device = torch::kCPU;       // this rank's device (cuda:LOCAL_RANK for NCCL)
  /// How long a rank waits for the others: joining, store reads, collectives (c10d's timeout).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// A peer whose heartbeat stops for this long is reported as gone (see Group::watch).
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(60);
  /// Identifies the configuration: every rank must join with the same one (empty: not checked).
  std::string config_fingerprint = {};
};

/// Completion of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  /// Host tensors (Gloo): blocks until done. CUDA (NCCL): makes the current stream wait for the
  /// collective; the host does not wait.
  virtual void wait() = 0;
};

class Group {
 public:
  /// Connects to the rendezvous store, waits (up to options.timeout) until every rank has joined,
  /// checks that they agree on the world size and configuration, and builds the process group.
  /// Throws LaunchError with a sentence (port in use, store unreachable, a rank missing, ...).
  static std::shared_ptr<Group> join(const LaunchEnv& env, const GroupOptions& options);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const;
  int size() const;
  const LaunchEnv& env() const;
  const GroupOptions& options() const;

  // ---- The store: short strings every rank can read. Keys live under "pipeline/".
  void set(const std::string& key, const std::string& value);
  /// Waits for the key up to `timeout` (default: options().timeout); throws LaunchError naming it.
  std::string get(const std::string& key, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  std::optional<std::string> try_get(const std::string& key);  // never waits
  void erase(const std::string& key);

  // ---- Collectives. Every rank issues the same ones in the same order.
  /// In place, asynchronous. `t` must stay alive until wait() returns.
  std::shared_ptr<Work> allreduce_sum(torch::Tensor& t);
  std::shared_ptr<Work> allreduce_max(torch::Tensor& t);
  /// Copies root's tensors into everyone's, in buckets (as DDP's start-up broadcast); waits.
  void broadcast(const std::vector<torch::Tensor>& tensors, int root);

  // ---- Failures.
  /// Every rank beats a heartbeat in the store from join() on, from a thread of its own, and
  /// watches the others'. `on_failure` runs once, on that thread (or at once, for a failure seen
  /// before it was installed), with a sentence naming a rank that recorded an error or whose
  /// heartbeat stopped for heartbeat_timeout, or saying that the store itself is gone.
  void watch(std::function<void(const std::string&)> on_failure);
  /// Aborts the collectives in flight (NCCL communicators; Gloo's fail on their own when a peer's
  /// connection drops or their timeout passes) and every wait in the store, which then throws
  /// LaunchError with `reason`.
  void abort(const std::string& reason);
  /// Records how this rank ends ("" = cleanly, else the error) for the others' messages.
  void record_exit(const std::string& error);
  /// After a collective failed: a sentence naming the rank(s) at fault (their exit records, or
  /// heartbeats that stopped), waiting up to a few seconds for the evidence. "" if none is found.
  std::string diagnose();
  /// Waits (up to `timeout`) until every rank has recorded its exit, so a store hosted by this
  /// rank outlives the others' last reads.
  void wait_for_exits(std::chrono::milliseconds timeout);

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Group(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeline::dist
