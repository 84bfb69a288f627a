// See module.h.
#include "base/module.h"

#include <dlfcn.h>

#include <system_error>

namespace pipeline {

std::filesystem::path executable_dir(std::string& error) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    error = "cannot find this program's own path (/proc/self/exe): " + ec.message();
    return {};
  }
  return exe.parent_path();
}

void* load_module_entry(const std::filesystem::path& path, const char* entry, std::string& error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    error = why ? why : "unknown error";
    return nullptr;
  }
  void* symbol = dlsym(handle, entry);
  if (!symbol) {
    const char* why = dlerror();
    error = std::string("no entry point ") + entry + ": " + (why ? why : "unknown error");
  }
  return symbol;
}

}  // namespace pipeline
