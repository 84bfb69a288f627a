// Loads libpipeline_remote.so, the remote stores (remote_module.h), as parquet_module.cpp loads
// Arrow's half of the Parquet reader: from the executable's directory, then where the build put it.
#include "datasets/io/remote_module.h"

#include <vector>

#include "base/module.h"
#include "datasets/dataset_error.h"
#include "datasets/io/url.h"

namespace pipeline::datasets::io {
namespace fs = std::filesystem;
namespace {

const RemoteModule& load_remote_module(const std::string& source) {
  std::vector<fs::path> candidates;
  std::string error;
  if (const fs::path dir = executable_dir(error); !dir.empty()) candidates.push_back(dir / kRemoteModuleFile);
#ifdef PIPELINE_REMOTE_MODULE_PATH
  // For the tests and fuzz targets, whose executables live elsewhere in the build tree.
  candidates.emplace_back(PIPELINE_REMOTE_MODULE_PATH);
#endif
  std::string tried;
  if (const auto* module = load_versioned_module<RemoteModule>(candidates, kRemoteModuleEntry, kRemoteModuleVersion, tried))
    return *module;
  throw DatasetError(redact_urls(source) + ": reading a remote source needs " + kRemoteModuleFile +
                     ", which did not load:" + tried +
                     "\n(it is built with the datasets library, beside the pipeline executable: "
                     "cmake --build BUILD --target pipeline_remote_module)");
}

}  // namespace

const RemoteModule& remote_module(const std::string& source) {
  // Loaded once, at the first remote source (a function-local static: lazy, and thread-safe for
  // readers opened at once); a load that throws is tried again at the next call. Never unloaded:
  // libcurl's and OpenSSL's global state outlive any one store.
  static const RemoteModule& module = load_remote_module(source);
  return module;
}

}  // namespace pipeline::datasets::io
