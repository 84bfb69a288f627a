// Signals and output, from outside (label e2e): the real `pipeline run`, started in a session of
// its own (so that a signal reaches it alone) and signalled at its own pid, as Slurm, Kubernetes,
// a terminal or `kill` would.
//   - SIGINT and SIGTERM (and SIGHUP, SIGQUIT, SIGUSR2, SIGXCPU): the step finishes, a complete checkpoint is written, the run exits with
//     128 + the signal and records the resume command in RUN_DIR/run.log;
//   - SIGUSR1: a checkpoint at the next step, and the run trains on to its end;
//   - a pipe whose reader exits (what `| tee` does after Ctrl-C): the run trains on, notes the
//     lost output once in run.log, and a SIGINT then still ends with a checkpoint.
// Each checkpoint must resume exactly: the resumed run's losses and its batches' tokens equal
// those of an uninterrupted run. A delay stage slows each step (150 ms) so that a signal lands
// mid-run; every wait is on the run's own progress, with generous limits (a loaded 2-core machine).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "runner/signals.h"
#include "test_util.h"

extern char** environ;

namespace fs = std::filesystem;
using test_util::contains;

namespace {

constexpr int kSteps = 20;
const std::string kQuick = std::string(PIPELINE_SOURCE_DIR) + "/pipelines/quickstart.toml";

// The tiny model, one intra-op thread, a checkpoint only at the end (or when asked), every step
// logged; pack -> delay (150 ms) -> record_batches -> h2d.
std::vector<std::string> run_args(const fs::path& run_dir) {
  std::vector<std::string> a = {PIPELINE_EXE, "run", kQuick};
  for (const char* s : {"model.preset=tiny", "training.seq_len=32", "training.batch_size=2", "eval.every=0",
                        "checkpoint.every=0", "checkpoint.keep=5", "logging.every=1", "logging.live=off",
                        "logging.trace=false", "run.threads=1", "stages.tokenize.workers=1",
                        "stages.slow.type=\"delay\"", "stages.slow.input=\"pack\"", "stages.slow.ms=150",
                        "stages.rec.type=\"record_batches\"", "stages.rec.input=\"slow\"", "stages.h2d.input=\"rec\""})
    a.insert(a.end(), {"--set", s});
  a.insert(a.end(), {"--set", "training.steps=" + std::to_string(kSteps), "--set", "run.dir=" + run_dir.string()});
  return a;
}

std::vector<std::string> resume_args(const fs::path& run_dir) { return {PIPELINE_EXE, "run", "--resume", run_dir.string()}; }

struct Proc {
  pid_t pid = -1;
  int out_fd = -1;  // the read end of its stdout, when it writes into a pipe
};

// Starts `argv` in a new session (its own process group: no signal meant for the test reaches it,
// and ours reach it alone). stderr goes to `err_log`; stdout to `out_log`, or into a pipe whose
// read end the test holds when `out_log` is empty.
Proc start(const std::vector<std::string>& argv, const fs::path& out_log, const fs::path& err_log) {
  Proc p;
  int pipe_fds[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (out_log.empty()) {
    REQUIRE(::pipe(pipe_fds) == 0);
    posix_spawn_file_actions_adddup2(&fa, pipe_fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, pipe_fds[0]);
    posix_spawn_file_actions_addclose(&fa, pipe_fds[1]);
  } else {
    posix_spawn_file_actions_addopen(&fa, 1, out_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  posix_spawn_file_actions_addopen(&fa, 2, err_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  REQUIRE(posix_spawn(&p.pid, args[0], &fa, &attr, args.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (out_log.empty()) {
    ::close(pipe_fds[1]);
    p.out_fd = pipe_fds[0];
  }
  return p;
}

// step -> loss as logged (%.9g: exact for fp32); a resumed run's lines replace the earlier ones.
std::map<int, std::string> losses(const fs::path& run_dir) {
  std::map<int, std::string> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto l = line.find("\"loss\":");
    auto s = line.find("\"step\":");
    if (l == std::string::npos || s == std::string::npos) continue;
    out[std::stoi(line.substr(s + 7))] = line.substr(l + 7, line.find(',', l) - l - 7);
  }
  return out;
}

// Waits until the run logged step `step` (true), or ended or ran out of time (false).
bool wait_for_step(const Proc& p, const fs::path& run_dir, int step) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (std::chrono::steady_clock::now() < deadline) {
    if (losses(run_dir).count(step)) return true;
    if (waitpid(p.pid, nullptr, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int checkpoint_step(const fs::path& file) { return std::stoi(file.stem().string().substr(5)); }

// Every checkpoint file, by step; fails the test on a temporary left behind.
std::map<int, fs::path> checkpoints(const fs::path& run_dir) {
  std::map<int, fs::path> out;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints")) {
    INFO(e.path().string());
    CHECK(e.path().extension() == ".ckpt");
    if (e.path().extension() == ".ckpt") out[checkpoint_step(e.path())] = e.path();
  }
  return out;
}

// The uninterrupted run every case compares with (made once).
const fs::path& reference() {
  static const fs::path dir = [] {
    auto root = test_util::fresh_dir("signals", "reference");
    auto run_dir = root / "r";
    auto p = start(run_args(run_dir), root / "out.log", root / "err.log");
    const int code = test_util::wait_exit(p.pid, std::chrono::seconds(300));
    INFO(test_util::read_file(root / "out.log") << test_util::read_file(root / "err.log"));
    REQUIRE(code == 0);
    REQUIRE(losses(run_dir).size() == static_cast<size_t>(kSteps));
    return run_dir;
  }();
  return dir;
}

// Resumes `run_dir` to the end and checks it continues exactly: every step's loss and every
// batch's tokens as in the uninterrupted run. `from` is the step it resumes from.
void resume_exactly(const fs::path& run_dir, int from) {
  const auto root = run_dir.parent_path();
  auto p = start(resume_args(run_dir), root / "resumed.out", root / "resumed.err");
  const int code = test_util::wait_exit(p.pid, std::chrono::seconds(300));
  const auto out = test_util::read_file(root / "resumed.out");
  INFO(out << test_util::read_file(root / "resumed.err"));
  REQUIRE(code == 0);
  CHECK(contains(out, "resuming from " + (run_dir / "checkpoints").string()));
  CHECK(contains(out, "at step " + std::to_string(from)));
  CHECK(contains(out, "done: " + std::to_string(kSteps) + " steps"));
  const auto ref = losses(reference()), got = losses(run_dir);
  REQUIRE(got.size() == ref.size());
  for (int s = 1; s <= kSteps; ++s) CHECK_MESSAGE(got.at(s) == ref.at(s), "step " << s);
  CHECK(test_util::read_file(run_dir / "batches.u16") == test_util::read_file(reference() / "batches.u16"));
}

// Sends `sig` mid-run and checks the stop: exit status, checkpoint, resume command in run.log.
// Returns the step it stopped at.
int stop_with(int sig, const std::string& name, const fs::path& root) {
  auto run_dir = root / "r";
  auto p = start(run_args(run_dir), root / "out.log", root / "err.log");
  REQUIRE_MESSAGE(wait_for_step(p, run_dir, 3), test_util::read_file(root / "err.log"));
  REQUIRE(kill(p.pid, sig) == 0);
  const int code = test_util::wait_exit(p.pid, std::chrono::seconds(120));
  const auto out = test_util::read_file(root / "out.log"), err = test_util::read_file(root / "err.log");
  INFO(out << err);
  CHECK(code == 128 + sig);
  CHECK(contains(err, "pipeline run: " + name + ": stopping after the current step, with a checkpoint"));
  const auto ckpts = checkpoints(run_dir);
  REQUIRE(ckpts.size() == 1);
  const int step = ckpts.begin()->first;
  CHECK(step >= 3);
  CHECK(step < kSteps);
  CHECK(losses(run_dir).rbegin()->first == step);  // the checkpoint is the last step trained
  const std::string stopped = name + ": stopped at step " + std::to_string(step) + " of " + std::to_string(kSteps) +
                              ". Checkpoint " + ckpts.begin()->second.string() + ".";
  const std::string resume = "Continue with: pipeline run --resume " + run_dir.string();
  CHECK(contains(out, stopped));
  CHECK(contains(out, resume));
  const auto run_log = test_util::read_file(run_dir / "run.log");  // the run directory's own record
  CHECK(contains(run_log, stopped));
  CHECK(contains(run_log, resume));
  return step;
}

// Sends `sig` `times` times, `gap` apart, mid-run: one stop, not an abort (exit status 1), with one
// checkpoint, of the last step trained.
void one_stop_from(int sig, int times, std::chrono::milliseconds gap, const std::string& tag) {
  auto root = test_util::fresh_dir("signals", tag);
  auto run_dir = root / "r";
  auto p = start(run_args(run_dir), root / "out.log", root / "err.log");
  REQUIRE_MESSAGE(wait_for_step(p, run_dir, 3), test_util::read_file(root / "err.log"));
  REQUIRE(kill(p.pid, sig) == 0);
  for (int i = 1; i < times; ++i) {
    std::this_thread::sleep_for(gap);
    kill(p.pid, sig);
  }
  const int code = test_util::wait_exit(p.pid, std::chrono::seconds(120));
  INFO(test_util::read_file(root / "out.log") << test_util::read_file(root / "err.log"));
  CHECK(code == 128 + sig);
  const auto ckpts = checkpoints(run_dir);
  REQUIRE(ckpts.size() == 1);
  CHECK(losses(run_dir).rbegin()->first == ckpts.begin()->first);
}

}  // namespace

TEST_CASE("SIGINT: the step finishes, a checkpoint is written, and the run resumes exactly") {
  auto root = test_util::fresh_dir("signals", "int");
  const int step = stop_with(SIGINT, "SIGINT", root);
  resume_exactly(root / "r", step);
}

TEST_CASE("SIGTERM acts like Ctrl-C: a checkpoint, exit status 143, and an exact resume") {
  auto root = test_util::fresh_dir("signals", "term");
  const int step = stop_with(SIGTERM, "SIGTERM", root);
  resume_exactly(root / "r", step);
}

// What schedulers, terminals and torchrun send before a kill, besides SIGTERM: the same stop. The
// checkpoint of each resumes as SIGINT's and SIGTERM's do (the same code path after the handler).
TEST_CASE("SIGHUP, SIGQUIT, SIGUSR2 and SIGXCPU stop like Ctrl-C, each with a checkpoint") {
  for (auto [sig, name] : {std::pair{SIGHUP, "SIGHUP"}, std::pair{SIGQUIT, "SIGQUIT"}, std::pair{SIGUSR2, "SIGUSR2"},
                           std::pair{SIGXCPU, "SIGXCPU"}}) {
    CAPTURE(name);
    stop_with(sig, name, test_util::fresh_dir("signals", std::string("stop_") + name));
  }
}

TEST_CASE("two SIGTERMs at once (Slurm signals every process, torchrun passes it on) are one stop, with a checkpoint") {
  one_stop_from(SIGTERM, 2, std::chrono::milliseconds(5), "term_twice");  // as torchrun passes it on, at once
}

// The handler and its watcher in this process: what reaches the run's actions, and when.
TEST_CASE("RunSignals: stop signals within 2 s of the first are one request; a later one aborts; SIGXCPU never does") {
  pipeline::stages::RunSignals signals;
  std::atomic<int> stops{0}, aborts{0}, abort_signal{0};
  signals.bind({.stop = [&](int) { stops.fetch_add(1); },
                .abort =
                    [&](int sig) {
                      abort_signal.store(sig);
                      aborts.fetch_add(1);
                    },
                .checkpoint = {}});
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };  // 10 watcher periods
  const auto first = std::chrono::steady_clock::now();
  REQUIRE(raise(SIGXCPU) == 0);
  REQUIRE(raise(SIGTERM) == 0);  // the same request, come again at once
  settle();
  CHECK(stops.load() == 1);
  CHECK(aborts.load() == 0);
  CHECK(signals.stop_signal() == SIGXCPU);
  std::this_thread::sleep_until(first + std::chrono::nanoseconds(pipeline::stages::RunSignals::kSameRequestNs) +
                                std::chrono::milliseconds(100));
  REQUIRE(raise(SIGXCPU) == 0);  // the kernel's repeat: never an abort
  settle();
  CHECK(aborts.load() == 0);
  REQUIRE(raise(SIGINT) == 0);  // a second request, later: abort
  settle();
  CHECK(stops.load() == 1);
  CHECK(aborts.load() == 1);
  CHECK(abort_signal.load() == SIGXCPU);  // the actions are told the signal that asked for the stop
  signals.unbind();
}

TEST_CASE("SIGXCPU repeated each second, as the kernel does past a soft CPU limit, still checkpoints") {
  // (Closer together than the kernel's second: the repeats must land while the step still runs.)
  one_stop_from(SIGXCPU, 4, std::chrono::milliseconds(30), "xcpu_repeated");
}

TEST_CASE("SIGUSR1 writes a checkpoint at the next step and training goes on; it resumes exactly") {
  auto root = test_util::fresh_dir("signals", "usr1");
  auto run_dir = root / "r";
  auto p = start(run_args(run_dir), root / "out.log", root / "err.log");
  REQUIRE_MESSAGE(wait_for_step(p, run_dir, 3), test_util::read_file(root / "err.log"));
  REQUIRE(kill(p.pid, SIGUSR1) == 0);
  const int code = test_util::wait_exit(p.pid, std::chrono::seconds(180));
  const auto out = test_util::read_file(root / "out.log");
  INFO(out << test_util::read_file(root / "err.log"));
  REQUIRE(code == 0);
  CHECK(contains(out, "done: " + std::to_string(kSteps) + " steps"));
  auto ckpts = checkpoints(run_dir);
  REQUIRE(ckpts.size() == 2);  // the one asked for, and the final one
  const int asked = ckpts.begin()->first;
  CHECK(asked >= 3);
  CHECK(asked < kSteps);
  CHECK(ckpts.rbegin()->first == kSteps);
  CHECK(contains(out, "train: checkpoint of step " + std::to_string(asked) + " as asked (SIGUSR1); training goes on"));
  // The uninterrupted run's losses all along: the checkpoint cost the training nothing.
  CHECK(losses(run_dir) == losses(reference()));
  // As if the job had been killed after it: resume from the checkpoint SIGUSR1 wrote.
  auto copy = root / "from_usr1";
  fs::copy(run_dir, copy, fs::copy_options::recursive);
  fs::remove(copy / "checkpoints" / ckpts.rbegin()->second.filename());
  resume_exactly(copy, asked);
}

TEST_CASE("a pipe whose reader exits stops the printing, not the run; Ctrl-C then still checkpoints") {
  // `pipeline run ... | tee log`, then Ctrl-C: tee dies first and the pipe has no reader.
  auto root = test_util::fresh_dir("signals", "pipe");
  auto run_dir = root / "r";
  auto p = start(run_args(run_dir), "", root / "err.log");
  REQUIRE(p.out_fd >= 0);
  REQUIRE_MESSAGE(wait_for_step(p, run_dir, 2), test_util::read_file(root / "err.log"));
  ::close(p.out_fd);  // the reader exits
  // Training goes on past the lines that can no longer be printed.
  REQUIRE_MESSAGE(wait_for_step(p, run_dir, 5), test_util::read_file(root / "err.log"));
  REQUIRE(kill(p.pid, SIGINT) == 0);
  const int code = test_util::wait_exit(p.pid, std::chrono::seconds(120));
  const auto err = test_util::read_file(root / "err.log");
  INFO(err);
  CHECK(code == 128 + SIGINT);
  const auto run_log = test_util::read_file(run_dir / "run.log");
  INFO(run_log);
  const std::string lost = "pipeline run: standard output is gone (Broken pipe): printing to it stopped; the run goes on";
  CHECK(contains(run_log, lost));
  CHECK(run_log.find(lost) == run_log.rfind(lost));  // noted once
  CHECK(contains(err, lost));                        // and said where it can still be seen
  const auto ckpts = checkpoints(run_dir);
  REQUIRE(ckpts.size() == 1);
  const int step = ckpts.begin()->first;
  CHECK(step >= 5);
  CHECK(contains(run_log, "SIGINT: stopped at step " + std::to_string(step)));
  CHECK(contains(run_log, "Continue with: pipeline run --resume " + run_dir.string()));
  resume_exactly(run_dir, step);
}
