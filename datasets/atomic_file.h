// Files replaced all at once: the data goes to PATH.tmp, which is fsynced, closed and renamed
// over PATH, and the directory is fsynced so the rename survives a crash. A reader sees the old
// file or the new one, never half of one, and a failed write leaves the old file as it was.
// Used by the writers of formats other tools read (safetensors, llm.c shards, Hugging Face
// config and tokenizer files).
#pragma once

#include <filesystem>
#include <string_view>

namespace pipeline::datasets {

/// Finishes a file written to `tmp` through `fd`: fsync, close, rename over `path`, fsync the
/// directory. On failure removes `tmp` and throws DatasetError naming `path`, `tmp` and the
/// system error. `fd` is closed in every case.
void commit_atomic(int fd, const std::filesystem::path& tmp, const std::filesystem::path& path);

/// `text` as the whole of `path`, written as above. Throws DatasetError naming `path`.
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

}  // namespace pipeline::datasets
