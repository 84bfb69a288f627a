// The token stream of one split as training sees it, from any kind of dataset, for evaluation:
// a prepared token dataset or llm.c shards as stored; a prepared text dataset, or a held-out
// Parquet source (its documents in file and row-group order), tokenized with <|endoftext|> before
// each document. One pass, no looping. Used by the eval stage (its fixed validation batches) and
// `pipeline eval --val` (the loss over a whole split). A remote source (s3://, https://, hf://,
// docs/remote.md) is read through its store, as one lane in the catalogue's order without
// shuffling: the same files, documents and tokens in the same order as its local copy.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "datasets/io/store.h"

namespace pipeline::datasets {

/// Example:
///   SplitTokens val;
///   val.open("datasets/data/tinyshakespeare/text", "val");
///   std::vector<uint16_t> buf(4096);
///   for (size_t n; (n = val.read(buf)) > 0;) use(std::span(buf).first(n));
class SplitTokens {
 public:
  SplitTokens();
  ~SplitTokens();
  SplitTokens(SplitTokens&&) noexcept;
  SplitTokens& operator=(SplitTokens&&) noexcept;

  /// `source`: a prepared dataset, llm.c shards (read `split`), or Parquet (the whole source; no
  /// split). Throws naming the source when it is none of these or has no split `split`.
  /// `store`: how a remote source is reached (a local one ignores it).
  void open(const std::filesystem::path& source, const std::string& split, const io::StoreOptions& store = {});
  /// Whether the source is Parquet, read whole (it has no splits).
  bool whole_source() const;
  /// Fills `out` as far as the data goes; 0 only at the end.
  size_t read(std::span<uint16_t> out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The first `n` tokens of a split (fewer when it holds fewer).
std::vector<uint16_t> read_split_tokens(const std::filesystem::path& source, const std::string& split, int64_t n,
                                        const io::StoreOptions& store = {});

}  // namespace pipeline::datasets
