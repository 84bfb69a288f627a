// The manifest of a dataset directory of either kind this project reads as shards: a prepared
// dataset's manifest.json, or, for a directory of llm.c shards (which carry none), the manifest
// derived from the shards' names and headers.
#pragma once

#include <filesystem>

#include "datasets/shards/manifest.h"

namespace pipeline::datasets {

/// Manifest::load, or llmc_manifest for a directory of llm.c shards.
Manifest load_dataset_manifest(const std::filesystem::path& dir_or_file);

}  // namespace pipeline::datasets
