// From a config file to a ready-to-run training graph: resolves the config (runner/run_resolve.h),
// picks the device, sets torch's process-wide state the run trains with (matmul precision, the
// generators' seed, a resumed run's generator states: no stage touches them), creates (or
// reopens, for --resume) the run directory, and installs the run context the training stages
// read. Shared by `pipeline run` and the end-to-end tests.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/dir_lock.h"
#include "graph/engine.h"
#include "runner/data_parallel.h"
#include "runner/run_resolve.h"
#include "stages/types.h"

namespace pipeline::stages {

struct RunPlan {
  std::filesystem::path config_path;
  config::Document doc;
  graph::GraphSpec spec;
  std::shared_ptr<RunContext> ctx;
  /// Under torchrun: this rank's data-parallel group (also ctx->ranks, as the stages see it).
  std::shared_ptr<DataParallel> dp;
  /// The run directory, held by this process alone while the plan lives (rank 0's, or the only
  /// process's: the writer); null where nothing is written.
  std::unique_ptr<DirLock> run_dir_lock;
  /// Every resolved section (run sections, then stages), for the settings table.
  std::vector<config::Section> sections() const;
};

/// Throws config::ConfigError or std::runtime_error with the file, key or path at fault.
RunPlan plan_run(const RunRequest& req);

/// The engine's options for a planned run: run directory, stats sampling, trace, autotune
/// (what `pipeline run` and the in-process test harness both use).
graph::EngineOptions engine_options(const RunContext& ctx);

}  // namespace pipeline::stages
