// Shard files: documents (text) or GPT-2 token ids (uint16) in one zstd frame with content
// checksums, behind a fixed 40-byte header. Streamed in bounded memory with ZSTD_decompressStream.
//
// Layout (all integers little-endian):
//   offset  0  u32  0x184D2A50  zstd skippable-frame magic, so `zstd -d` skips our header
//   offset  4  u32  32          skippable-frame payload size
//   offset  8  8 B  "PLSHTEXT" or "PLSHTOKN"   the shard kind
//   offset 16  u32  format version (kShardFormatVersion)
//   offset 20  u32  reserved, 0
//   offset 24  u64  documents in the shard
//   offset 32  u64  items: text bytes (text shards) or tokens (token shards)
//   offset 40  one zstd frame (content checksum on), then end of file.
// Text payload: per document a u32 byte length, then the document's bytes.
// Token payload: per document the end-of-text id 50256, then the document's ids as u16 (GPT-2
// training practice: EOT *before* each document, so every document is preceded by a boundary
// and a window that starts at an EOT starts a document).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/dataset_error.h"
#include "datasets/shards/sha256.h"
#include "base/atomic_file.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace pipeline::datasets {

enum class ShardKind { text, tokens };
const char* shard_kind_name(ShardKind kind);  // "text" / "tokens"

inline constexpr uint32_t kShardFormatVersion = 1;
inline constexpr size_t kShardHeaderBytes = 40;
inline constexpr uint16_t kShardEotId = 50256;  // document separator in token shards

struct ShardHeader {
  ShardKind kind = ShardKind::text;
  uint32_t version = kShardFormatVersion;
  uint64_t documents = 0;
  uint64_t items = 0;  // text bytes or tokens
};

struct ShardWriterOptions {
  int level = 3;  // zstd level; 19 for data that ships in the repository
};

/// Owners of the zstd contexts (freed by the deleters, whatever throws when).
struct ZstdCCtxFree {
  void operator()(ZSTD_CCtx_s* ctx) const;
};
struct ZstdDCtxFree {
  void operator()(ZSTD_DCtx_s* ctx) const;
};
struct FileClose {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

/// Writes one shard, to PATH.tmp until finish() renames it into place (base/atomic_file.h):
/// a writer destroyed without finish(), or one whose write failed, leaves no file behind.
class ShardWriter {
 public:
  struct Summary {
    std::filesystem::path path;
    uint64_t bytes = 0;  // file size
    uint64_t documents = 0;
    uint64_t items = 0;
    std::string sha256;
  };

  ShardWriter(const std::filesystem::path& path, ShardKind kind, ShardWriterOptions options = {});
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void add_document(std::string_view text);            // text shards only
  void add_document(std::span<const uint32_t> tokens);  // token shards only: writes EOT, then ids
  Summary finish();

  uint64_t documents() const { return documents_; }
  uint64_t items() const { return items_; }
  uint64_t payload_bytes() const { return payload_bytes_; }  // uncompressed bytes so far

 private:
  void compress(const void* data, size_t size);

  std::filesystem::path path_;
  ShardKind kind_;
  AtomicFile file_;
  std::unique_ptr<ZSTD_CCtx_s, ZstdCCtxFree> cctx_;
  bool finished_ = false;
  std::vector<char> out_buf_;
  std::vector<uint16_t> token_buf_;
  uint64_t documents_ = 0, items_ = 0, payload_bytes_ = 0;
};

/// Streams one shard. Memory is bounded by two fixed buffers plus zstd's window, whatever the
/// shard's size. Errors (DatasetError) name the file and byte offset: truncation, wrong magic,
/// wrong version, wrong kind, corrupt compressed data (zstd frame/checksum errors), trailing
/// bytes, and header counts that disagree with the stream.
class ShardReader {
 public:
  /// `hash` feeds every byte of the file through SHA-256 as it is read (see sha256_hex()).
  ShardReader(const std::filesystem::path& path, ShardKind expected_kind, bool hash = false);
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }

  /// Text shards: the next document; false once the shard is fully read and checked.
  bool next_document(std::string& document);
  /// Token shards: up to out.size() ids; 0 once the shard is fully read and checked.
  size_t read_tokens(std::span<uint16_t> out);
  /// Skip documents (text) or tokens (tokens) by decompressing and discarding them.
  void skip(uint64_t items);

  uint64_t documents_read() const { return documents_read_; }
  uint64_t items_read() const { return items_read_; }
  bool finished() const { return finished_; }
  /// SHA-256 of the whole file; only after finished() and only when constructed with hash=true.
  std::string sha256_hex();
  /// Most memory this reader has held at once: its buffers plus zstd's decompression context.
  size_t memory_high_water() const { return high_water_; }

 private:
  size_t read_payload(char* dst, size_t n);  // dst may be null to discard; short only at end
  bool refill();                             // false at the end of the frame
  void finish_checks();
  uint64_t compressed_offset() const;
  [[noreturn]] void fail(const std::string& what) const;

  std::filesystem::path path_;
  ShardKind kind_;
  ShardHeader header_;
  std::unique_ptr<std::FILE, FileClose> file_;
  std::unique_ptr<ZSTD_DCtx_s, ZstdDCtxFree> dctx_;
  std::vector<char> in_buf_, out_buf_;
  size_t in_pos_ = 0, in_end_ = 0, out_pos_ = 0, out_end_ = 0;
  uint64_t file_bytes_read_ = 0;
  bool frame_done_ = false, finished_ = false;
  uint64_t documents_read_ = 0, items_read_ = 0, payload_read_ = 0, eot_seen_ = 0;
  std::unique_ptr<Sha256> hash_;
  std::string digest_;
  size_t high_water_ = 0;
};

}  // namespace pipeline::datasets
