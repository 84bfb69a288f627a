// A rank's launch environment under Slurm, torch-free (label unit): Slurm's compressed host lists
// and tasks per node, expanded as `scontrol show hostnames` expands them (the expected lists were
// taken from Slurm 22.05's scontrol); srun's variables read into a rank, torchrun's winning over
// them; the job id and restart count; every bad value named by its variable.
#include <doctest/doctest.h>

#include "model/dist/dist_env.h"
#include "model/dist/slurm_env.h"
#include "test_util.h"

using namespace pipeline;
using test_util::contains;
using test_util::env_of;
using test_util::error_of;
using Names = std::vector<std::string>;

TEST_CASE("host lists expand as Slurm expands them") {
  CHECK(dist::expand_hostlist("n[1-3,7],gpu-a[01-02]") == Names{"n1", "n2", "n3", "n7", "gpu-a01", "gpu-a02"});
  CHECK(dist::expand_hostlist("node") == Names{"node"});
  CHECK(dist::expand_hostlist("x1,x2") == Names{"x1", "x2"});
  // Zero padding: the width of a range's first number.
  CHECK(dist::expand_hostlist("n[009-011]") == Names{"n009", "n010", "n011"});
  CHECK(dist::expand_hostlist("n[01-3]") == Names{"n01", "n02", "n03"});
  CHECK(dist::expand_hostlist("n[1-003]") == Names{"n1", "n2", "n3"});
  CHECK(dist::expand_hostlist("n[9-11]") == Names{"n9", "n10", "n11"});
  // Several bracket groups: every combination, the first group outermost.
  CHECK(dist::expand_hostlist("a[1-2]b[3-4]") == Names{"a1b3", "a1b4", "a2b3", "a2b4"});
  CHECK(dist::expand_hostlist("rack[0-1]_blade[08-10]") ==
        Names{"rack0_blade08", "rack0_blade09", "rack0_blade10", "rack1_blade08", "rack1_blade09", "rack1_blade10"});
  CHECK(dist::expand_hostlist("n[1-2][3-4]") == Names{"n13", "n14", "n23", "n24"});
  CHECK(dist::expand_hostlist("n[1-3,5-6]x[1,2]").size() == 10);
  // Commas inside brackets are the group's; empty names between commas are skipped.
  CHECK(dist::expand_hostlist("n[1-2],,m[5],") == Names{"n1", "n2", "m5"});
  CHECK(dist::expand_hostlist("127.0.0.[1-2]") == Names{"127.0.0.1", "127.0.0.2"});
  // A suffix after the last group (which newer Slurm writes for names like n1-ib).
  CHECK(dist::expand_hostlist("n[1-2]-ib") == Names{"n1-ib", "n2-ib"});
  CHECK(dist::expand_hostlist("gpu-a[07-09,12],n[1-3]").front() == "gpu-a07");
  CHECK(dist::expand_hostlist("a[2-3]b[08-10]").front() == "a2b08");
}

TEST_CASE("a malformed host list is an error that says where and what") {
  auto err = [](const std::string& s) { return error_of([&] { dist::expand_hostlist(s); }); };
  CHECK(contains(err("n[3-1]"), "at byte 2: the range 3-1 runs backwards"));
  CHECK(contains(err("n[1-2"), "at byte 1: '[' is not closed by ']'"));
  CHECK(contains(err("n1]"), "at byte 2: ']' without '['"));
  CHECK(contains(err("n[a-b]"), "\"a\" is not a number"));
  CHECK(contains(err("n[]"), "a number was expected"));
  CHECK(contains(err("n[1,,2]"), "a number was expected"));
  CHECK(contains(err("n[-1]"), "a number was expected"));
  CHECK(contains(err("n[1-[2]]"), "'[' is not closed"));
  CHECK(contains(err("a b"), "at byte 1: a space"));
  CHECK(contains(err(""), "no host names"));
  CHECK(contains(err(","), "no host names"));
  CHECK(contains(err("n[0-99999999999]"), "more than 1048576 hosts"));
  CHECK(contains(err("n[0-9999999999999999999]"), "more digits"));
  CHECK(contains(error_of([] { dist::expand_hostlist("n[1-3],m[1-2]", 4); }), "more than 4 hosts"));
  CHECK(contains(error_of([] { (void)dist::expand_hostlist("n[1-"); }), "not closed"));
  CHECK(contains(error_of([] { (void)dist::expand_hostlist("ok,n[2-1]"); }), "runs backwards"));  // the whole list is checked
}

TEST_CASE("tasks per node expand, and the job id gives a port") {
  CHECK(dist::expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(dist::expand_tasks_per_node("4") == std::vector<int>{4});
  CHECK(dist::expand_tasks_per_node("1(x2)") == std::vector<int>{1, 1});
  CHECK(contains(error_of([] { dist::expand_tasks_per_node("2(3)"); }), "expected (xK)"));
  CHECK(contains(error_of([] { dist::expand_tasks_per_node("2(x0)"); }), "a repeat count of 0"));
  CHECK(contains(error_of([] { dist::expand_tasks_per_node(""); }), "a number was expected"));
  CHECK(contains(error_of([] { dist::expand_tasks_per_node("1,,2"); }), "a number was expected"));
  CHECK(dist::port_of_job(1234567) == 19567);
  CHECK(dist::port_of_job(42) == 15042);
}

namespace {

// What srun sets in task 1 of `srun -N2 -n3` over gpu[01-02] (two tasks on gpu01, one on gpu02).
std::map<std::string, std::string> srun_task() {
  return {{"SLURM_JOB_ID", "1234567"},          {"SLURM_PROCID", "2"},
          {"SLURM_NTASKS", "3"},                {"SLURM_LOCALID", "0"},
          {"SLURM_STEP_ID", "0"},               {"SLURM_STEP_NODELIST", "gpu[01-02]"},
          {"SLURM_JOB_NODELIST", "gpu[01-04]"}, {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
          {"SLURM_TASKS_PER_NODE", "1(x4)"},    {"SLURMD_NODENAME", "gpu02"},
          {"SLURM_NODEID", "1"},                {"SLURM_RESTART_COUNT", "2"}};
}

std::string launch_error(std::map<std::string, std::string> vars, uint16_t port = 0) {
  return error_of([&] { dist::launch_env(env_of(vars), port); });
}

}  // namespace

TEST_CASE("srun's variables make a rank: the store on the step's first node, at a port from the job id") {
  auto e = dist::launch_env(env_of(srun_task()));
  REQUIRE(e);
  CHECK(e->slurm);
  CHECK(!e->torchrun());
  CHECK(!e->agent_store);
  CHECK(!e->hosts_store);  // the first node's first task hosts it; this task runs on gpu02
  CHECK(contains(e->str(), "store at gpu01:19567 (hosted by the first node's first task)"));
  CHECK(e->port_from == "SLURM_JOB_ID");
  CHECK(e->rank == 2);
  CHECK(e->world_size == 3);
  CHECK(e->local_rank == 0);
  CHECK(e->local_world_size == 1);  // gpu02 runs one of the step's tasks
  CHECK(e->master_addr == "gpu01");
  CHECK(contains(e->addr_from, "SLURM_STEP_NODELIST (gpu[01-02])"));
  CHECK(e->master_port == 19567);
  CHECK(e->restart_count == 2);
  // Two tasks on the first node; without SLURMD_NODENAME its place comes from SLURM_NODEID.
  auto v = srun_task();
  v["SLURM_PROCID"] = "1";
  v["SLURM_LOCALID"] = "1";
  v["SLURMD_NODENAME"] = "gpu01";
  CHECK(dist::launch_env(env_of(v))->local_world_size == 2);
  v.erase("SLURMD_NODENAME");
  v["SLURM_NODEID"] = "0";
  CHECK(dist::launch_env(env_of(v))->local_world_size == 2);
  // Without the step's list, the job's.
  v = srun_task();
  v.erase("SLURM_STEP_NODELIST");
  CHECK(dist::launch_env(env_of(v))->master_addr == "gpu01");
  // MASTER_ADDR and MASTER_PORT when exported; [run] master_port before MASTER_PORT.
  v = srun_task();
  v["MASTER_ADDR"] = "10.0.0.7";
  v["MASTER_PORT"] = "29600";
  e = dist::launch_env(env_of(v));
  CHECK(e->master_addr == "10.0.0.7");
  CHECK(e->addr_from == "MASTER_ADDR");
  CHECK(e->master_port == 29600);
  CHECK(dist::launch_env(env_of(v), 29511)->master_port == 29511);
  CHECK(dist::launch_env(env_of(srun_task()), 29511)->master_port == 29511);
}

TEST_CASE("the store's host is the first node's first task, whichever rank the distribution made it") {
  // srun -n2 --distribution=arbitrary with SLURM_HOSTFILE naming gpu02, then gpu01: rank 0 runs on
  // gpu02, the second of the step's nodes (as Slurm 22.05 sets it: the list sorted, SLURM_NODEID 1).
  auto rank0 = srun_task();
  rank0["SLURM_PROCID"] = "0";
  rank0["SLURM_NTASKS"] = "2";
  rank0["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  auto rank1 = rank0;
  rank1["SLURM_PROCID"] = "1";
  rank1["SLURMD_NODENAME"] = "gpu01";
  rank1["SLURM_NODEID"] = "0";
  auto e0 = dist::launch_env(env_of(rank0)), e1 = dist::launch_env(env_of(rank1));
  REQUIRE(e0);
  REQUIRE(e1);
  CHECK(e0->master_addr == "gpu01");
  CHECK(e1->master_addr == "gpu01");
  CHECK(!e0->hosts_store);
  CHECK(e1->hosts_store);
  CHECK(contains(e1->str(), "rank 1 of 2 (local rank 0 of 1), store at gpu01:19567 (hosted here)"));
  // Without SLURMD_NODENAME, the node's place comes from SLURM_NODEID.
  rank1.erase("SLURMD_NODENAME");
  CHECK(dist::launch_env(env_of(rank1))->hosts_store);
  // Only the first task of that node: a second task there is a client.
  auto second = srun_task();
  second["SLURM_PROCID"] = "1";
  second["SLURM_LOCALID"] = "1";
  second["SLURMD_NODENAME"] = "gpu01";
  CHECK(!dist::launch_env(env_of(second))->hosts_store);
  second["SLURM_PROCID"] = "0";
  second["SLURM_LOCALID"] = "0";
  CHECK(dist::launch_env(env_of(second))->hosts_store);
  // MASTER_ADDR exported: env://'s rule, rank 0 hosts it wherever it runs.
  rank0["MASTER_ADDR"] = "10.0.0.7";
  rank1["MASTER_ADDR"] = "10.0.0.7";
  CHECK(dist::launch_env(env_of(rank0))->hosts_store);
  CHECK(!dist::launch_env(env_of(rank1))->hosts_store);
  // torchrun without its agent: rank 0.
  auto t = dist::launch_env(env_of({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  CHECK(t->hosts_store);
}

TEST_CASE("ports Slurm reserved for the step: the store takes the first, before the job id's") {
  CHECK(dist::first_reserved_port("20001-20002") == 20001);
  CHECK(dist::first_reserved_port("20001") == 20001);
  CHECK(dist::first_reserved_port("20001,20005-20006") == 20001);
  CHECK(contains(error_of([] { dist::first_reserved_port(""); }), "a number was expected"));
  CHECK(contains(error_of([] { dist::first_reserved_port("0-2"); }), "port 0 is not from 1 to 65535"));
  // Two jobs whose ids differ by 10,000 derive one port; with ports reserved, each step has its own.
  auto a = srun_task(), b = srun_task();
  b["SLURM_JOB_ID"] = "1244567";
  CHECK(dist::launch_env(env_of(a))->master_port == dist::launch_env(env_of(b))->master_port);
  a["SLURM_STEP_RESV_PORTS"] = "20001-20002";
  b["SLURM_STEP_RESV_PORTS"] = "20003-20004";
  auto ea = dist::launch_env(env_of(a)), eb = dist::launch_env(env_of(b));
  CHECK(ea->master_port == 20001);
  CHECK(eb->master_port == 20003);
  CHECK(ea->port_from == "SLURM_STEP_RESV_PORTS");
  // [run] master_port and MASTER_PORT still come first.
  CHECK(dist::launch_env(env_of(a), 29511)->master_port == 29511);
  a["MASTER_PORT"] = "29600";
  CHECK(dist::launch_env(env_of(a))->master_port == 29600);
}

TEST_CASE("torchrun's variables win over srun's; srun with one task is a plain run") {
  auto v = srun_task();  // srun ... torchrun: each worker has both
  for (auto [k, val] : std::map<std::string, std::string>{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                          {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "gpu01"},
                                                          {"MASTER_PORT", "29400"}, {"TORCHELASTIC_RUN_ID", "r"}})
    v[k] = val;
  auto e = dist::launch_env(env_of(v));
  REQUIRE(e);
  CHECK(e->torchrun());
  CHECK(!e->slurm);
  CHECK(e->rank == 5);
  CHECK(e->world_size == 8);
  // One task, in a step or in a batch script of one task: no ranks.
  v = srun_task();
  v["SLURM_NTASKS"] = "1";
  v["SLURM_PROCID"] = "0";
  CHECK(!dist::launch_env(env_of(v)));
  v.erase("SLURM_STEP_ID");
  CHECK(!dist::launch_env(env_of(v)));
  CHECK(!dist::launch_env(env_of({{"SLURM_JOB_ID", "5"}, {"SLURM_JOB_NODELIST", "n1"}})));
}

TEST_CASE("bad Slurm variables are errors naming the variable") {
  auto without = [](const char* key) {
    auto v = srun_task();
    v.erase(key);
    return launch_error(v);
  };
  auto with = [](const char* key, const std::string& value) {
    auto v = srun_task();
    v[key] = value;
    return launch_error(v);
  };
  CHECK(contains(without("SLURM_PROCID"), "SLURM_NTASKS is 3 but SLURM_PROCID is not set"));
  CHECK(contains(without("SLURM_NTASKS"), "SLURM_PROCID is \"2\" but SLURM_NTASKS is not set"));
  CHECK(contains(with("SLURM_STEP_NODELIST", "gpu[02-01]"),
                 "SLURM_STEP_NODELIST is \"gpu[02-01]\": not a Slurm host list (at byte 4: the range 02-01 runs "
                 "backwards); expected names like n[1-3,7],gpu-a[01-02]"));
  {
    auto v = srun_task();
    v.erase("SLURM_STEP_NODELIST");
    v["SLURM_JOB_NODELIST"] = "gpu[01-";
    CHECK(contains(launch_error(v), "SLURM_JOB_NODELIST is \"gpu[01-\": not a Slurm host list"));
    v.erase("SLURM_JOB_NODELIST");
    CHECK(contains(launch_error(v), "SLURM_JOB_NODELIST is not set: the store listens on the first"));
  }
  CHECK(contains(with("SLURM_PROCID", "3"), "SLURM_PROCID is 3 but SLURM_NTASKS is 3"));
  CHECK(contains(with("SLURM_PROCID", "two"), "SLURM_PROCID is \"two\": expected an integer"));
  CHECK(contains(with("SLURM_NTASKS", "-1"), "SLURM_NTASKS is \"-1\": expected an integer from 1"));
  CHECK(contains(without("SLURM_LOCALID"), "SLURM_LOCALID is not set"));
  CHECK(contains(with("SLURM_LOCALID", "1"), "SLURM_LOCALID is 1 but this node runs 1 of the step's tasks"));
  CHECK(contains(with("SLURM_STEP_TASKS_PER_NODE", "2(x"), "SLURM_STEP_TASKS_PER_NODE is \"2(x\""));
  CHECK(contains(with("SLURM_RESTART_COUNT", "x"), "SLURM_RESTART_COUNT is \"x\""));
  CHECK(contains(with("MASTER_PORT", "0"), "MASTER_PORT is \"0\""));
  CHECK(contains(with("SLURM_STEP_RESV_PORTS", "x-y"), "SLURM_STEP_RESV_PORTS is \"x-y\": expected ports like "
                                                       "20001-20002 (at byte 0: \"x\" is not a number)"));
  CHECK(contains(with("SLURM_STEP_RESV_PORTS", "70000"), "SLURM_STEP_RESV_PORTS is \"70000\""));
  CHECK(contains(without("SLURM_JOB_ID"), "SLURM_JOB_ID is not set: the store's port is derived from it"));
  CHECK(contains(with("SLURM_JOB_ID", "12x"), "SLURM_JOB_ID is \"12x\""));
  // The job's batch script (or salloc's shell) has SLURM_NTASKS and SLURM_PROCID, but is no task of a step.
  CHECK(contains(without("SLURM_STEP_ID"), "SLURM_NTASKS is 3 but SLURM_STEP_ID is not set: this is the job's batch "
                                           "script (or salloc's shell), not one of the tasks srun starts"));
}

TEST_CASE("the job: its id, restarts and array task, for the run log") {
  CHECK(!dist::slurm_job(env_of({})));
  auto j = dist::slurm_job(env_of(srun_task()));
  REQUIRE(j);
  CHECK(j->id == "1234567");
  CHECK(j->restart_count == 2);
  CHECK(j->str() == "slurm job 1234567 (restart 2)");
  j = dist::slurm_job(env_of({{"SLURM_JOB_ID", "9"}, {"SLURM_ARRAY_JOB_ID", "8"}, {"SLURM_ARRAY_TASK_ID", "1"}}));
  CHECK(j->restart_count == 0);
  CHECK(j->str() == "slurm job 9 (array task 8_1) (restart 0)");
  CHECK(contains(error_of([] { dist::slurm_job(env_of({{"SLURM_JOB_ID", "9"}, {"SLURM_RESTART_COUNT", "-2"}})); }),
                 "SLURM_RESTART_COUNT is \"-2\""));
}
