// llm.c / modded-nanogpt token shards (`.bin`), and directories of them used as datasets.
//
// Layout of one shard (little-endian), as llm.c's and modded-nanogpt's data scripts write it:
//   [0, 1024)  256 int32: [0] magic 20240520, [1] version 1, [2] token count N, the rest 0
//   [1024, 1024 + 2N)  N uint16 GPT-2 token ids; every document starts with <|endoftext|> 50256
// (Llama 3 shards, magic 20240801 version 7, hold uint32 ids of another vocabulary: recognised
// and refused.) A directory of shards is a dataset when it has no manifest.json and its files
// follow llm.c's naming, `<prefix>_<split>_<index>.bin` (fineweb_train_000001.bin) or
// `<prefix>_<split>.bin` (tiny_shakespeare_val.bin); a split's shards are read in name order.
//
// Example:
//   LlmcShardReader r("fineweb_val_000000.bin");
//   std::vector<uint16_t> ids(4096);
//   size_t n = r.read(0, ids);  // the first 4096 tokens
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/atomic_file.h"

namespace pipeline::datasets {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int32_t kLlmcLlama3Magic = 20240801;
inline constexpr size_t kLlmcHeaderBytes = 1024;  // 256 int32
inline constexpr uint64_t kLlmcMaxTokens = INT32_MAX;  // the count is an int32

/// True when `head` (a file's first bytes) starts with an llm.c shard magic (GPT-2 or Llama 3).
bool looks_like_llmc_shard(std::string_view head);

/// Checks a shard's header and returns its token count. `head` holds the file's first bytes (at
/// least 1024 of them unless the file is shorter; a fuzzer passes the whole input), `file_size`
/// the size of the whole file. Throws DatasetError naming `source` and the byte offset: a file
/// shorter than the header, a wrong magic, an unsupported version, a negative count, and a count
/// that disagrees with the file size (1024 + 2 * count bytes).
uint64_t parse_llmc_header(std::string_view head, uint64_t file_size, const std::string& source);

/// One shard, opened and checked; tokens are read at any offset (pread), so seeking is free.
class LlmcShardReader {
 public:
  explicit LlmcShardReader(const std::filesystem::path& path);
  ~LlmcShardReader();
  LlmcShardReader(LlmcShardReader&& other) noexcept;
  LlmcShardReader(const LlmcShardReader&) = delete;
  LlmcShardReader& operator=(const LlmcShardReader&) = delete;
  LlmcShardReader& operator=(LlmcShardReader&&) = delete;

  uint64_t tokens() const { return tokens_; }
  const std::filesystem::path& path() const { return path_; }
  /// Copies up to out.size() ids starting at token `offset`; returns how many (0 at the end).
  size_t read(uint64_t offset, std::span<uint16_t> out) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t tokens_ = 0;
};

/// Writes one shard: tokens are appended, and finish() writes the header with the final count,
/// fsyncs and renames PATH.tmp over PATH, so a shard is either complete or absent. Destroyed
/// without finish(), it removes PATH.tmp.
class LlmcShardWriter {
 public:
  explicit LlmcShardWriter(std::filesystem::path path);

  /// Appends <|endoftext|> and then the document's ids (each must be < 65536). Throws
  /// std::invalid_argument when an id does not fit in uint16 or the shard would pass 2^31 - 1 tokens.
  void add_document(std::span<const uint32_t> tokens);
  uint64_t tokens() const { return tokens_; }
  uint64_t documents() const { return documents_; }
  /// Returns the file size.
  uint64_t finish();

 private:
  void flush();

  AtomicFile file_;  // PATH.tmp until finish(); removed if the writer is destroyed before
  std::vector<uint16_t> buf_;
  uint64_t tokens_ = 0, documents_ = 0;
};

/// Whether `file_name` follows llm.c's naming, `<prefix>_<split>_<index>.bin` or
/// `<prefix>_<split>.bin` (index 0), and if so its split and index.
bool parse_llmc_shard_name(const std::string& file_name, std::string& split, uint64_t& index);

/// The shard files of each split of an llm.c directory, in read order: split name -> paths.
/// Files that do not follow the naming are ignored; an empty map means it is not such a directory.
std::map<std::string, std::vector<std::filesystem::path>> llmc_splits(const std::filesystem::path& dir);

/// True when `dir` is a directory without manifest.json holding at least one llm.c-named shard.
bool is_llmc_dataset(const std::filesystem::path& dir);

/// The llm.c file name of shard `index` of a split: "<prefix>_<split>_<index, 6 digits>.bin".
std::string llmc_shard_name(const std::string& prefix, const std::string& split, size_t index);

}  // namespace pipeline::datasets
