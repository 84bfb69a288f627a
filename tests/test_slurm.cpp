// Slurm as clusters run it (labels e2e, slurm): a real two-node Slurm on this machine
// (tests/slurm/cluster.sh: munged, slurmctld, two slurmd), `pipeline run` started by srun and by
// the batch script users copy (tools/slurm/train.sbatch), two CPU ranks on Gloo, the tiny model.
//   - srun -N2 -n2: the two ranks train what torchrun's two train, step by step (losses, tokens),
//     the store on a port Slurm reserved for the step; so do they under --distribution=arbitrary
//     with rank 0 on the second node (the first node's first task hosts the store); a batch
//     script of two tasks that runs pipeline without srun is refused, naming SLURM_STEP_ID.
//   - sbatch of the template with a 1-minute limit on a run that needs 2: SIGUSR1, a checkpoint,
//     `scontrol requeue`, again, until COMPLETED after 2 requeues or more; every step trained once,
//     and the losses, tokens and final weights of the run that was never interrupted.
//   - a program that starts later than the warning: stopped before its first step, not requeued
//     (it would come back forever).
//   - scancel mid-run: the job ends CANCELLED, not requeued, with one checkpoint, at the last step.
//   - preemption by a job of a higher-priority partition: Slurm requeues the run, it resumes from
//     its checkpoint and completes with the uninterrupted run's losses and weights.
//   - a bad SLURM_JOB_NODELIST, SLURM_NTASKS without SLURM_PROCID: errors naming the variable,
//     before any run directory is made (no cluster needed).
//   - the batch script under stand-ins for srun, scancel, squeue, scontrol and date (no cluster
//     needed): the races a cluster cannot be made to hit on cue.
// Each case starts a cluster of its own and stops it after, whatever happens (cluster.sh's
// watchdog ends it with this process). Exits 77 (CTest: skipped), saying why, where Slurm or
// torchrun is absent or Slurm cannot run (not root).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "base/json.h"
#include "model/checkpoint/checkpoint.h"
#include "dist_harness.h"
#include "test_util.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

using namespace train_harness;
using namespace dist_harness;
using test_util::contains;

namespace {

using Clock = std::chrono::steady_clock;
const std::string kSource = PIPELINE_SOURCE_DIR;
const std::string kExe = PIPELINE_EXE;
const std::string kTemplate = kSource + "/tools/slurm/train.sbatch";

[[noreturn]] void skip(const std::string& why) {
  std::fprintf(stderr, "test_slurm: %s: skipped\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(77);
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A two-node cluster for one test case: started in `dir`, stopped when this goes.
class Cluster {
 public:
  explicit Cluster(const fs::path& dir) : dir_(dir / "slurm") {
    auto r = test_util::shell(kSource + "/tests/slurm/cluster.sh start " + quote(dir_.string()) + " " +
                              std::to_string(::getpid()));
    if (r.code == 77) skip(r.out.substr(0, r.out.find_last_not_of('\n') + 1));
    if (r.code != 0) throw std::runtime_error("the test cluster did not start:\n" + r.out);
  }
  ~Cluster() { test_util::shell(kSource + "/tests/slurm/cluster.sh stop " + quote(dir_.string())); }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  /// `command` with the cluster's client settings, in the source tree.
  test_util::ShellResult sh(const std::string& command) const {
    return test_util::shell(". " + quote((dir_ / "env.sh").string()) + " && cd " + quote(kSource) + " && " + command);
  }
  /// Submits a batch job; its id.
  std::string sbatch(const std::string& args) const {
    auto r = sh("sbatch --parsable " + args);
    INFO(r.out);
    REQUIRE(r.code == 0);
    return r.out.substr(0, r.out.find_first_of(";\n"));
  }
  /// One field of `scontrol show job` ("JobState", "Restarts").
  std::string job(const std::string& id, const std::string& field) const {
    const auto out = sh("scontrol show job --oneliner " + id).out;
    const auto at = out.find(" " + field + "=");
    if (at == std::string::npos) return "";
    const auto start = at + field.size() + 2;
    return out.substr(start, out.find_first_of(" \n", start) - start);
  }
  /// Waits until the job has ended for good; its state (COMPLETED, CANCELLED, ...), or "" when
  /// `limit` passed first.
  std::string wait_job(const std::string& id, std::chrono::seconds limit) const {
    static const std::set<std::string> ended = {"COMPLETED", "CANCELLED", "FAILED",   "TIMEOUT", "NODE_FAIL",
                                                "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"};
    for (const auto deadline = Clock::now() + limit; Clock::now() < deadline;) {
      const auto state = job(id, "JobState");
      if (ended.count(state)) return state;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return "";
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

// The tiny model on the letters (a batch is one document), one intra-op thread a rank, each
// rank's batches recorded; pack -> rec -> slow (a delay of --set stages.slow.ms) -> h2d; a
// checkpoint only when the run stops or ends.
fs::path write_config(const fs::path& root, const std::string& name, const fs::path& data) {
  auto cfg = root / (name + ".toml");
  std::ofstream(cfg) << tiny_config(root / name, kTextInput, data.string()) +
                            "[stages.rec]\ntype = \"record_batches\"\ninput = \"pack\"\n"
                            "[stages.slow]\ntype = \"delay\"\ninput = \"rec\"\nms = 0\n";
  return cfg;
}

std::string sets(int steps, int delay_ms, const std::vector<std::string>& more = {}) {
  std::string out;
  std::vector<std::string> all = {"training.steps=" + std::to_string(steps), "run.threads=1", "checkpoint.every=0",
                                  "checkpoint.keep=2", "logging.every=10", "stages.h2d.input=\"slow\"",
                                  "stages.slow.ms=" + std::to_string(delay_ms), "run.dist_timeout_s=120",
                                  "run.dist_heartbeat_s=20"};
  all.insert(all.end(), more.begin(), more.end());
  for (const auto& s : all) out += " --set " + quote(s);
  return out;
}

// One case on a cluster of its own: its scratch directory, the cluster, the letters, and the run
// it submits with the template (its config, its run directory, the job's output file).
struct Case {
  fs::path root;
  Cluster c;
  fs::path data, cfg, run_dir, out;
  explicit Case(const std::string& tag)
      : root(temp_dir(tag)), c(root), data(make_letters_dataset(root)), cfg(write_config(root, "run", data)),
        run_dir(root / "run"), out(root / "run.out") {}

  /// Submits the template: 2 nodes, one rank each, no GPUs, `time` and `extra` given here
  /// (sbatch's command line wins over the script's #SBATCH lines), `steps` of `delay_ms` at least,
  /// the store on the port Slurm reserves for the step. The job's id.
  std::string submit(const std::string& time, const std::string& extra, int steps, int delay_ms,
                     const std::string& program = kExe) const {
    return c.sbatch("--nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --gpus-per-node=0 --time=" + time +
                    " --output=" + quote(out.string()) + " --export=ALL,PIPELINE_PROGRAM=" + quote(program) +
                    ",PIPELINE_CONFIG=" + quote(cfg.string()) + ",PIPELINE_RUN_DIR=" + quote(run_dir.string()) + " " +
                    extra + " " + quote(kTemplate) + sets(steps, delay_ms));
  }
};

// metrics.jsonl's lines: every step's number, in the order logged, and the allocations' start lines.
struct Metrics {
  std::vector<int64_t> steps;
  std::vector<JsonValue> starts;  // {"slurm_job_id", "slurm_restart_count", "start_step", "ranks"}
};

Metrics read_metrics(const fs::path& run_dir) {
  Metrics m;
  std::istringstream lines(test_util::read_file(run_dir / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    auto v = json_parse(line);
    if (v.find("slurm_job_id"))
      m.starts.push_back(v);
    else if (v.find("loss"))
      m.steps.push_back(static_cast<int64_t>(v.number("step")));
  }
  return m;
}

// Waits until the run has logged step `step` (true), or `limit` passed.
bool wait_for_step(const fs::path& run_dir, int64_t step, std::chrono::seconds limit) {
  for (const auto deadline = Clock::now() + limit; Clock::now() < deadline;) {
    if (read_losses(run_dir).count(step)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// The same config trained by two ranks without a break, the reference: torchrun's, outside Slurm,
// beside the Slurm job (the srun case shows that srun's two ranks train the same); without
// torchrun, srun's once the job is done and the nodes are free.
class Uninterrupted {
 public:
  Uninterrupted(const Cluster& c, const fs::path& root, const fs::path& data, int steps)
      : c_(c), dir_(root / "ref"), cmd_(" run " + quote(write_config(root, "ref", data).string()) + sets(steps, 0)) {
    const std::string torchrun = PIPELINE_TORCHRUN;
    if (!torchrun.empty() && fs::exists(torchrun))
      run_ = std::async(std::launch::async, [this, torchrun] {
        return test_util::shell(torchrun + " --standalone --nproc-per-node=2 --no-python " + quote(kExe) + cmd_);
      });
  }
  /// The reference's run directory, once it is trained.
  fs::path get() {
    auto r = run_.valid() ? run_.get() : c_.sh("srun --nodes=2 --ntasks=2 --time=5 " + quote(kExe) + cmd_);
    INFO(r.out);
    REQUIRE(r.code == 0);
    return dir_;
  }
  ~Uninterrupted() {
    if (run_.valid()) run_.wait();
  }

 private:
  const Cluster& c_;
  fs::path dir_;
  std::string cmd_;
  std::future<test_util::ShellResult> run_;
};

void check_same_run(const fs::path& got, const fs::path& ref, int steps) {
  auto g = read_losses(got), r = read_losses(ref);
  REQUIRE(r.size() == static_cast<size_t>(steps));
  for (int s = 1; s <= steps; ++s) CHECK_MESSAGE(g[s] == r[s], "step " << s);
  for (const char* f : {"batches.rank0.u16", "batches.rank1.u16"})  // the same tokens, none twice
    CHECK_MESSAGE(read_u16(got / f) == read_u16(ref / f), f);
  CHECK(same_weights(final_checkpoint(got), final_checkpoint(ref)));
}

}  // namespace

TEST_CASE("bad Slurm variables: the error names the variable, and nothing is made") {
  auto root = temp_dir("slurm_env");
  auto data = make_letters_dataset(root, 8);
  auto cfg = write_config(root, "bad", data);
  auto run = [&](const std::string& env) {
    return test_util::shell("env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE " + env + " " + quote(kExe) +
                            " run " + quote(cfg.string()) + sets(2, 0));
  };
  const std::string task = "SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_LOCALID=0 ";
  auto r = run(task + "SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_JOB_NODELIST='n[1-2' SLURM_STEP_NODELIST=");
  CHECK(r.code == 1);
  CHECK(contains(r.out, "SLURM_JOB_NODELIST is \"n[1-2\": not a Slurm host list (at byte 1: '[' is not closed by ']')"));
  r = run(task + "SLURM_NTASKS=2 SLURM_JOB_NODELIST='n[1-2]'");
  CHECK(r.code == 1);
  CHECK(contains(r.out, "SLURM_NTASKS is 2 but SLURM_PROCID is not set"));
  r = run(task + "SLURM_NTASKS=2 SLURM_PROCID=2 SLURM_JOB_NODELIST='n[1-2]'");
  CHECK(r.code == 1);
  CHECK(contains(r.out, "SLURM_PROCID is 2 but SLURM_NTASKS is 2"));
  INFO(r.out);
  CHECK(!fs::exists(root / "bad"));  // refused before a run directory was made
  // One task: a plain run, as without Slurm (its job named in the run log).
  r = run("SLURM_JOB_ID=77 SLURM_NTASKS=1 SLURM_PROCID=0 SLURM_RESTART_COUNT=3");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(contains(test_util::read_file(root / "bad" / "run.log"), "slurm job 77 (restart 3): one process; starts the run"));
}

namespace {

// The batch script under stand-ins for Slurm's commands, for its races that a real cluster
// cannot be made to hit on cue (no cluster needed):
//   srun      the ranks: registers its step FAKE_STEP_DELAY s after it starts, runs
//             FAKE_RUN_SECONDS and exits FAKE_EXIT; on SIGTERM writes a new checkpoint (unless
//             FAKE_ON_TERM=none) and exits 143. FAKE_USR1=srun: sends the script SIGUSR1 as it
//             starts; srun_exit: that, then exits FAKE_EXIT at once.
//   scancel   SIGTERM to the ranks when their step exists; otherwise the signal is lost, as Slurm
//             loses it for a job without steps.
//   squeue    the steps that exist; scontrol: records what it is asked.
//   date      FAKE_USR1=start: sends the script SIGUSR1 at its first line (before srun).
struct FakeSlurm {
  fs::path dir, run_dir;
  explicit FakeSlurm(const std::string& tag) : dir(temp_dir(tag)), run_dir(dir / "run") {
    fs::create_directories(dir / "bin");
    fs::create_directories(run_dir / "checkpoints");
    put("srun", R"SH(echo $$ > "$FAKE/srun.pid"
case ${FAKE_USR1:-} in
  srun) kill -USR1 "$(cat "$FAKE/script.pid")" ;;
  srun_exit) kill -USR1 "$(cat "$FAKE/script.pid")"; exit "${FAKE_EXIT:-0}" ;;
esac
stop() {
  [[ ${FAKE_ON_TERM:-} == none ]] || touch "$PIPELINE_RUN_DIR/checkpoints/step_00000099.ckpt"
  exit 143
}
trap stop TERM
sleep "${FAKE_STEP_DELAY:-0}"
touch "$FAKE/step"
end=$((SECONDS + ${FAKE_RUN_SECONDS:-30}))
while ((SECONDS < end)); do sleep 0.1; done
exit "${FAKE_EXIT:-0}")SH");
    put("scancel", R"SH(echo "$*" >> "$FAKE/scancel.log"
if [[ -e $FAKE/step ]]; then kill -TERM "$(cat "$FAKE/srun.pid")"; fi)SH");
    put("squeue", R"SH(if [[ -e $FAKE/step ]]; then echo "$SLURM_JOB_ID.0"; fi
echo "$SLURM_JOB_ID.batch")SH");
    put("scontrol", R"SH(echo "$*" >> "$FAKE/scontrol.log")SH");
    put("date", R"SH(if [[ ${FAKE_USR1:-} == start && ! -e $FAKE/usr1.sent ]]; then
  touch "$FAKE/usr1.sent"
  kill -USR1 "$(cat "$FAKE/script.pid")"
fi
exec /bin/date "$@")SH");
  }
  void put(const std::string& name, const std::string& body) const {
    std::ofstream(dir / "bin" / name) << "#!/bin/bash\n# A stand-in for Slurm's " << name << " (test_slurm.cpp).\n"
                                      << body << "\n";
    fs::permissions(dir / "bin" / name, fs::perms::owner_all);
  }
  /// The script, run as the batch script with `vars` (FAKE_...) set; its status and output.
  test_util::ShellResult run(const std::string& vars) const {
    return test_util::shell("env PATH=" + quote((dir / "bin").string()) + ":\"$PATH\" FAKE=" + quote(dir.string()) +
                            " SLURM_JOB_ID=4242 SLURM_JOB_NAME=pipeline SLURM_JOB_NODELIST=n1 PIPELINE_RUN_DIR=" +
                            quote(run_dir.string()) + " SCRIPT=" + quote(kTemplate) + " " + vars +
                            " bash -c 'echo $$ > \"$FAKE/script.pid\"; exec bash \"$SCRIPT\"'");
  }
  std::string file(const std::string& name) const {
    return fs::exists(dir / name) ? test_util::read_file(dir / name) : std::string();
  }
};

}  // namespace

TEST_CASE("the batch script's logic: a warning before srun's step, or before srun, and srun's own status") {
  {  // SIGUSR1 before srun's step exists: the SIGTERM waits for the step, then the requeue.
    FakeSlurm f("sbatch_early_step");
    auto r = f.run("FAKE_USR1=srun FAKE_STEP_DELAY=2 FAKE_RUN_SECONDS=20");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(f.file("scancel.log") == "--signal=TERM 4242\n");  // once, when the step existed
    CHECK(f.file("scontrol.log") == "requeue 4242\n");
    CHECK(contains(r.out, "requeued: the job continues from the checkpoint"));
  }
  {  // SIGUSR1 before srun started: no srun, no requeue, a status that fails the job.
    FakeSlurm f("sbatch_before_srun");
    auto r = f.run("FAKE_USR1=start");
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK(!fs::exists(f.dir / "srun.pid"));
    CHECK(f.file("scontrol.log").empty());
    CHECK(contains(r.out, "the time-limit warning came before the run started: no requeue, since the next "
                          "allocation would do the same"));
  }
  {  // Stopped, but no newer checkpoint: no requeue (it would come back forever).
    FakeSlurm f("sbatch_no_step");
    std::ofstream(f.run_dir / "checkpoints" / "step_00000050.ckpt") << "x";
    auto r = f.run("FAKE_USR1=srun FAKE_ON_TERM=none");
    INFO(r.out);
    CHECK(r.code == 143);
    CHECK(f.file("scancel.log") == "--signal=TERM 4242\n");
    CHECK(f.file("scontrol.log").empty());
    CHECK(contains(r.out, "this allocation trained no step (the newest checkpoint is still step_00000050.ckpt): no "
                          "requeue"));
  }
  // srun fails as the warning comes: its status, never the 138 of the signal that cut the wait
  // (nor the -1 of bash 5.2's wait, which loses it now and then: 1 time in 20 to 30 here).
  for (int i = 0; i < 10; ++i) {
    FakeSlurm f("sbatch_status_" + std::to_string(i));
    auto r = f.run("FAKE_USR1=srun_exit FAKE_EXIT=7");
    INFO(r.out);
    CHECK(r.code == 7);
    CHECK(contains(r.out, "the run did not stop with a checkpoint (status 7): no requeue"));
    CHECK(contains(r.out, "the run ended with status 7"));
    CHECK(f.file("scontrol.log").empty());
  }
}

TEST_CASE("srun -N2 -n2 trains what torchrun trains with 2 ranks; a batch script without srun is refused") {
  const std::string torchrun = PIPELINE_TORCHRUN;
  if (torchrun.empty() || !fs::exists(torchrun)) skip("no torchrun (set-up's torch venv) to compare with");
  auto root = temp_dir("slurm_srun");
  Cluster c(root);
  auto data = make_letters_dataset(root);
  constexpr int kSteps = 10;
  // torchrun's two ranks, outside Slurm.
  auto ref_cfg = write_config(root, "torchrun", data);
  auto t = test_util::shell(torchrun + " --standalone --nproc-per-node=2 --no-python " + quote(kExe) + " run " +
                            quote(ref_cfg.string()) + sets(kSteps, 0));
  INFO(t.out);
  REQUIRE(t.code == 0);
  // srun's two tasks, one on each node; the store's address and port come from Slurm.
  auto cfg = write_config(root, "srun", data);
  auto s = c.sh("srun --nodes=2 --ntasks=2 --time=5 " + quote(kExe) + " run " + quote(cfg.string()) + sets(kSteps, 0));
  INFO(s.out);
  REQUIRE(s.code == 0);
  CHECK(contains(s.out, "data parallel: 2 ranks, gloo"));
  CHECK(contains(s.out, "rank 0 of 2 (local rank 0 of 1), store at 127.0.0.1:"));  // the first of 127.0.0.[1-2]
  CHECK(contains(s.out, "(hosted here), ranks from srun; starts the run"));
  check_same_run(root / "srun", root / "torchrun", kSteps);
  // The store's port is the one Slurm reserved for the step (MpiParams=ports), not the job id's.
  const auto reserved = c.sh("srun --nodes=2 --ntasks=2 --time=1 printenv SLURM_STEP_RESV_PORTS");
  REQUIRE(reserved.code == 0);
  const int block = std::stoi(reserved.out.substr(0, reserved.out.find('-')));
  const auto port_at = s.out.find("store at 127.0.0.1:") + std::strlen("store at 127.0.0.1:");
  const int port = std::stoi(s.out.substr(port_at));
  CHECK(port / 100 == block / 100);  // from the cluster's block of 100

  // --distribution=arbitrary, rank 0 on the second node (SLURM_HOSTFILE): the first node's first
  // task, rank 1, hosts the store there, outlives rank 0's last reads, and the run is the same.
  std::ofstream(root / "hosts") << "127.0.0.2\n127.0.0.1\n";
  auto arb_cfg = write_config(root, "arbitrary", data);
  auto a = c.sh("SLURM_HOSTFILE=" + quote((root / "hosts").string()) + " srun --ntasks=2 --distribution=arbitrary "
                "--time=5 " + quote(kExe) + " run " + quote(arb_cfg.string()) + sets(kSteps, 0));
  INFO(a.out);
  REQUIRE(a.code == 0);
  CHECK(contains(a.out, "rank 0 of 2 (local rank 0 of 1), store at 127.0.0.1:"));
  CHECK(contains(a.out, "(hosted by the first node's first task), ranks from srun; starts the run"));
  CHECK(!contains(a.out, "sent no final statistics"));
  check_same_run(root / "arbitrary", root / "torchrun", kSteps);
  // Two tasks asked for, and pipeline run in the batch script itself: refused, naming why.
  auto bad_cfg = write_config(root, "batch", data);
  auto id = c.sbatch("--nodes=2 --ntasks=2 --output=" + quote((root / "batch.out").string()) + " --wrap=" +
                     quote(quote(kExe) + " run " + quote(bad_cfg.string())));
  CHECK(c.wait_job(id, std::chrono::seconds(120)) == "FAILED");
  auto out = test_util::read_file(root / "batch.out");
  INFO(out);
  CHECK(contains(out, "SLURM_NTASKS is 2 but SLURM_STEP_ID is not set: this is the job's batch script"));
  CHECK(!fs::exists(root / "batch"));
}

TEST_CASE("a 1-minute time limit: the run checkpoints, requeues itself and completes, each step once") {
  Case k("slurm_requeue");
  const auto& c = k.c;
  // 240 steps of at least 500 ms: 2 minutes. An allocation trains 55 s at most (the warning comes
  // 5 s before its minute, or up to 30 s sooner), so it takes 3 allocations or more.
  constexpr int kSteps = 240;
  Uninterrupted ref(c, k.root, k.data, kSteps);
  const auto t0 = Clock::now();
  auto id = k.submit("1", "--signal=B:USR1@5", kSteps, 500);
  const auto state = c.wait_job(id, std::chrono::seconds(540));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto log = test_util::read_file(k.out);
  INFO(log);
  REQUIRE(state == "COMPLETED");
  const int restarts = std::stoi(c.job(id, "Restarts"));
  std::printf("requeue: COMPLETED after %d requeues, %.0f s from submission\n", restarts, took);
  CHECK(restarts >= 2);
  // Each allocation but the last: the warning, SIGTERM to the ranks, a checkpoint, one requeue.
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return static_cast<int>(n);
  };
  // The last allocation may get the warning too, when the run is finishing as it comes: the run
  // ends with status 0 (its last step trained) and the script does not requeue it.
  const int warnings = count("SIGUSR1: the time limit is near");
  const bool warned_at_end = contains(log, "the run finished before the time limit: no requeue");
  CHECK(warnings == restarts + (warned_at_end ? 1 : 0));
  CHECK(count("requeued: the job continues from the checkpoint") == restarts);
  CHECK(contains(log, "the run ended with status 0"));
  // metrics.jsonl: every step once, in order; each allocation's line with the job and its restart,
  // starting where the one before stopped (its checkpoint).
  auto m = read_metrics(k.run_dir);
  REQUIRE(m.steps.size() == static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) CHECK_MESSAGE(m.steps[static_cast<size_t>(s)] == s + 1, "line " << s);
  REQUIRE(m.starts.size() == static_cast<size_t>(restarts + 1));
  for (int a = 0; a <= restarts; ++a) {
    const auto& start = m.starts[static_cast<size_t>(a)];
    CHECK(start.string("slurm_job_id") == id);
    CHECK(start.number("slurm_restart_count") == a);
    CHECK(start.number("ranks") == 2);
    if (a > 0) {
      const int64_t from = static_cast<int64_t>(start.number("start_step"));
      CHECK(from > static_cast<int64_t>(m.starts[static_cast<size_t>(a - 1)].number("start_step")));
      char name[64];
      std::snprintf(name, sizeof name, "SIGTERM: stopped at step %lld of %d on all 2 ranks", static_cast<long long>(from), kSteps);
      CHECK_MESSAGE(contains(log, name), name);
      CHECK(contains(log, "slurm job " + id + " (restart " + std::to_string(a) + "): rank 0 of 2"));
    }
  }
  // The run that was requeued is the run that was not: losses, tokens and weights.
  check_same_run(k.run_dir, ref.get(), kSteps);
}

TEST_CASE("a run that starts later than the warning: stopped before its first step, and not requeued") {
  Case k("slurm_late");
  const auto& c = k.c;
  // A program that takes 50 s to start (an image to pull, a slow file system), and the warning
  // at the allocation's start: Slurm sends it at its first look at the clock, within 30 s.
  const auto slow = k.root / "slow_start.sh";
  std::ofstream(slow) << "#!/bin/bash\nsleep 50\nexec " << quote(kExe) << " \"$@\"\n";
  fs::permissions(slow, fs::perms::owner_all);
  auto id = k.submit("1", "--signal=B:USR1@60", 20, 0, slow.string());
  const auto state = c.wait_job(id, std::chrono::seconds(180));
  const auto log = test_util::read_file(k.out);
  INFO(log);
  CHECK(state == "FAILED");  // the script's 143: stopped, and not requeued
  CHECK(c.job(id, "Restarts") == "0");
  CHECK(contains(log, "SIGUSR1: the time limit is near"));
  CHECK(contains(log, "this allocation trained no step (the newest checkpoint is still none): no requeue, since the "
                      "next allocation would do the same"));
  CHECK(!contains(log, "requeued:"));
  CHECK(stages::checkpoints_newest_first(k.run_dir).empty());
}

TEST_CASE("scancel mid-run: one checkpoint at the last step trained, the job cancelled, no requeue") {
  Case k("slurm_scancel");
  const auto& c = k.c;
  const auto &run_dir = k.run_dir, &out = k.out;
  auto id = k.submit("5", "", 200, 300);
  REQUIRE_MESSAGE(wait_for_step(run_dir, 10, std::chrono::seconds(120)), test_util::read_file(out));
  auto r = c.sh("scancel " + id);
  REQUIRE(r.code == 0);
  CHECK(c.wait_job(id, std::chrono::seconds(60)) == "CANCELLED");
  const auto log = test_util::read_file(out);
  INFO(log);
  CHECK(c.job(id, "Restarts") == "0");
  CHECK(!contains(log, "requeued:"));
  CHECK(contains(log, "SIGTERM: the ranks checkpoint and stop; no requeue"));
  const auto ckpts = stages::checkpoints_newest_first(run_dir);
  REQUIRE(ckpts.size() == 1);
  const auto m = read_metrics(run_dir);
  REQUIRE(!m.steps.empty());
  CHECK(model::read_checkpoint(ckpts.front().string()).step == m.steps.back());
  CHECK(m.steps.back() < 200);
  CHECK(contains(log, "SIGTERM: stopped at step " + std::to_string(m.steps.back()) + " of 200 on all 2 ranks"));
}

TEST_CASE("preemption by a higher-priority partition: Slurm requeues the run, which resumes and completes") {
  Case k("slurm_preempt");
  const auto& c = k.c;
  const auto &run_dir = k.run_dir, &out = k.out;
  constexpr int kSteps = 60;
  Uninterrupted ref(c, k.root, k.data, kSteps);
  auto id = k.submit("5", "", kSteps, 300);
  REQUIRE_MESSAGE(wait_for_step(run_dir, 10, std::chrono::seconds(120)), test_util::read_file(out));
  // Both nodes, in partition high (PriorityTier 2, over main's 1, PreemptMode=REQUEUE).
  auto high = c.sbatch("--partition=high --nodes=2 --output=/dev/null --wrap='sleep 1'");
  CHECK(c.wait_job(high, std::chrono::seconds(120)) == "COMPLETED");
  CHECK(c.wait_job(id, std::chrono::seconds(180)) == "COMPLETED");
  const auto log = test_util::read_file(out);
  INFO(log);
  CHECK(c.job(id, "Restarts") == "1");
  CHECK(contains(log, "DUE TO PREEMPTION"));
  CHECK(!contains(log, "requeued:"));  // Slurm did, not the script
  auto m = read_metrics(run_dir);
  REQUIRE(m.starts.size() == 2);
  const int64_t stopped = static_cast<int64_t>(m.starts[1].number("start_step"));
  CHECK(stopped >= 10);
  CHECK(contains(log, "SIGTERM: stopped at step " + std::to_string(stopped) + " of " + std::to_string(kSteps)));
  CHECK(contains(log, "resuming from " + (run_dir / "checkpoints").string()));
  REQUIRE(m.steps.size() == static_cast<size_t>(kSteps));
  check_same_run(run_dir, ref.get(), kSteps);
}
