// Shared by the end-to-end tests that launch `pipeline run` under torchrun (label e2e): the
// launch (a process's output into a log file; `ranks` ranks under torchrun, or one process
// without it), a finished run taken back to one of its checkpoints as if it had stopped there,
// and how far two runs' weights lie apart. Include after doctest (its REQUIRE and INFO).
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "base/json.h"
#include "model/checkpoint/checkpoint.h"
#include "test_util.h"

extern char** environ;

namespace torchrun_harness {

namespace fs = std::filesystem;
using namespace pipeline;

inline const std::string kTorchrun = PIPELINE_TORCHRUN;

/// Exits 77 (CTest: skipped) where set-up installed no torchrun; call from a static initializer.
inline bool require_torchrun(const char* test) {
  if (kTorchrun.empty() || !fs::exists(kTorchrun)) {
    std::fprintf(stderr, "%s: no torchrun (set-up's torch venv), skipped\n", test);
    std::exit(77);
  }
  return true;
}

struct Launch {
  pid_t pid = -1;
  fs::path log;
  std::chrono::steady_clock::time_point started;
};

// argv[0] is the program; output (stdout and stderr) goes to `log`.
inline Launch spawn(const std::vector<std::string>& argv, const fs::path& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Launch l;
  l.log = log;
  l.started = std::chrono::steady_clock::now();
  REQUIRE(posix_spawn(&l.pid, args[0], &fa, nullptr, args.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  return l;
}

// `ranks` processes under torchrun; 1: `pipeline run` alone, without torchrun.
inline Launch torchrun(const fs::path& cfg_or_dir, bool resume, const std::vector<std::string>& sets, const fs::path& log,
                int ranks = 2) {
  std::vector<std::string> argv = {kTorchrun, "--standalone", "--nproc-per-node=" + std::to_string(ranks),
                                   "--no-python", PIPELINE_EXE, "run"};
  if (ranks == 1) argv = {PIPELINE_EXE, "run"};
  if (resume) argv.push_back("--resume");
  argv.push_back(cfg_or_dir.string());
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return spawn(argv, log);
}

inline int run_torchrun(const fs::path& cfg_or_dir, bool resume, const std::vector<std::string>& sets, const fs::path& log,
                 int ranks = 2) {
  int code = test_util::wait_exit(torchrun(cfg_or_dir, resume, sets, log, ranks).pid, std::chrono::seconds(240));
  INFO("torchrun output:\n" << test_util::read_file(log));
  REQUIRE(code == 0);
  return code;
}

// Largest |a - b| / max|b| over every weight tensor.
inline double weight_difference(const model::CheckpointState& a, const model::CheckpointState& b) {
  REQUIRE(a.model.size() == b.model.size());
  double worst = 0;
  for (size_t i = 0; i < a.model.size(); ++i) {
    REQUIRE(a.model[i].first == b.model[i].first);
    double scale = b.model[i].second.abs().max().item<double>();
    double diff = (a.model[i].second - b.model[i].second).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(scale, 1e-12));
  }
  return worst;
}

// A copy of a finished run taken back to its checkpoint of step `step`, as if it had stopped there
// (the learning-rate schedule is that of the whole run's steps): that checkpoint alone, the metrics
// up to it, and no recorded batches, so that the resumed run records only its own.
inline fs::path stopped_copy(const fs::path& run, const fs::path& dir, int step) {
  fs::create_directories(dir / "checkpoints");
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().filename() != "checkpoints") fs::copy(e.path(), dir / e.path().filename(), fs::copy_options::recursive);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d.ckpt", step);
  REQUIRE(fs::exists(run / "checkpoints" / name));
  fs::copy_file(run / "checkpoints" / name, dir / "checkpoints" / name);
  std::string kept;
  std::istringstream lines(test_util::read_file(dir / "metrics.jsonl"));
  for (std::string line; std::getline(lines, line);)
    if (json_parse(line).number("step") <= step) kept += line + "\n";
  test_util::write_file(dir / "metrics.jsonl", kept);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("batches.", 0) == 0) fs::remove(e.path());
  return dir;
}

}  // namespace torchrun_harness
