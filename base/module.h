// Loading a part of `pipeline` that is built as a module of its own and loaded only when a
// command needs it: the LibTorch half (tools/torch_commands.cpp) and Arrow's half of the Parquet
// reader (datasets/parquet/parquet_module.cpp). Each keeps its heavy libraries out of the start-up of
// every other command.
#pragma once

#include <filesystem>
#include <string>

namespace pipeline {

/// The directory of the running executable (/proc/self/exe), where the modules are built and
/// installed; empty when it cannot be read, with the reason in `error`.
std::filesystem::path executable_dir(std::string& error);

/// Opens the module at `path` (RTLD_NOW: a missing symbol fails here, not mid-run; RTLD_LOCAL: its
/// symbols stay out of the way of everything loaded after it) and returns its `entry` symbol.
/// Null when either fails, with the loader's reason in `error` (which names the file). A module is never unloaded:
/// neither LibTorch nor Arrow supports it.
void* load_module_entry(const std::filesystem::path& path, const char* entry, std::string& error);

}  // namespace pipeline
