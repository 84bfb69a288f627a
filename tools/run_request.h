// What `pipeline run` and `pipeline check` share, without LibTorch: their command line (CONFIG,
// --set, --resume) and the settings header both print at start-up.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "base/config.h"
#include "model/net/gpt_config.h"
#include "runner/run_resolve.h"

namespace pipeline::cli {

/// CONFIG [--set section.key=value]... [--resume RUN_DIR | --resume auto]; `cmd` names the command in
/// errors.
/// Throws std::invalid_argument.
stages::RunRequest parse_run_request(const std::vector<std::string>& args, const char* cmd);

/// The first lines of a run: version, config, device, run directory; the model's shape and size;
/// a table of every resolved setting, and the tables `--set TABLE=` removed (`removed`, as given).
/// When a model too large for a CPU is to train on one (device "cpu"), a warning that says so and
/// points to the quick start.
void print_run_header(std::ostream& os, const std::filesystem::path& config_path, const std::string& device,
                      const std::filesystem::path& run_dir, const model::GPTConfig& model,
                      const std::vector<config::Section>& sections, const std::vector<std::string>& removed);

}  // namespace pipeline::cli
