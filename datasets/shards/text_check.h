// Checks that input given as text is text: a known binary signature at the start (Parquet, gzip,
// zstd, Arrow IPC, ...) or a NUL byte anywhere is refused with the file and byte offset, because
// tokenizing compressed bytes "works" and trains on garbage. Invalid UTF-8 is not refused (GPT-2's
// byte-level BPE encodes any bytes) but counted, for a warning.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

namespace pipeline::datasets {

/// The format whose signature `head` (a file's first bytes) starts with ("Parquet", "gzip",
/// "zstd", "Arrow IPC", ...), or nullptr.
const char* binary_signature(std::string_view head);

/// Throws DatasetError "FILE: byte 0: FORMAT data (it starts with ..), not text; HINT" when `head`
/// starts with a known binary signature.
void refuse_binary_signature(const std::filesystem::path& file, std::string_view head);

/// Throws DatasetError "FILE: byte OFFSET: a NUL byte; ..." when `text` (which starts at byte
/// `offset` of the file) holds one.
void refuse_nul_bytes(const std::filesystem::path& file, std::string_view text, uint64_t offset);

/// Bytes of `text` that are not part of a well-formed UTF-8 sequence (0 for valid UTF-8).
uint64_t invalid_utf8_bytes(std::string_view text);

}  // namespace pipeline::datasets
