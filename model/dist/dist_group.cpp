// Joining the data-parallel group, its store and collectives, and failure detection (see
// dist_group.h).
//
// Store keys (under "pipeline/<torchrun restart count>/"):
//   join/<r>   "<world size>\n<config fingerprint>" once rank r has connected
//   claim/<r>  a counter: more than 1 means two processes were started as rank r
//   hb/<r>     rank r's heartbeat counter, bumped every heartbeat interval by its watch thread
//   exit/<r>   "ok" or "error: <message>" once rank r has finished
//   0/...      the process group's own keys (Gloo and NCCL rendezvous)
// Waiting reads poll with check() instead of the store's blocking wait: a TCPStore client runs one
// operation at a time, and a long blocking wait would hold up every other user of the client.
// The heartbeat thread has a client (connection) of its own for the same reason.
#include "model/dist/dist_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "model/dist/dist_internal.h"

namespace pipeline::dist {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string seconds_str(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

class C10dWork : public Work {
 public:
  C10dWork(c10::intrusive_ptr<c10d::Work> w, torch::Tensor keep) : w_(std::move(w)), keep_(std::move(keep)) {}
  void wait() override {  // several readers of a step's result may wait (log and eval)
    std::lock_guard<std::mutex> lock(mu_);
    if (w_) w_->wait();
    w_.reset();
  }

 private:
  std::mutex mu_;
  c10::intrusive_ptr<c10d::Work> w_;
  torch::Tensor keep_;  // the tensor the collective writes into, alive until it is done
};

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// The TCPStore connection (or, on the rank that hosts it, the server plus a client: rank 0 without
// torchrun's agent, or under srun the first node's first task), with c10d's errors turned into
// sentences.
c10::intrusive_ptr<c10d::TCPStore> connect_store(const LaunchEnv& env, milliseconds timeout) {
  if (env.slurm && env.addr_from != "MASTER_ADDR") {
    // A node's name in Slurm need not be a host name (NodeName vs NodeAddr): say so at once, rather
    // than retrying a name that will not resolve until the timeout.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
    if (found) freeaddrinfo(found);
    if (rc != 0)
      throw LaunchError("the store's node, " + env.master_addr + " (" + env.addr_from + "), does not resolve to an "
                        "address here (" + gai_strerror(rc) + "): export MASTER_ADDR=<its address> before srun (for "
                        "example from scontrol show node " + env.master_addr + ", its NodeAddr)");
  }
  c10d::TCPStoreOptions o;
  o.port = env.master_port;
  o.isServer = env.hosts_store;
  o.numWorkers = env.world_size;
  o.waitWorkers = false;  // joining is checked below, with a message naming the missing ranks
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
    const std::string me = "rank " + std::to_string(env.rank);
    if (o.isServer && (contains(what, "EADDRINUSE") || contains(what, "address already in use"))) {
      std::string fix = "choose another MASTER_PORT (torchrun --master-port=PORT)";
      if (env.port_from == "SLURM_JOB_ID")
        fix = "the port is 15000 + the job id's last four digits, and another job on this node may end in the same "
              "ones: have Slurm reserve the store's port (MpiParams=ports=LO-HI in slurm.conf, or srun --resv-ports), "
              "or set [run] master_port";
      else if (env.port_from == "SLURM_STEP_RESV_PORTS")
        fix = "Slurm reserved it for this step, so a process outside Slurm holds it: give MpiParams=ports a range "
              "nothing else uses, or set [run] master_port";
      else if (env.port_from == "[run] master_port")
        fix = "choose another [run] master_port";
      throw LaunchError(me + " could not host the rendezvous store on port " + std::to_string(env.master_port) +
                        (env.port_from.empty() ? "" : " (from " + env.port_from + ")") + ": the port is in use (another run, or one that has not exited "
                        "yet); " + fix);
    }
    if (o.isServer)
      throw LaunchError(me + " could not host the rendezvous store at " + where + ": " +
                        what.substr(0, what.find('\n')));
    throw LaunchError(me + " could not reach the rendezvous store at " + where + " within " + seconds_str(timeout) +
                      " (" + env.store_host() +
                      " should be listening there; check MASTER_ADDR/MASTER_PORT, --rdzv-endpoint and the network): " +
                      what.substr(0, what.find('\n')));
  }
}

}  // namespace

const char* backend_name(BackendKind kind) { return kind == BackendKind::nccl ? "nccl" : "gloo"; }

struct Group::Impl {
  LaunchEnv env;
  GroupOptions options;
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  c10::intrusive_ptr<c10d::Store> store;  // prefixed
  c10::intrusive_ptr<c10d::ProcessGroup> pg;

  std::thread watcher;
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool stop_watch = false;
  milliseconds interval{1000};
  std::function<void(const std::string&)> on_failure;
  std::string pending_failure;  // found before a callback was installed
  bool reported = false;
  std::atomic<bool> aborted{false};  // waits in the store end at once
  std::string abort_reason;          // under watch_mu

  bool check(const std::string& k) { return store->check({k}); }

  std::optional<std::string> try_get(const std::string& k) {
    if (!store->check({k})) return std::nullopt;
    return text(store->get(k));
  }

  // Polls so the client is free between attempts (see the file comment). A rank that failed
  // will not write what is waited for: its failure ends the wait at once.
  std::optional<std::string> poll_get(const std::string& k, milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    milliseconds nap{1};
    for (;;) {
      if (auto v = try_get(k)) return v;
      if (auto failed = try_get("failed"); failed && failed->rfind("rank " + std::to_string(env.rank) + " ", 0) != 0)
        throw LaunchError(*failed);
      if (aborted.load()) {
        std::lock_guard<std::mutex> lock(watch_mu);
        throw LaunchError("stopped waiting for \"" + k + "\": " + abort_reason);
      }
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, milliseconds(50));
    }
  }

  void join_check() {
    const int w = env.world_size;
    const std::string mine = std::to_string(w) + "\n" + options.config_fingerprint;
    if (store->add("claim/" + std::to_string(env.rank), 1) > 1)
      throw LaunchError("two processes were started as rank " + std::to_string(env.rank) +
                        ": every rank must have its own RANK (torchrun assigns them)");
    store->set("join/" + std::to_string(env.rank), bytes(mine));
    store->set("hb/" + std::to_string(env.rank), bytes("0"));
    auto deadline = Clock::now() + options.timeout;
    std::vector<std::string> joined(static_cast<size_t>(w));
    for (int r = 0; r < w; ++r) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      auto v = poll_get("join/" + std::to_string(r), std::max(left, milliseconds(0)));
      if (!v) {
        std::vector<int> missing;
        for (int q = 0; q < w; ++q)
          if (!check("join/" + std::to_string(q))) missing.push_back(q);
        throw LaunchError(rank_list(missing) + " of " + std::to_string(w) + " did not join within " +
                          seconds_str(options.timeout) + ": check that WORLD_SIZE (" + std::to_string(w) +
                          ") is the number of processes started on all machines (torchrun: --nproc-per-node "
                          "times --nnodes) and that each of them is running");
      }
      joined[static_cast<size_t>(r)] = *v;
    }
    for (int r = 0; r < w; ++r) {
      const std::string& theirs = joined[static_cast<size_t>(r)];
      const std::string their_w = theirs.substr(0, theirs.find('\n'));
      if (their_w != std::to_string(w))
        throw LaunchError("rank " + std::to_string(r) + " was started with WORLD_SIZE " + their_w + ", rank " +
                          std::to_string(env.rank) + " with " + std::to_string(w) +
                          ": every rank must be given the same WORLD_SIZE");
    }
    const std::string& first = joined[0];
    if (first != mine)
      throw LaunchError("rank " + std::to_string(env.rank) + "'s configuration differs from rank 0's (" +
                        first_difference(mine, first) + "): every rank must run the same config file with the same "
                        "--set overrides");
  }

  // "training.batch_size = 4 here, 8 on rank 0" for two fingerprints (one setting per line).
  static std::string first_difference(const std::string& mine, const std::string& theirs) {
    auto lines = [](const std::string& s) {
      std::vector<std::string> out;
      for (size_t at = 0; at < s.size();) {
        size_t end = s.find('\n', at);
        if (end == std::string::npos) end = s.size();
        out.push_back(s.substr(at, end - at));
        at = end + 1;
      }
      return out;
    };
    auto a = lines(mine), b = lines(theirs);
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      std::string x = i < a.size() ? a[i] : "(nothing)", y = i < b.size() ? b[i] : "(nothing)";
      if (x != y) return x + " here, " + y + " on rank 0";
    }
    return "?";
  }

  void build_process_group() {
    auto group_store = c10::make_intrusive<c10d::PrefixStore>("0/", store);
    pg = c10::make_intrusive<c10d::ProcessGroup>(group_store, env.rank, env.world_size);
    if (options.device.is_cuda()) pg->setBoundDeviceId(options.device);
    try {
      auto gloo = detail::make_gloo_backend(c10::make_intrusive<c10d::PrefixStore>("cpu/", group_store), env.rank,
                                            env.world_size, options.timeout);
      gloo->setGroupUid("0");
      pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
      if (options.backend == BackendKind::nccl) {
        auto nccl = detail::make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("cuda/", group_store), env.rank,
                                              env.world_size, options.timeout, options.device);
        nccl->setGroupUid("0");
        pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
        pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
      } else {
        if (options.device.is_cuda())  // Gloo reduces CUDA tensors through host memory
          pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
        pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
      }
    } catch (const LaunchError&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw LaunchError("rank " + std::to_string(env.rank) + " could not connect the " + backend_name(options.backend) +
                        " process group: " + what.substr(0, what.find('\n')));
    }
    pg->setGroupName("0");
  }

  // ---- heartbeats

  // Reports a failure to the callback, or keeps it until one is installed.
  void report(const std::string& failure) {
    std::function<void(const std::string&)> f;
    {
      std::lock_guard<std::mutex> lock(watch_mu);
      if (!pending_failure.empty() || reported) return;
      if (on_failure) {
        reported = true;
        f = on_failure;
      } else {
        pending_failure = failure;
      }
    }
    if (f) f(failure);
  }

  void watch_loop() {
    c10::intrusive_ptr<c10d::Store> own;  // a connection of its own (see the file comment)
    try {
      own = c10::make_intrusive<c10d::PrefixStore>(prefix(), tcp->clone());
    } catch (const std::exception& e) {
      report(std::string("could not open a second connection to the rendezvous store: ") + e.what());
      return;
    }
    const int w = env.world_size;
    std::vector<std::string> hb_keys;
    for (int r = 0; r < w; ++r) hb_keys.push_back("hb/" + std::to_string(r));
    std::vector<std::string> last(static_cast<size_t>(w));
    std::vector<Clock::time_point> changed(static_cast<size_t>(w), Clock::now());
    auto store_ok = Clock::now();
    const std::string me = "hb/" + std::to_string(env.rank);
    std::unique_lock<std::mutex> lock(watch_mu);
    while (!stop_watch) {
      lock.unlock();
      std::string failure;
      try {
        own->add(me, 1);
        if (own->check({"failed"})) {
          auto why = text(own->get("failed"));
          if (why.rfind("rank " + std::to_string(env.rank) + " ", 0) != 0) failure = why;
        }
        auto values = own->multiGet(hb_keys);
        auto now = Clock::now();
        store_ok = now;
        for (int r = 0; r < w && failure.empty(); ++r) {
          auto i = static_cast<size_t>(r);
          if (r == env.rank) continue;
          auto v = text(values[i]);
          if (v != last[i]) {
            last[i] = v;
            changed[i] = now;
          }
          // A silent peer that recorded its exit finished cleanly (an error would be in "failed").
          if (now - changed[i] > options.heartbeat_timeout && !own->check({"exit/" + std::to_string(r)}))
            failure = "rank " + std::to_string(r) + " stopped responding: no heartbeat for " +
                      seconds_str(options.heartbeat_timeout) + " (its process died, hangs, or lost the network)";
        }
      } catch (const std::exception& e) {
        if (Clock::now() - store_ok > options.heartbeat_timeout)
          failure = "lost the rendezvous store at " + env.master_addr + ":" + std::to_string(env.master_port) + " (" +
                    env.store_host() + ", which hosted it, is gone): " +
                    std::string(e.what()).substr(0, std::string(e.what()).find('\n'));
      }
      if (!failure.empty()) {
        report(failure);
        return;
      }
      lock.lock();
      watch_cv.wait_for(lock, interval, [&] { return stop_watch; });
    }
  }

  std::string prefix() const { return "pipeline/" + std::to_string(env.restart_count) + "/"; }
};

Group::Group(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Group::~Group() {
  {
    std::lock_guard<std::mutex> lock(impl_->watch_mu);
    impl_->stop_watch = true;
  }
  impl_->watch_cv.notify_all();
  if (impl_->watcher.joinable()) impl_->watcher.join();
  try {
    if (impl_->pg) impl_->pg->shutdown();  // NCCL wants an explicit shutdown before destruction
  } catch (const std::exception&) {
  }
}

std::shared_ptr<Group> Group::join(const LaunchEnv& env, const GroupOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->options = options;
  impl->interval = std::clamp(std::chrono::duration_cast<milliseconds>(options.heartbeat_timeout / 5),
                              milliseconds(100), milliseconds(1000));
  impl->tcp = connect_store(env, options.timeout);
  impl->store = c10::make_intrusive<c10d::PrefixStore>(impl->prefix(), impl->tcp);
  try {
    try {
      impl->join_check();
    } catch (const LaunchError& e) {
      // The others are waiting for this rank to be ready: tell them why it will not be.
      impl->store->compareSet("failed", {}, bytes("rank " + std::to_string(env.rank) + " failed: " + e.what()));
      throw;
    }
    impl->store->set("ready/" + std::to_string(env.rank), bytes("1"));
    for (int r = 0; r < env.world_size; ++r)
      if (!impl->poll_get("ready/" + std::to_string(r), options.timeout))
        throw LaunchError("rank " + std::to_string(r) + " joined but did not get ready within " +
                          seconds_str(options.timeout));
  } catch (const LaunchError&) {
    throw;
  } catch (const std::exception& e) {
    throw LaunchError("rank " + std::to_string(env.rank) + " lost the rendezvous store while joining: " +
                      std::string(e.what()).substr(0, std::string(e.what()).find('\n')));
  }
  // Beat from now on: building the process group, the graph and the model may take a while, and
  // the others must not take that for a dead rank.
  std::shared_ptr<Group> group(new Group(std::move(impl)));
  Impl* i = group->impl_.get();
  i->watcher = std::thread([i] { i->watch_loop(); });
  i->build_process_group();
  return group;
}

c10::intrusive_ptr<c10d::ProcessGroup> detail::process_group_of(Group& group) { return group.impl().pg; }

int Group::rank() const { return impl_->env.rank; }
int Group::size() const { return impl_->env.world_size; }
const LaunchEnv& Group::env() const { return impl_->env; }
const GroupOptions& Group::options() const { return impl_->options; }

void Group::set(const std::string& key, const std::string& value) { impl_->store->set(key, bytes(value)); }

std::string Group::get(const std::string& key, std::optional<milliseconds> timeout) {
  auto t = timeout.value_or(impl_->options.timeout);
  if (auto v = impl_->poll_get(key, t)) return *v;
  throw LaunchError("rank " + std::to_string(rank()) + " waited " + seconds_str(t) + " for \"" + key +
                    "\" from another rank in the rendezvous store; it never came");
}

std::optional<std::string> Group::try_get(const std::string& key) { return impl_->try_get(key); }

void Group::erase(const std::string& key) { impl_->store->deleteKey(key); }

std::shared_ptr<Work> Group::allreduce_sum(torch::Tensor& t) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  return std::make_shared<C10dWork>(impl_->pg->allreduce(v, o), t);
}

std::shared_ptr<Work> Group::allreduce_max(torch::Tensor& t) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  return std::make_shared<C10dWork>(impl_->pg->allreduce(v, o), t);
}

void Group::broadcast(const std::vector<torch::Tensor>& tensors, int root) {
  // The bucket DDP uses for its start-up broadcast (250 MB).
  c10d::broadcast_coalesced(impl_->pg, tensors, size_t(250) << 20, root);
}

void Group::watch(std::function<void(const std::string&)> on_failure) {
  std::string pending;
  {
    std::lock_guard<std::mutex> lock(impl_->watch_mu);
    impl_->on_failure = std::move(on_failure);
    std::swap(pending, impl_->pending_failure);
    if (!pending.empty()) impl_->reported = true;
  }
  if (!pending.empty()) impl_->on_failure(pending);
}

void Group::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(impl_->watch_mu);
    impl_->abort_reason = reason;
  }
  impl_->aborted.store(true);
  try {
    impl_->pg->abort();  // NCCL: aborts the communicators, so blocked collectives return
  } catch (const std::exception&) {
  }
}

void Group::record_exit(const std::string& error) {
  const std::string r = std::to_string(rank());
  try {
    if (!error.empty()) impl_->store->compareSet("failed", {}, bytes("rank " + r + " failed: " + error));
    set("exit/" + r, error.empty() ? "ok" : "error: " + error);
  } catch (const std::exception&) {
    // The store is gone (the launcher exited): nobody is left to read it.
  }
}

std::string Group::diagnose() {
  const int w = size();
  std::vector<std::string> first(static_cast<size_t>(w));
  std::vector<bool> seen(static_cast<size_t>(w), false);
  // Two heartbeat intervals (and at least a second) tell a dead peer from a live one.
  auto window = std::max(impl_->interval * 3, milliseconds(1500));
  auto start = Clock::now();
  try {
    for (;;) {
      std::vector<std::string> failed, gone;
      bool settled = Clock::now() - start >= window;
      for (int r = 0; r < w; ++r) {
        if (r == rank()) continue;
        auto exit = impl_->try_get("exit/" + std::to_string(r));
        if (exit && exit->rfind("error: ", 0) == 0) {
          failed.push_back("rank " + std::to_string(r) + " failed: " + exit->substr(7));
          continue;
        }
        if (exit) continue;  // it finished cleanly
        auto hb = impl_->try_get("hb/" + std::to_string(r)).value_or("");
        auto i = static_cast<size_t>(r);
        if (!seen[i]) {
          seen[i] = true;
          first[i] = hb;
        } else if (settled && hb == first[i]) {
          gone.push_back("rank " + std::to_string(r) + " is gone: it recorded no exit and its heartbeat stopped (killed, "
                         "or its machine failed)");
        }
      }
      if (!failed.empty() || settled) {
        failed.insert(failed.end(), gone.begin(), gone.end());
        std::string out;
        for (const auto& f : failed) out += (out.empty() ? "" : "; ") + f;
        return out;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  } catch (const std::exception&) {
    return "the rendezvous store at " + impl_->env.master_addr + ":" + std::to_string(impl_->env.master_port) +
           " is unreachable, so torchrun's agent (or rank 0) has exited";
  }
}

void Group::wait_for_exits(milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  try {
    for (int r = 0; r < size(); ++r) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (!impl_->poll_get("exit/" + std::to_string(r), std::max(left, milliseconds(0)))) return;
    }
  } catch (const std::exception&) {
  }
}

}  // namespace pipeline::dist
