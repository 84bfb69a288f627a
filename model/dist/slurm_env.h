// What Slurm tells a task about its job and its step, for a run started by `srun` without
// torchrun (dist_env.h's launch_env asks here when torchrun's variables are absent):
//
//   SLURM_PROCID, SLURM_NTASKS        this task's rank and the step's number of tasks
//   SLURM_LOCALID                     the task's rank on its node (picks the GPU)
//   SLURM_STEP_NODELIST               the step's nodes, compressed ("n[1-3,7],gpu-a[01-02]"); the
//   (SLURM_JOB_NODELIST)              store listens on the first, hosted by that node's first task
//                                     (SLURM_LOCALID 0), whichever rank it is: rank 0 may run on
//                                     another node (--distribution=arbitrary, SLURM_HOSTFILE). The
//                                     job's list when the step's is not set
//   SLURM_STEP_TASKS_PER_NODE         tasks on each node ("2(x3),1"), for the local world size
//   SLURMD_NODENAME (SLURM_NODEID)    this task's node, found in the step's list (its index there)
//   SLURM_STEP_RESV_PORTS             ports Slurm reserved for the step on each of its nodes
//                                     ("20001-20002"; with MpiParams=ports=LO-HI in slurm.conf, or
//                                     srun --resv-ports): the store takes the first, which no other
//                                     step on that node holds
//   SLURM_STEP_ID                     set in a step (srun), not in the batch script itself
//   SLURM_JOB_ID, SLURM_RESTART_COUNT the job, and how often it was requeued
//   MASTER_ADDR, MASTER_PORT          when exported, where the store listens (MASTER_ADDR: rank 0's
//                                     address, as torch's env:// has it; rank 0 hosts it then)
//
// No torch and no network here: parsing and checking only, so errors read as sentences.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/dist/dist_env.h"

namespace pipeline::dist {

/// Expands a Slurm host list: names joined by commas, each with any number of bracket groups of
/// numbers and ranges ("n[1-3,7],gpu-a[01-02]" -> n1 n2 n3 n7 gpu-a01 gpu-a02; "a[1-2]b[3-4]" ->
/// a1b3 a1b4 a2b3 a2b4, the first group outermost, as `scontrol show hostnames` orders them). A
/// range keeps the width of its first number ("[08-10]" -> 08 09 10). Throws
/// std::invalid_argument naming the byte offset and what is wrong (an unclosed bracket, a range
/// that runs backwards, more than `max_hosts` names).
std::vector<std::string> expand_hostlist(const std::string& list, size_t max_hosts = 1 << 20);

/// Expands Slurm's tasks per node: "2(x3),1" -> 2 2 2 1. Throws std::invalid_argument.
std::vector<int> expand_tasks_per_node(const std::string& s);

/// The port derived from a Slurm job id when neither [run] master_port, MASTER_PORT nor a port
/// Slurm reserved (SLURM_STEP_RESV_PORTS) gives one: 15000 + the id's last four digits
/// (15000..24999, as PyTorch Lightning does), below Linux's ephemeral ports, and the same for
/// every task of the job. Two jobs whose ids end in the same four digits take the same port: on
/// one first node at once, the second cannot host its store (the error says to reserve ports).
uint16_t port_of_job(uint64_t job_id);

/// The first port of SLURM_STEP_RESV_PORTS ("20001-20002", "20001", "20001-20002,20010"). Throws
/// std::invalid_argument naming the byte offset and what is wrong.
uint16_t first_reserved_port(const std::string& ports);

/// The Slurm job this process belongs to, for the run log and metrics.jsonl.
struct SlurmJob {
  std::string id;          // SLURM_JOB_ID
  int restart_count = 0;   // SLURM_RESTART_COUNT: how often the job was requeued
  std::string array;       // "ARRAYID_TASK" for an array job, else empty
  /// "slurm job 1234 (restart 2)"
  std::string str() const;
};

/// The job, or nullopt outside Slurm (no SLURM_JOB_ID).
std::optional<SlurmJob> slurm_job(const EnvLookup& get);

/// The rank's environment from srun's variables, or nullopt when this is not one task of several
/// (no SLURM_PROCID or SLURM_NTASKS, or SLURM_NTASKS is 1: srun with one task is a plain run).
/// The store has no agent: its address is MASTER_ADDR when exported (hosted by rank 0), else the
/// first host of the step's node list as it is named there (a name that does not resolve is
/// reported when the ranks connect), hosted by that node's first task; its port is `config_port`
/// ([run] master_port) unless 0, else MASTER_PORT when exported, else the first of
/// SLURM_STEP_RESV_PORTS, else port_of_job. Throws
/// LaunchError naming the variable: SLURM_NTASKS without SLURM_PROCID, a malformed node list, a
/// rank beyond SLURM_NTASKS, malformed reserved ports, the job's batch script itself
/// (SLURM_NTASKS > 1 but no SLURM_STEP_ID: ranks are started with srun).
std::optional<LaunchEnv> slurm_launch_env(const EnvLookup& get, uint16_t config_port);

}  // namespace pipeline::dist
