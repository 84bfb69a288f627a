// A run's configuration resolved without a device and without touching the disk: the run
// sections, the [stages.*] graph (checked), and the model's shape. What `pipeline check` prints
// (without loading LibTorch) and what `pipeline run` plans from (runner/run_setup.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "base/config.h"
#include "graph/engine.h"
#include "model/net/gpt_config.h"
#include "runner/run_config.h"

namespace pipeline::stages {

struct RunRequest {
  std::string config;                  // path or bare name (looked up in pipelines/)
  std::vector<std::string> overrides;  // --set section.key=value
  std::filesystem::path resume;        // --resume RUN_DIR (empty: a fresh run, or auto)
  bool resume_auto = false;            // --resume auto: continue [run] dir's run if it has a checkpoint
  bool create_run_dir = true;          // false: no run directory (in-process benchmarks)
  std::filesystem::path source_dir;    // the source tree, to find pipelines/ and bundled data
  std::string serve;  // run --serve [ADDR:]PORT: this run only, not written into the run's config.toml
};

struct ResolvedRun {
  std::filesystem::path config_path;
  config::Document doc;
  graph::GraphSpec spec;
  RunConfig cfg;
  model::GPTConfig model;
  /// Every resolved section (run sections, then stages), for the settings table.
  std::vector<config::Section> sections() const;
};

/// The config file (with --resume RUN_DIR and no config: the run's own config.toml), its run sections,
/// its graph (stage types, ports, inputs, cycles, options) and the model. Throws
/// config::ConfigError or std::runtime_error with the file, key or path at fault.
ResolvedRun resolve_run(const RunRequest& req);

/// The newest checkpoint in RUN_DIR/checkpoints (empty path when there is none).
std::filesystem::path latest_checkpoint(const std::filesystem::path& run_dir);
/// Every checkpoint in RUN_DIR/checkpoints, newest first (none when the folder is missing).
std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& run_dir);

/// A checkpoint named on a command line: a .ckpt file as given, or a run directory's newest.
/// Throws std::runtime_error when a directory holds none.
std::filesystem::path checkpoint_file(const std::filesystem::path& file_or_run_dir);

}  // namespace pipeline::stages
