// The entry point of the LibTorch half of `pipeline` (libpipeline_torch.so, see cli.h): the
// executable calls it with a command's name and arguments, and it runs that command from this
// library's own registry (cmd_run.cpp, cmd_generate.cpp, cmd_export.cpp). Every such command
// keeps its large CPU tensors' pages from step to step (model/device/cpu_block_cache.h).
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "cli.h"
#include "model/device/cpu_block_cache.h"

extern "C" __attribute__((visibility("default"))) int pipeline_torch_command(const char* name, int argc,
                                                                              const char* const* argv) {
  static_assert(std::is_same_v<decltype(&pipeline_torch_command), pipeline::cli::TorchEntry>);
  const std::vector<std::string> args(argv, argv + argc);
  pipeline::model::install_cpu_block_cache();
  for (const auto& c : pipeline::cli::commands())
    if (c.name == name) return pipeline::cli::run_command(c, args);
  std::cerr << "pipeline: the LibTorch half has no command '" << name << "'\n";
  return 2;
}
