// Parsing and checking torchrun's environment (see dist_env.h).
#include "model/dist/dist_env.h"

#include <charconv>
#include <cstdlib>

#include "model/dist/slurm_env.h"

namespace pipeline::dist {
namespace {

const char* kHint = " (torchrun sets it: launch with torchrun --nproc-per-node=N build/tools/pipeline run CONFIG)";

std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// An integer variable in [lo, hi]; `fallback` when unset (nullopt: required).
int64_t int_var(const EnvLookup& get, const std::string& name, int64_t lo, int64_t hi, std::optional<int64_t> fallback) {
  if (auto v = detail::int_env(get, name, lo, hi, kHint)) return *v;
  if (fallback) return *fallback;
  throw LaunchError(name + " is not set, but WORLD_SIZE is: a data-parallel rank needs both" + kHint);
}

}  // namespace

std::optional<int64_t> detail::int_env(const EnvLookup& get, const std::string& name, int64_t lo, int64_t hi,
                                       const std::string& hint) {
  auto raw = get(name);
  if (!raw) return std::nullopt;
  auto v = parse_int(*raw);
  if (!v || *v < lo || *v > hi)
    throw LaunchError(name + " is \"" + *raw + "\": expected an integer from " + std::to_string(lo) + " to " +
                      std::to_string(hi) + hint);
  return *v;
}

std::string LaunchEnv::str() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local rank " +
         std::to_string(local_rank) + " of " + std::to_string(local_world_size) + "), store at " + master_addr + ":" +
         std::to_string(master_port) +
         (agent_store ? " (torchrun's agent)" : hosts_store ? " (hosted here)" : " (hosted by " + store_host() + ")");
}

std::string LaunchEnv::store_host() const {
  if (agent_store) return "torchrun's agent";
  return slurm && addr_from != "MASTER_ADDR" ? "the first node's first task" : "rank 0";
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

std::optional<LaunchEnv> launch_env(const EnvLookup& get, uint16_t slurm_port) {
  // A rank's own variables say that a launcher started this process as one rank of several; then
  // every variable a rank needs must be there. A partial environment is refused rather than read
  // as a single process, which would train alone and could write into a directory the other
  // ranks use. (MASTER_ADDR and MASTER_PORT alone are often exported for other tools: no launch.)
  std::string present, missing;
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})
    if (get(name)) present += std::string(present.empty() ? "" : ", ") + name;
  if (present.empty()) return slurm_launch_env(get, slurm_port);  // torchrun's variables win
  int n_missing = 0;
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    auto v = get(name);
    if (!v || v->empty()) {
      missing += std::string(missing.empty() ? "" : ", ") + name;
      ++n_missing;
    }
  }
  if (n_missing > 0)
    throw LaunchError("a partial torchrun environment: " + present + " set, but " + missing + (n_missing == 1 ? " is" : " are") +
                      " not. A data-parallel rank needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; to train as "
                      "one process, unset " + present + kHint);
  LaunchEnv e;
  e.world_size = static_cast<int>(int_var(get, "WORLD_SIZE", 1, 1 << 20, std::nullopt));
  e.rank = static_cast<int>(int_var(get, "RANK", 0, 1 << 20, std::nullopt));
  if (e.rank >= e.world_size)
    throw LaunchError("RANK is " + std::to_string(e.rank) + " but WORLD_SIZE is " + std::to_string(e.world_size) +
                      ": ranks are numbered 0 to WORLD_SIZE - 1");
  // By hand, one process per machine is the common case: local = global unless said otherwise.
  e.local_world_size = static_cast<int>(int_var(get, "LOCAL_WORLD_SIZE", 1, e.world_size, e.world_size));
  e.local_rank = static_cast<int>(int_var(get, "LOCAL_RANK", 0, 1 << 20, e.rank % e.local_world_size));
  if (e.local_rank >= e.local_world_size)
    throw LaunchError("LOCAL_RANK is " + std::to_string(e.local_rank) + " but LOCAL_WORLD_SIZE is " +
                      std::to_string(e.local_world_size) + ": local ranks are numbered 0 to LOCAL_WORLD_SIZE - 1");
  auto addr = get("MASTER_ADDR");
  if (!addr || addr->empty())
    throw LaunchError(std::string("MASTER_ADDR is not set: the ranks need the address of the rendezvous store") + kHint);
  e.master_addr = *addr;
  e.addr_from = "MASTER_ADDR";
  e.master_port = static_cast<uint16_t>(int_var(get, "MASTER_PORT", 1, 65535, std::nullopt));
  e.port_from = "MASTER_PORT";
  auto agent = get("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
  e.hosts_store = !e.agent_store && e.rank == 0;
  e.restart_count = static_cast<int>(int_var(get, "TORCHELASTIC_RESTART_COUNT", 0, 1 << 20, 0));
  e.run_id = get("TORCHELASTIC_RUN_ID").value_or("");
  return e;
}

}  // namespace pipeline::dist
