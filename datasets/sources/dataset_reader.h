// Readers the training stages use to stream a prepared dataset split (text documents or
// token ids) shard after shard, optionally looping over epochs, with a position that
// resumes exactly where an earlier reader stopped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/plan/partition.h"
#include "datasets/plan/position.h"
#include "datasets/shards/manifest.h"
#include "datasets/shards/shard.h"

namespace pipeline::datasets {

struct DatasetReaderOptions {
  VerifyMode verify = VerifyMode::on_open;
  /// Data-parallel ranks: read only this rank's documents (partition.h). Positions still count
  /// every document (text) or token (tokens) of the shard, so they mean the same on every rank.
  /// With `partition.done` (a resume), the reader starts at the first document left and ignores
  /// the start position it is given.
  Partition partition = {};
};

namespace detail {
/// What the text and token readers share: manifest, split, current shard, position, looping.
class SplitCursor {
 public:
  void open(const std::filesystem::path& manifest_dir, const std::string& split, DatasetPosition start, bool loop,
            const DatasetReaderOptions& options, ShardKind kind);
  /// The current shard's reader, opening the next shard (and wrapping epochs when looping)
  /// as needed; nullptr at the end of a non-looping split.
  ShardReader* current();
  /// The current shard ended: check its hash if asked, move to the next.
  void shard_done();
  /// Tokens: skips `tokens` tokens of the current shard through the filter.
  void skip_filtered(uint64_t tokens);
  void consumed(uint64_t items) { position_.item += items; }
  /// Text: the document at the current position.
  DocKey next_document() const {
    return {position_.epoch, position_.shard, position_.item, first_document_[position_.shard] + position_.item};
  }

  DatasetPosition position_;
  Manifest manifest_;
  std::filesystem::path dir_;
  std::string split_;
  std::vector<ShardInfo> shards_;
  std::vector<bool> verified_;
  std::unique_ptr<ShardReader> reader_;
  bool loop_ = false;
  bool open_ = false;
  DatasetReaderOptions options_;
  ShardKind kind_ = ShardKind::text;
  size_t high_water_ = 0;
  std::vector<uint64_t> first_document_;  // per shard: global index of its first document
  TokenDocumentFilter filter_;            // tokens: the current shard's filter
  std::optional<DocMark> pending_;        // tokens: the document a resumed stream continues
};
}  // namespace detail

/// Text documents of one split. Single-threaded; one reader per consumer.
/// Example:
///   TextDatasetReader r;
///   r.open("datasets/data/tinyshakespeare/text", "train");
///   for (std::string doc; r.next(doc);) use(doc);
class TextDatasetReader {
 public:
  void open(const std::filesystem::path& manifest_dir, const std::string& split, DatasetPosition start = {},
            bool loop = false, DatasetReaderOptions options = {});
  /// The next document; false at the end of the split when not looping. `mark` (optional)
  /// receives its place and the tokens of it to drop (partition.h).
  bool next(std::string& document, DocMark* mark = nullptr);
  DatasetPosition position() const { return c_.position_; }
  const Manifest& manifest() const { return c_.manifest_; }
  /// Most memory any of this reader's shard readers held at once (buffers + zstd context).
  size_t memory_high_water() const;

 private:
  detail::SplitCursor c_;
};

class LlmcSplitReader;

/// Token ids (uint16, an EOT 50256 before every document) of one split: of a prepared token
/// dataset, or of a directory of llm.c shards (detected by open(), read by LlmcSplitReader).
class TokenDatasetReader {
 public:
  TokenDatasetReader();
  ~TokenDatasetReader();
  TokenDatasetReader(TokenDatasetReader&&) noexcept;
  TokenDatasetReader& operator=(TokenDatasetReader&&) noexcept;

  void open(const std::filesystem::path& manifest_dir, const std::string& split, DatasetPosition start = {},
            bool loop = false, DatasetReaderOptions options = {});
  /// Fills `out` as far as the data goes, crossing shard (and, when looping, epoch) boundaries;
  /// returns the count, 0 only at the end of a non-looping split. `marks` (optional) receives a
  /// mark per document that starts in `out` (at: its index there), and one at 0 for the document
  /// a resumed stream continues.
  size_t read(std::span<uint16_t> out, std::vector<DocMark>* marks = nullptr);
  DatasetPosition position() const;
  const Manifest& manifest() const;
  size_t memory_high_water() const;

 private:
  detail::SplitCursor c_;
  std::unique_ptr<LlmcSplitReader> llmc_;  // set when the directory holds llm.c shards
};

}  // namespace pipeline::datasets
