// The remote stores as a module of their own, libpipeline_remote.so, loaded at the first remote
// source (base/module.h), as the Parquet reader's Arrow half is: libcurl and what it brings (TLS,
// HTTP/2, Kerberos, LDAP: some 30 libraries), tinyxml2 and GLib stay out of the start of every
// command that reads no remote source. The module exports one entry, which returns the table
// below; only the types of datasets/io/store.h cross, and kRemoteModuleVersion catches a module
// left over from another build.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "datasets/io/store.h"

namespace pipeline::datasets::io {

inline constexpr const char* kRemoteModuleFile = "libpipeline_remote.so";
inline constexpr const char* kRemoteModuleEntry = "pipeline_remote_module";
inline constexpr uint32_t kRemoteModuleVersion = 1;

struct RemoteModule {
  uint32_t version;
  /// The store of a remote source (s3://, https://, http://, hf://): remote_store.h.
  std::unique_ptr<Store> (*open_store)(const std::string& source, const StoreOptions& options);
};

using RemoteModuleEntry = const RemoteModule* (*)();

/// The module, loaded once (beside the executable, then where the build put it). Throws
/// DatasetError naming `source` and what was tried when it does not load.
const RemoteModule& remote_module(const std::string& source);

}  // namespace pipeline::datasets::io
