// A dataset's manifest, prepared or derived from llm.c shards (see dataset_manifest.h).
#include "datasets/sources/dataset_manifest.h"

#include "datasets/llmc/llmc_reader.h"

namespace pipeline::datasets {

Manifest load_dataset_manifest(const std::filesystem::path& dir_or_file) {
  if (is_llmc_dataset(dir_or_file)) return llmc_manifest(dir_or_file);
  return Manifest::load(dir_or_file);
}

}  // namespace pipeline::datasets
