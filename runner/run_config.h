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
#include "datasets/io/store.h"
#include "graph/engine.h"
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

/// Throws DatasetError for a remote source's URL (s3://, https://, hf://) that the readers would
/// refuse: one they cannot parse, http:// without [data] allow_http, or a query string (a
/// credential, and the config is copied into the run directory). Local paths pass. No network.
void check_source_text(const std::string& source, bool allow_http);

/// A source a run reads, as written, with the config key that names it.
struct RunSource {
  std::string key;     // "[data] dataset", "[stages.read] mix", "[stages.eval] dataset"
  std::string source;  // a path or a URL
};
/// The sources of a run: [data] dataset, and each stage's own dataset and mix entries.
std::vector<RunSource> run_sources(const RunConfig& rc, const graph::GraphSpec& spec);

/// How the readers reach a remote source: [data]'s endpoint, region, profile, allow_http and
/// cache_dir, and the fetch stage's prefetch, cache_bytes, connections and retry_for when the graph
/// has one (the defaults otherwise: a remote source is fetched ahead whether or not a stage shows it).
datasets::io::StoreOptions store_options_of(const RunConfig& rc, const graph::GraphSpec& spec);

}  // namespace pipeline::stages
