// Shard files: documents (text) or GPT-2 token ids (uint16) compressed with zstd (content
// checksums on), behind a fixed 40-byte header. Streamed in bounded memory with
// ZSTD_decompressStream; a block shard's blocks are also read one at a time by random access
// (block_shard.h).
//
// Layout (all integers little-endian):
//   offset  0  u32  0x184D2A50  zstd skippable-frame magic, so `zstd -d` skips our header
//   offset  4  u32  32          skippable-frame payload size
//   offset  8  8 B  "PLSHTEXT" or "PLSHTOKN"   the shard kind
//   offset 16  u32  format version: 1 or 2
//   offset 20  u32  reserved, 0
//   offset 24  u64  documents in the shard
//   offset 32  u64  items: text bytes (text shards) or tokens (token shards)
//   offset 40  format 1: one zstd frame, then end of file.
//              format 2 (block shards): blocks, each one zstd frame of whole documents (about
//              ShardWriterOptions::block_bytes of payload, more when one document is larger),
//              then the block index in a skippable frame (magic 0x184D2A5B), which ends the file:
//                u32 0x184D2A5B, u32 32 * N + 16, then per block {u64 offset of its frame,
//                u64 its compressed bytes, u64 documents, u64 items}, u64 N, 8 B "PLSHBLKS"
//              The index is found from the file's last 16 bytes. `zstd -d` skips it (and the
//              header) and writes the payload of every block, in order: the payload a format-1
//              shard holds.
// Text payload: per document a u32 byte length, then the document's bytes.
// Token payload: per document the end-of-text id 50256, then the document's ids as u16 (GPT-2
// training practice: EOT *before* each document, so every document is preceded by a boundary
// and a window that starts at an EOT starts a document).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/atomic_file.h"
#include "datasets/dataset_error.h"
#include "datasets/io/store.h"
#include "datasets/shards/sha256.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace pipeline::datasets {

enum class ShardKind { text, tokens };
const char* shard_kind_name(ShardKind kind);  // "text" / "tokens"

inline constexpr uint32_t kShardFormatVersion = 2;       // what the writer writes by default
inline constexpr uint32_t kShardFormatOneFrame = 1;      // still read
inline constexpr size_t kShardHeaderBytes = 40;
inline constexpr uint64_t kDefaultBlockBytes = 64 << 10;  // a block shard's payload a block
inline constexpr uint16_t kShardEotId = 50256;  // document separator in token shards

struct ShardHeader {
  ShardKind kind = ShardKind::text;
  uint32_t version = kShardFormatVersion;
  uint64_t documents = 0;
  uint64_t items = 0;  // text bytes or tokens
};

struct ShardWriterOptions {
  int level = 3;  // zstd level; 19 for data that ships in the repository
  /// Format 2: a block is closed once its payload reaches this many bytes (whole documents, so
  /// a block is larger when one document is). 0 writes format 1: the whole shard one frame.
  uint64_t block_bytes = kDefaultBlockBytes;
};

/// One block of a block shard, as its index records it.
struct ShardBlock {
  uint64_t offset = 0;     // of its zstd frame in the file
  uint64_t bytes = 0;      // the frame's compressed size
  uint64_t documents = 0;
  uint64_t items = 0;      // text bytes or tokens
};

/// Owners of the zstd contexts (freed by the deleters, whatever throws when).
struct ZstdCCtxFree {
  void operator()(ZSTD_CCtx_s* ctx) const;
};
struct ZstdDCtxFree {
  void operator()(ZSTD_DCtx_s* ctx) const;
};

/// Writes one shard, to PATH.tmp until finish() renames it into place (base/atomic_file.h):
/// a writer destroyed without finish(), or one whose write failed, leaves no file behind.
/// Format 2 (block shards) unless options.block_bytes is 0.
class ShardWriter {
 public:
  struct Summary {
    std::filesystem::path path;
    uint64_t bytes = 0;  // file size
    uint64_t documents = 0;
    uint64_t items = 0;
    std::string sha256;
    uint64_t blocks = 0;  // format 2; 0 for format 1
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
  void end_document(uint64_t items);
  void flush_block();  // format 2: the block so far becomes one frame

  std::filesystem::path path_;
  ShardKind kind_;
  ShardWriterOptions options_;
  AtomicFile file_;
  std::unique_ptr<ZSTD_CCtx_s, ZstdCCtxFree> cctx_;
  bool finished_ = false;
  std::vector<char> out_buf_;
  std::vector<uint16_t> token_buf_;
  uint64_t documents_ = 0, items_ = 0, payload_bytes_ = 0;
  // Format 2: the open block's payload and counts, and the blocks written.
  std::vector<char> block_;
  uint64_t block_documents_ = 0, block_items_ = 0;
  std::vector<ShardBlock> blocks_;
};

/// Streams one shard of either format, from its start. Memory is bounded by two fixed buffers
/// plus zstd's window, whatever the shard's size. Errors (DatasetError) name the file and byte
/// offset: truncation, wrong magic, wrong version, wrong kind, corrupt compressed data (zstd
/// frame/checksum errors), trailing bytes, a block index that disagrees with the blocks, and
/// header counts that disagree with the stream.
class ShardReader {
 public:
  /// `hash` feeds every byte of the file through SHA-256 as it is read (see sha256_hex()).
  ShardReader(const std::filesystem::path& path, ShardKind expected_kind, bool hash = false);
  /// The same through a store's file (datasets/io/store.h).
  ShardReader(std::unique_ptr<io::RangeFile> file, ShardKind expected_kind, bool hash = false);
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
  bool refill();                             // false at the end of the last frame
  size_t fetch(void* dst, size_t n);         // the file's next bytes, hashed when asked
  bool next_frame(uint64_t at);              // format 2, at a frame's end: false at the index
  void check_frame_header(uint64_t at, const unsigned char* head, size_t n) const;
  void finish_checks();
  uint64_t compressed_offset() const;
  [[noreturn]] void fail(const std::string& what) const;

  std::filesystem::path path_;
  ShardKind kind_;
  ShardHeader header_;
  std::unique_ptr<io::RangeFile> file_;
  std::unique_ptr<ZSTD_DCtx_s, ZstdDCtxFree> dctx_;
  std::vector<char> in_buf_, out_buf_;
  size_t in_pos_ = 0, in_end_ = 0, out_pos_ = 0, out_end_ = 0;
  uint64_t file_bytes_read_ = 0;  // the file's bytes fetched so far (from its start)
  bool frame_done_ = false, finished_ = false;
  std::vector<ShardBlock> frames_;  // format 2: the block frames seen, for the index to match
  uint64_t documents_read_ = 0, items_read_ = 0, payload_read_ = 0, eot_seen_ = 0;
  std::unique_ptr<Sha256> hash_;
  std::string digest_;
  size_t high_water_ = 0;
};

}  // namespace pipeline::datasets
