// Fuzzes what a rank reads from srun (model/dist/slurm_env.h), torch-free:
//   - the host list: any text either expands or raises std::invalid_argument; every name is
//     non-empty, holds none of ",[]" nor a space or control byte, and expands to itself alone; a
//     list without brackets is its comma-separated names; never more names than the bound;
//   - the tasks per node and the reserved ports: a value in range, or std::invalid_argument;
//   - the whole environment, the input cut at NUL bytes into the step's variables: a rank whose
//     numbers agree with each other (rank < world, local rank < local world, a port, an address),
//     or a LaunchError, never another exception.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "model/dist/slurm_env.h"

namespace {

constexpr size_t kMaxHosts = 4096;

void check_hostlist(const std::string& list) {
  using pipeline::dist::expand_hostlist;
  std::vector<std::string> names;
  try {
    names = expand_hostlist(list, kMaxHosts);
  } catch (const std::invalid_argument&) {
    return;
  }
  if (names.empty() || names.size() > kMaxHosts) fuzz_util::broken("a list of " + std::to_string(names.size()) + " names");
  for (const auto& n : names) {
    if (n.empty()) fuzz_util::broken("an empty name from \"" + list + "\"");
    for (unsigned char c : n)
      if (c == ',' || c == '[' || c == ']' || c <= ' ' || c == 0x7f) fuzz_util::broken("a name with a separator: " + n);
  }
  for (size_t i = 0; i < std::min<size_t>(names.size(), 8); ++i)
    if (expand_hostlist(names[i]) != std::vector<std::string>{names[i]})
      fuzz_util::broken("a name that does not expand to itself: " + names[i]);
  if (list.find_first_of("[]") == std::string::npos) {
    std::vector<std::string> plain;
    for (size_t at = 0; at <= list.size();) {
      size_t end = std::min(list.find(',', at), list.size());
      if (end > at) plain.push_back(list.substr(at, end - at));
      at = end + 1;
    }
    if (plain != names) fuzz_util::broken("a list without brackets is not its names: " + list);
  }
}

void check_numbers(const std::string& text) {
  try {
    const auto per_node = pipeline::dist::expand_tasks_per_node(text);
    if (per_node.empty() || per_node.size() > (size_t{1} << 20)) fuzz_util::broken("tasks for no node, or too many");
    for (int n : per_node)
      if (n < 0 || n > (1 << 20)) fuzz_util::broken("a task count out of range: " + std::to_string(n));
  } catch (const std::invalid_argument&) {
  }
  try {
    const uint16_t port = pipeline::dist::first_reserved_port(text);
    if (port == 0) fuzz_util::broken("port 0 from \"" + text + "\"");
  } catch (const std::invalid_argument&) {
  }
}

void check_env(std::string_view input) {
  static const char* kNames[] = {"SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_RESV_PORTS",
                                 "SLURM_PROCID",        "SLURM_NTASKS",              "SLURM_LOCALID",
                                 "SLURMD_NODENAME",     "SLURM_NODEID",              "SLURM_JOB_ID"};
  std::map<std::string, std::string> vars = {{"SLURM_STEP_ID", "0"}};
  size_t i = 0;
  for (size_t at = 0; at <= input.size() && i < std::size(kNames); ++i) {
    const size_t end = std::min(input.find('\0', at), input.size());
    vars[kNames[i]] = std::string(input.substr(at, end - at));
    at = end + 1;
  }
  const auto get = [&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  try {
    const auto e = pipeline::dist::slurm_launch_env(get, 0);
    if (!e) return;
    if (e->rank < 0 || e->rank >= e->world_size || e->local_rank < 0 || e->local_rank >= e->local_world_size)
      fuzz_util::broken("a rank that does not fit its world: " + e->str());
    if (e->master_port == 0 || e->master_addr.empty()) fuzz_util::broken("no store: " + e->str());
  } catch (const pipeline::dist::LaunchError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = fuzz_util::as_text(data, size);
  const std::string first(input.substr(0, std::min(input.find('\0'), input.size())));
  check_hostlist(first);
  check_numbers(first);
  check_env(input);
  return 0;
}
