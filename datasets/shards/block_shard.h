// Random access to a block shard (format 2, shard.h): its block index, and one block read by its
// byte range and decoded on its own. What a lane reads a unit of prepared data with
// (datasets/units/), through any store's file.
//
// Example:
//   auto file = io::open_local_file("data/mine/train_00000.text.zst");
//   BlockIndex index = read_block_index(*file, ShardKind::text);
//   BlockDecoder decoder;
//   std::vector<char> payload;
//   decoder.decode(*file, ShardKind::text, index.blocks[3], 3, payload);
//   for (BlockDocuments d(payload); ...)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "datasets/io/store.h"
#include "datasets/shards/shard.h"

namespace pipeline::datasets {

struct BlockIndex {
  ShardHeader header;
  std::vector<ShardBlock> blocks;
};

/// The header and block index of a block shard, in two reads (its first 40 bytes, its index from
/// the end). Checks the header (magic, kind, version 2), the index (closing magic, count, frame
/// size), that the blocks tile the file from byte 40 to the index, and that their counts add up
/// to the header's. Throws DatasetError naming the file and the byte offset.
BlockIndex read_block_index(io::RangeFile& file, ShardKind kind);

/// Decodes blocks one at a time: holds a zstd context and the compressed bytes of the last block
/// read. One per thread.
class BlockDecoder {
 public:
  BlockDecoder();
  ~BlockDecoder();
  BlockDecoder(const BlockDecoder&) = delete;
  BlockDecoder& operator=(const BlockDecoder&) = delete;

  /// Reads block `number` (`block`, from the index) of `file` and decodes its payload into
  /// `payload` (resized to fit). Checks the frame (magic, content checksum, one frame filling the
  /// block's bytes, the payload size the index implies) and then that the payload holds the
  /// index's documents and items (text: length prefixes; tokens: an end-of-text id starting each
  /// document). Throws DatasetError naming the file, the block and its byte range.
  void decode(io::RangeFile& file, ShardKind kind, const ShardBlock& block, uint64_t number,
              std::vector<char>& payload);
  /// Bytes it holds (the zstd context and the compressed buffer).
  size_t memory() const;

 private:
  std::unique_ptr<ZSTD_DCtx_s, ZstdDCtxFree> dctx_;
  std::vector<char> compressed_;
};

}  // namespace pipeline::datasets
