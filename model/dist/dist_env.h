// The launcher's environment of one data-parallel rank: what torchrun (or a user launching ranks by
// hand, as with torch.distributed's env:// method) sets for each process it starts.
//
//   RANK, WORLD_SIZE               this process's rank and the number of ranks (all machines)
//   LOCAL_RANK, LOCAL_WORLD_SIZE   the same on this machine; LOCAL_RANK picks the GPU
//   MASTER_ADDR, MASTER_PORT       where the rendezvous store listens
//   TORCHELASTIC_USE_AGENT_STORE   "True": torchrun's agent hosts that store, so every rank
//                                  (rank 0 included) connects as a client; otherwise rank 0 hosts it
//   TORCHELASTIC_RESTART_COUNT     how often torchrun restarted the workers (keys are kept apart)
//   TORCHELASTIC_RUN_ID            set by torchrun only (its --rdzv-id)
//
// Without them, a task started by srun takes its rank from Slurm's variables (slurm_env.h).
// No torch here: parsing and checking only, so errors read as sentences.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace pipeline::dist {

/// A launch or rendezvous problem, phrased for the user (what is wrong and what to do).
struct LaunchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LaunchEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr;
  uint16_t master_port = 0;
  bool agent_store = false;  // torchrun's agent hosts the store: every rank is a client
  /// This rank hosts the store: rank 0 without torchrun's agent; under srun, the first task of
  /// the step's first node, which need not be rank 0 (slurm_env.h).
  bool hosts_store = false;
  int restart_count = 0;     // torchrun's restarts, or the Slurm job's requeues
  std::string run_id;        // empty when not launched by torchrun
  bool slurm = false;        // srun started the ranks (slurm_env.h), without torchrun
  std::string addr_from;     // where master_addr came from, for messages ("MASTER_ADDR", ...)
  std::string port_from;     // where master_port came from ("MASTER_PORT", "SLURM_STEP_RESV_PORTS", ...)
  bool torchrun() const { return !run_id.empty(); }
  /// Who hosts the store, for messages: "torchrun's agent", "rank 0" or "the first node's first task".
  std::string store_host() const;
  /// "rank 1 of 4 (local rank 1 of 2), store at host:29500 (torchrun's agent)"
  std::string str() const;
};

/// Looks a variable up; the default reads the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

/// The rank's environment: torchrun's (or env://'s, set by hand) when any of RANK, LOCAL_RANK,
/// WORLD_SIZE and LOCAL_WORLD_SIZE is set; else srun's (slurm_launch_env, with `slurm_port` =
/// [run] master_port, 0 for none); nullopt when neither applies (a single process). Throws
/// LaunchError naming the variable, its value and what was expected; a partial torchrun
/// environment (some of them set, but not all of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)
/// names every missing variable.
std::optional<LaunchEnv> launch_env(const EnvLookup& get = process_env(), uint16_t slurm_port = 0);

namespace detail {
/// An integer variable in [lo, hi], nullopt when unset; a value that is not one is a LaunchError
/// naming the variable and its value, with `hint` after.
std::optional<int64_t> int_env(const EnvLookup& get, const std::string& name, int64_t lo, int64_t hi,
                               const std::string& hint);
}  // namespace detail

}  // namespace pipeline::dist
