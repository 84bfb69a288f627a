// The run sections of a pipeline TOML (every section other than [stages.*]): declared once as
// schemas, with documented defaults, and resolved into the typed settings the stages read
// (stages/settings.h), which `pipeline run` and `pipeline check` share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "base/config.h"
#include "stages/settings.h"

namespace pipeline::stages {

/// The schema of each run section, by name (run, model, data, training, optimizer, eval,
/// checkpoint, logging).
const std::vector<config::Schema>& run_schemas();

/// "N" or "FROM-TO" (1 <= FROM <= TO) as data steps; nullopt for anything else.
std::optional<StepRange> parse_step_range(const std::string& text);

/// Resolves every run section of `doc` (marking them known) and checks cross-key constraints.
/// Relative dataset paths are taken from the config file's directory, then from the source tree.
RunConfig resolve_run_config(const config::Document& doc, const std::filesystem::path& source_dir);

}  // namespace pipeline::stages
