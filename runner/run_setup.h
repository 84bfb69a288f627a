// From a config file to a ready-to-run training graph: resolves the run sections and the
// [stages.*] graph, picks the device, creates (or reopens, for --resume) the run directory, and
// installs the run context the training stages read. Shared by `pipeline run`, `pipeline check`
// and the end-to-end tests.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "graph/engine.h"
#include "stages/types.h"

namespace pipeline::stages {

struct RunRequest {
  std::string config;                  // path or bare name (looked up in pipelines/)
  std::vector<std::string> overrides;  // --set section.key=value
  std::filesystem::path resume;        // --resume RUN_DIR (empty: a fresh run)
  bool create_run_dir = true;          // false for `pipeline check`
  std::filesystem::path source_dir;    // the source tree, to find pipelines/ and bundled data
};

struct RunPlan {
  std::filesystem::path config_path;
  config::Document doc;
  graph::GraphSpec spec;
  std::shared_ptr<RunContext> ctx;
  /// Every resolved section (run sections, then stages), for the settings table.
  std::vector<config::Section> sections() const;
};

/// Throws config::ConfigError or std::runtime_error with the file, key or path at fault.
RunPlan plan_run(const RunRequest& req);

/// The engine's options for a planned run: run directory, stats sampling, trace, autotune
/// (what `pipeline run` and the in-process test harness both use).
graph::EngineOptions engine_options(const RunContext& ctx);

/// The newest checkpoint in RUN_DIR/checkpoints (empty path when there is none).
std::filesystem::path latest_checkpoint(const std::filesystem::path& run_dir);

/// A checkpoint named on a command line: a .ckpt file as given, or a run directory's newest.
/// Throws std::runtime_error when a directory holds none.
std::filesystem::path checkpoint_file(const std::filesystem::path& file_or_run_dir);

}  // namespace pipeline::stages
