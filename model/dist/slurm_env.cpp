// Parsing and checking Slurm's variables and host lists (see slurm_env.h).
#include "model/dist/slurm_env.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace pipeline::dist {
namespace {

const char* kSrunHint = " (srun sets it for each task: launch with srun --ntasks=N build/tools/pipeline run CONFIG)";

// One bracket group's numbers: [lo, hi] each, printed with at least `width` digits.
struct Range {
  uint64_t lo = 0, hi = 0;
  size_t width = 0;
};

// A name of a host list: literal text and bracket groups, in order (a group's text is empty).
struct Segment {
  std::string text;
  std::vector<Range> group;
  uint64_t count() const {  // (numbers have at most 18 digits: no sum here overflows)
    uint64_t n = 0;
    for (const auto& r : group) n = std::min<uint64_t>(n + (r.hi - r.lo + 1), uint64_t{1} << 62);
    return group.empty() ? 1 : n;
  }
};
using Pattern = std::vector<Segment>;

[[noreturn]] void bad(size_t at, const std::string& what) {
  throw std::invalid_argument("at byte " + std::to_string(at) + ": " + what);
}

uint64_t number(const std::string& s, size_t at, size_t end) {
  if (at == end) bad(at, "a number was expected");
  if (end - at > 18) bad(at, "\"" + s.substr(at, end - at) + "\" has more digits than a host number has");
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data() + at, s.data() + end, v);
  if (ec != std::errc() || p != s.data() + end) bad(at, "\"" + s.substr(at, end - at) + "\" is not a number");
  return v;
}

// The group that starts after the '[' at `open`; returns the offset past its ']'.
size_t parse_group(const std::string& s, size_t open, std::vector<Range>& out) {
  const size_t close = s.find_first_of("[]", open + 1);
  if (close == std::string::npos || s[close] != ']') bad(open, "'[' is not closed by ']'");
  for (size_t at = open + 1;;) {
    size_t end = s.find(',', at);
    if (end == std::string::npos || end > close) end = close;
    const size_t dash = s.find('-', at);
    Range r;
    if (dash != std::string::npos && dash < end) {
      r.lo = number(s, at, dash);
      r.hi = number(s, dash + 1, end);
      if (r.hi < r.lo) bad(at, "the range " + s.substr(at, end - at) + " runs backwards");
    } else {
      r.lo = r.hi = number(s, at, end);
    }
    r.width = (dash != std::string::npos && dash < end ? dash : end) - at;
    out.push_back(r);
    if (end == close) return close + 1;
    at = end + 1;
  }
}

// Every name of the list, unexpanded; empty names (",,") are skipped, as Slurm does.
std::vector<Pattern> parse(const std::string& s) {
  std::vector<Pattern> out;
  Pattern cur;
  bool named = false;  // the current name has something in it
  for (size_t at = 0; at < s.size();) {
    const char c = s[at];
    if (c == ',') {
      if (named) out.push_back(std::move(cur));
      cur.clear();
      named = false;
      ++at;
    } else if (c == '[') {
      Segment g;
      at = parse_group(s, at, g.group);
      cur.push_back(std::move(g));
      named = true;
    } else if (c == ']') {
      bad(at, "']' without '['");
    } else if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
      bad(at, "a space or control character is not part of a host name");
    } else {
      if (cur.empty() || !cur.back().group.empty()) cur.emplace_back();
      cur.back().text += c;
      named = true;
      ++at;
    }
  }
  if (named) out.push_back(std::move(cur));
  if (out.empty()) throw std::invalid_argument("no host names in it");
  return out;
}

std::string padded(uint64_t v, size_t width) {
  std::string n = std::to_string(v);
  return n.size() < width ? std::string(width - n.size(), '0') + n : n;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list, size_t max_hosts) {
  const auto patterns = parse(list);
  uint64_t total = 0;
  for (const auto& p : patterns) {
    uint64_t n = 1;
    for (const auto& seg : p) {
      const uint64_t c = seg.count();
      n = c != 0 && n > max_hosts / c ? max_hosts + 1 : n * c;
    }
    total += std::min<uint64_t>(n, max_hosts + 1);
    if (total > max_hosts)
      throw std::invalid_argument("it names more than " + std::to_string(max_hosts) + " hosts");
  }
  std::vector<std::string> out;
  out.reserve(total);
  for (const auto& p : patterns) {
    std::vector<std::string> names{""};
    for (const auto& seg : p) {
      if (seg.group.empty()) {
        for (auto& n : names) n += seg.text;
        continue;
      }
      std::vector<std::string> next;  // the first group outermost, as Slurm orders them
      for (const auto& n : names)
        for (const auto& r : seg.group)
          for (uint64_t v = r.lo;; ++v) {
            next.push_back(n + padded(v, r.width));
            if (v == r.hi) break;
          }
      names = std::move(next);
    }
    out.insert(out.end(), names.begin(), names.end());
  }
  return out;
}

std::vector<int> expand_tasks_per_node(const std::string& s) {
  std::vector<int> out;
  for (size_t at = 0; at <= s.size();) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(at, end - at);
    // "N" or "N(xK)": N tasks on each of K nodes
    const size_t paren = item.find('(');
    const std::string n_text = item.substr(0, paren);
    uint64_t repeat = 1;
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')')
        bad(at + paren, "expected (xK) after the number of tasks, got \"" + item.substr(paren) + "\"");
      repeat = number(s, at + paren + 2, end - 1);
      if (repeat == 0) bad(at + paren + 2, "a repeat count of 0");
    }
    const uint64_t n = number(s, at, at + n_text.size());
    if (n > (1 << 20) || repeat > (1 << 20) || out.size() + repeat > (1 << 20))
      bad(at, "more tasks or nodes than any job has");
    out.insert(out.end(), repeat, static_cast<int>(n));
    at = end + 1;
  }
  return out;
}

uint16_t port_of_job(uint64_t job_id) { return static_cast<uint16_t>(15000 + job_id % 10000); }

uint16_t first_reserved_port(const std::string& ports) {
  const size_t end = std::min(ports.find_first_of("-,"), ports.size());
  const uint64_t port = number(ports, 0, end);
  if (port < 1 || port > 65535) bad(0, "port " + std::to_string(port) + " is not from 1 to 65535");
  return static_cast<uint16_t>(port);
}

std::string SlurmJob::str() const {
  return "slurm job " + id + (array.empty() ? "" : " (array task " + array + ")") + " (restart " +
         std::to_string(restart_count) + ")";
}

std::optional<SlurmJob> slurm_job(const EnvLookup& get) {
  auto id = get("SLURM_JOB_ID");
  if (!id || id->empty()) return std::nullopt;
  SlurmJob j;
  j.id = *id;
  j.restart_count = static_cast<int>(detail::int_env(get, "SLURM_RESTART_COUNT", 0, 1 << 30, "").value_or(0));
  auto array_job = get("SLURM_ARRAY_JOB_ID"), array_task = get("SLURM_ARRAY_TASK_ID");
  if (array_job && array_task) j.array = *array_job + "_" + *array_task;
  return j;
}

std::optional<LaunchEnv> slurm_launch_env(const EnvLookup& get, uint16_t config_port) {
  auto int_env = [&](const char* name, int64_t lo, int64_t hi) { return detail::int_env(get, name, lo, hi, kSrunHint); };
  const auto procid_raw = get("SLURM_PROCID");
  const auto ntasks = int_env("SLURM_NTASKS", 1, 1 << 20);
  if (!procid_raw && !ntasks) return std::nullopt;
  if (!ntasks)
    throw LaunchError("SLURM_PROCID is \"" + *procid_raw + "\" but SLURM_NTASKS is not set: a task of a Slurm job " +
                      "step has both" + kSrunHint);
  if (*ntasks == 1) return std::nullopt;  // srun with one task (or a batch script of one): a plain run
  const std::string n = std::to_string(*ntasks);
  if (!procid_raw)
    throw LaunchError("SLURM_NTASKS is " + n + " but SLURM_PROCID is not set: each of the " + n +
                      " ranks needs its number. Start them with srun (one task per rank), or unset SLURM_NTASKS to "
                      "train as one process");
  if (!get("SLURM_STEP_ID") && !get("SLURM_STEPID"))
    throw LaunchError("SLURM_NTASKS is " + n + " but SLURM_STEP_ID is not set: this is the job's batch script (or "
                      "salloc's shell), not one of the tasks srun starts. Start the ranks with srun: srun "
                      "build/tools/pipeline run CONFIG (one task per GPU); or ask Slurm for one task (--ntasks=1) to "
                      "train as one process");
  LaunchEnv e;
  e.slurm = true;
  e.world_size = static_cast<int>(*ntasks);
  e.rank = static_cast<int>(*int_env("SLURM_PROCID", 0, 1 << 20));
  if (e.rank >= e.world_size)
    throw LaunchError("SLURM_PROCID is " + std::to_string(e.rank) + " but SLURM_NTASKS is " + n +
                      ": tasks are numbered 0 to SLURM_NTASKS - 1");
  const auto local = int_env("SLURM_LOCALID", 0, 1 << 20);
  if (!local) throw LaunchError(std::string("SLURM_LOCALID is not set: it picks this rank's GPU") + kSrunHint);
  e.local_rank = static_cast<int>(*local);

  // The step's nodes: the store listens on the first. (The job's, when the step's are not given.)
  std::string list_var, list;
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (auto v = get(name); v && !v->empty()) {
      list_var = name;
      list = *v;
      break;
    }
  auto list_error = [&](const std::exception& x) {
    return LaunchError(list_var + " is \"" + list + "\": not a Slurm host list (" + x.what() +
                       "); expected names like n[1-3,7],gpu-a[01-02]");
  };
  std::vector<std::string> nodes;
  if (!list.empty()) {
    try {
      nodes = expand_hostlist(list);
    } catch (const std::invalid_argument& x) {
      throw list_error(x);
    }
  }

  // This task's node: its place in the step's list.
  std::optional<int64_t> node;
  if (auto me = get("SLURMD_NODENAME"); me && !nodes.empty()) {
    auto at = std::find(nodes.begin(), nodes.end(), *me);
    if (at != nodes.end()) node = at - nodes.begin();
  }
  if (!node) node = int_env("SLURM_NODEID", 0, 1 << 20);

  // Tasks on this node, for the local world size: the step's count at this node's place in the list.
  e.local_world_size = e.local_rank + 1;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    auto v = get(name);
    if (!v || v->empty()) continue;
    std::vector<int> per_node;
    try {
      per_node = expand_tasks_per_node(*v);
    } catch (const std::invalid_argument& x) {
      throw LaunchError(std::string(name) + " is \"" + *v + "\": expected counts like 2(x3),1 (" + x.what() + ")");
    }
    if (node && *node < static_cast<int64_t>(per_node.size())) e.local_world_size = per_node[*node];
    break;
  }
  if (e.local_rank >= e.local_world_size)
    throw LaunchError("SLURM_LOCALID is " + std::to_string(e.local_rank) + " but this node runs " +
                      std::to_string(e.local_world_size) + " of the step's tasks (SLURM_STEP_TASKS_PER_NODE)");

  if (auto addr = get("MASTER_ADDR"); addr && !addr->empty()) {
    e.master_addr = *addr;
    e.addr_from = "MASTER_ADDR";
    e.hosts_store = e.rank == 0;  // env://'s rule: MASTER_ADDR is rank 0's
  } else if (!list.empty()) {
    // The first node's first task hosts it, whatever rank the distribution gave that task (rank 0
    // when the node is not known: srun always says).
    e.master_addr = nodes.front();
    e.addr_from = "the first node of " + list_var + " (" + list + ")";
    e.hosts_store = node ? *node == 0 && e.local_rank == 0 : e.rank == 0;
  } else {
    throw LaunchError("SLURM_JOB_NODELIST is not set: the store listens on the first of the step's nodes, and "
                      "srun names them in SLURM_STEP_NODELIST and SLURM_JOB_NODELIST; export MASTER_ADDR to name "
                      "the host yourself");
  }
  if (config_port != 0) {
    e.master_port = config_port;
    e.port_from = "[run] master_port";
  } else if (auto port = detail::int_env(get, "MASTER_PORT", 1, 65535, "")) {
    e.master_port = static_cast<uint16_t>(*port);
    e.port_from = "MASTER_PORT";
  } else if (auto reserved = get("SLURM_STEP_RESV_PORTS"); reserved && !reserved->empty()) {
    try {
      e.master_port = first_reserved_port(*reserved);
    } catch (const std::invalid_argument& x) {
      throw LaunchError("SLURM_STEP_RESV_PORTS is \"" + *reserved + "\": expected ports like 20001-20002 (" + x.what() +
                        ")");
    }
    e.port_from = "SLURM_STEP_RESV_PORTS";
  } else {
    const auto job = detail::int_env(get, "SLURM_JOB_ID", 0, INT64_MAX, " (set [run] master_port to choose the port)");
    if (!job)
      throw LaunchError("SLURM_JOB_ID is not set: the store's port is derived from it (15000 + its last four "
                        "digits); set [run] master_port or export MASTER_PORT");
    e.master_port = port_of_job(static_cast<uint64_t>(*job));
    e.port_from = "SLURM_JOB_ID";
  }
  e.restart_count = static_cast<int>(int_env("SLURM_RESTART_COUNT", 0, 1 << 30).value_or(0));
  return e;
}

}  // namespace pipeline::dist
