// The entry point of libpipeline_remote.so (remote_module.h): the one symbol it exports.
#include <type_traits>

#include "datasets/io/remote_module.h"
#include "datasets/io/remote_store.h"

extern "C" __attribute__((visibility("default"))) const pipeline::datasets::io::RemoteModule* pipeline_remote_module() {
  using namespace pipeline::datasets::io;
  static_assert(std::is_same_v<decltype(&pipeline_remote_module), RemoteModuleEntry>);
  static const RemoteModule module{kRemoteModuleVersion, &open_remote_store};
  return &module;
}
