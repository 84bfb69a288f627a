// Loads libpipeline_parquet.so, the Arrow C++ half of the Parquet reader (parquet_module.h), the
// way tools/torch_commands.cpp loads the LibTorch half (base/module.h): from the executable's directory.
#include "datasets/parquet/parquet_module.h"

#include "base/module.h"
#include "datasets/dataset_error.h"

namespace pipeline::datasets {
namespace fs = std::filesystem;
namespace {

#ifdef PIPELINE_PARQUET_MODULE_PATH
// Beside the executable first: an installed or copied `pipeline` uses the module that came with
// it. Then where the build put it (CMake bakes the path in), for the tests and fuzz targets,
// whose executables live elsewhere in the build tree.
std::vector<fs::path> parquet_module_candidates() {
  std::vector<fs::path> out;
  std::string error;
  const fs::path dir = executable_dir(error);
  if (!dir.empty()) out.push_back(dir / kParquetModuleFile);
  const fs::path built = PIPELINE_PARQUET_MODULE_PATH;
  if (out.empty() || out.front() != built) out.push_back(built);
  return out;
}
#endif

}  // namespace

const ParquetModule& load_parquet_module(const std::vector<fs::path>& candidates, const std::string& source) {
  std::string tried;
  // A module that loads but is refused stays loaded: Arrow does not support unloading.
  if (const auto* module = load_versioned_module<ParquetModule>(candidates, kParquetModuleEntry, kParquetModuleVersion, tried))
    return *module;
  throw DatasetError(source + ": reading Parquet needs Arrow C++ through " + kParquetModuleFile +
                     ", which did not load:" + tried +
                     "\n(it is built with the datasets library, beside the pipeline executable: "
                     "cmake --build BUILD --target pipeline_parquet_module)");
}

const ParquetModule& parquet_module(const std::string& source) {
#ifndef PIPELINE_PARQUET_MODULE_PATH
  // A build configured without Arrow (PIPELINE_WITH_PARQUET=OFF; the GPU machine's) has the same
  // reader and no module: Parquet input is still recognised, and refused here.
  throw DatasetError(source + ": this build reads no Parquet (configured with PIPELINE_WITH_PARQUET=OFF); "
                     "rebuild with tools/setup.sh, which brings Arrow C++ from the pyarrow wheel");
#else
  // The one piece of process-wide state the Parquet reader keeps: the module, loaded once. A
  // function-local static because its initialisation is lazy (a command that reads no Parquet
  // never maps Arrow) and thread-safe (readers opened at once on several threads load it once);
  // a load that throws is tried again at the next call. Never unloaded: Arrow keeps memory pools
  // and threads that outlive any one reader.
  static const ParquetModule& module = load_parquet_module(parquet_module_candidates(), source);
  return module;
#endif
}

}  // namespace pipeline::datasets
