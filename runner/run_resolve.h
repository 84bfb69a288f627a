// A run's configuration resolved without a device and without touching the disk: the run
// sections, the [stages.*] graph (checked), and the model's shape. What `pipeline check` prints
// (without loading LibTorch) and what `pipeline run` plans from (runner/run_setup.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
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

/// A checkpoint continues the model it holds, and the data order its seed drew (mixes, Parquet's
/// shuffle): another [model] shape or [run] seed than its `metadata` records is an error that says
/// so, before any tensor is read.
void check_resumable(const std::string& metadata, const RunConfig& cfg, const model::GPTConfig& model,
                     const std::string& ckpt);

/// A resumed run whose checkpoint `ckpt` is at `step` has nothing to train once that reaches its
/// [training] steps: the run is complete (step == steps; not an error: a scheduler that starts a
/// finished job again gets exit status 0), or the checkpoint is past them (an error: the run
/// cannot stop at a step it has passed). nullopt while steps are left.
struct NothingToTrain {
  bool past = false;    // the checkpoint is past [training] steps
  std::string message;  // what the run says instead of training, with what to do
};
std::optional<NothingToTrain> nothing_to_train(const RunConfig& cfg, int64_t step, const std::string& ckpt,
                                               const std::filesystem::path& run_dir);

/// A new run's directory, `[run] dir` or runs/<name>-<timestamp> under the working directory
/// (`default_place`). Throws when it holds a run with checkpoints already (a run continues with
/// --resume), or, with `probe`, when it cannot be made: the nearest folder that exists is not one
/// this process may write into (a read-only checkout). `run` makes the folder and learns the
/// latter from that; `check` probes.
void check_new_run_dir(const std::filesystem::path& dir, bool default_place, bool probe);
/// "cannot create the run directory DIR: WHY", and where to choose another when it was the default.
std::runtime_error run_dir_error(const std::filesystem::path& dir, const std::string& why, bool default_place);

/// The newest checkpoint in RUN_DIR/checkpoints (empty path when there is none).
std::filesystem::path latest_checkpoint(const std::filesystem::path& run_dir);
/// Every checkpoint in RUN_DIR/checkpoints, newest first (none when the folder is missing).
std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& run_dir);

/// A checkpoint named on a command line: a .ckpt file as given, or a run directory's newest.
/// Throws std::runtime_error when a directory holds none.
std::filesystem::path checkpoint_file(const std::filesystem::path& file_or_run_dir);

}  // namespace pipeline::stages
