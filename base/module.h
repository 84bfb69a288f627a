// Loading a part of `pipeline` that is built as a module of its own and loaded only when a
// command needs it: the LibTorch half (tools/torch_commands.cpp) and Arrow's half of the Parquet
// reader (datasets/parquet/parquet_module.cpp). Each keeps its heavy libraries out of the start-up of
// every other command.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace pipeline {

/// The directory of the running executable (/proc/self/exe), where the modules are built and
/// installed; empty when it cannot be read, with the reason in `error`.
std::filesystem::path executable_dir(std::string& error);

/// Opens the module at `path` (RTLD_NOW: a missing symbol fails here, not mid-run; RTLD_LOCAL: its
/// symbols stay out of the way of everything loaded after it) and returns its `entry` symbol.
/// Null when either fails, with the loader's reason in `error` (which names the file). A module is never unloaded:
/// neither LibTorch nor Arrow supports it.
void* load_module_entry(const std::filesystem::path& path, const char* entry, std::string& error);

/// The module of the first of `candidates` that loads and whose `entry` (a function returning
/// `const Module*`) gives a module of interface `version` (Module::version); null when none does,
/// with why each was refused (not loaded, or a module from another build) added to `tried`.
template <class Module>
const Module* load_versioned_module(const std::vector<std::filesystem::path>& candidates, const char* entry,
                                    uint32_t version, std::string& tried) {
  for (const auto& path : candidates) {
    std::string why;
    auto fn = reinterpret_cast<const Module* (*)()>(load_module_entry(path, entry, why));
    if (!fn) {
      tried += "\n  " + why;
      continue;
    }
    const Module* module = fn();
    if (module->version == version) return module;
    tried += "\n  " + path.string() + ": interface version " + std::to_string(module->version) + ", expected " +
             std::to_string(version) + " (a module from another build)";
  }
  return nullptr;
}

}  // namespace pipeline
