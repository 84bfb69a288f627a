// A block shard read by random access (block_shard.h).
#include "datasets/shards/block_shard.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "datasets/shards/shard_bytes.h"

namespace pipeline::datasets {

using namespace shard_bytes;

BlockIndex read_block_index(io::RangeFile& file, ShardKind kind) {
  const std::string& name = file.name();
  auto fail = [&](const std::string& what) { return DatasetError(name + ": " + what); };
  const uint64_t size = file.size();
  unsigned char h[kShardHeaderBytes] = {};
  const size_t got = file.read_at(0, h, sizeof h);
  if (got < kShardHeaderBytes)
    throw fail("truncated: file is " + std::to_string(size) + " bytes, shorter than the " +
               std::to_string(kShardHeaderBytes) + "-byte shard header");
  const char* magic = kind == ShardKind::text ? kTextMagic : kTokensMagic;
  if (get_u32(h) != kHeaderMagic || get_u32(h + 4) != kShardHeaderBytes - 8 || std::memcmp(h + 8, magic, 8) != 0)
    throw fail("wrong magic at byte offset 0: not a pipeline " + std::string(shard_kind_name(kind)) +
               " shard (found " + hex_bytes(h, 16) + ")");
  BlockIndex index;
  index.header = {kind, get_u32(h + 16), get_u64(h + 24), get_u64(h + 32)};
  if (index.header.version != kShardFormatVersion)
    throw fail("format version " + std::to_string(index.header.version) + " at byte offset 16 has no block index (" +
               "version 2 shards do; `pipeline prepare` writes them)");
  if (size < kShardHeaderBytes + 8 + kIndexTailBytes)
    throw fail("truncated: file is " + std::to_string(size) + " bytes, too short for a block shard's header and index");
  unsigned char tail[kIndexTailBytes];
  if (file.read_at(size - kIndexTailBytes, tail, sizeof tail) != sizeof tail)
    throw fail("truncated: cannot read the block index's last 16 bytes");
  if (std::memcmp(tail + 8, kIndexEnd, 8) != 0)
    throw fail("no block index: the file does not end with \"PLSHBLKS\" (byte offset " +
               std::to_string(size - 8) + ", found " + hex_bytes(tail + 8, 8) + "): truncated, or not a block shard");
  const uint64_t n = get_u64(tail);
  const uint64_t room = size - kShardHeaderBytes - 8 - kIndexTailBytes;
  if (n > room / kIndexEntryBytes)
    throw fail("corrupt block index: it counts " + std::to_string(n) + " blocks (byte offset " +
               std::to_string(size - kIndexTailBytes) + "), more than the file's " + std::to_string(size) + " bytes hold");
  const uint64_t at = size - kIndexTailBytes - kIndexEntryBytes * n - 8;
  std::vector<unsigned char> bytes(8 + kIndexEntryBytes * n);
  if (file.read_at(at, bytes.data(), bytes.size()) != bytes.size()) throw fail("truncated: cannot read the block index");
  if (get_u32(bytes.data()) != kIndexMagic || get_u32(bytes.data() + 4) != kIndexEntryBytes * n + kIndexTailBytes)
    throw fail("corrupt block index at byte offset " + std::to_string(at) + ": its frame header (" +
               hex_bytes(bytes.data(), 8) + ") does not hold " + std::to_string(n) + " blocks");
  uint64_t next = kShardHeaderBytes, documents = 0, items = 0;
  for (uint64_t b = 0; b < n; ++b) {
    const unsigned char* e = bytes.data() + 8 + kIndexEntryBytes * b;
    ShardBlock block{get_u64(e), get_u64(e + 8), get_u64(e + 16), get_u64(e + 24)};
    if (block.offset != next || block.bytes == 0 || block.bytes > at - next || block.documents == 0)
      throw fail("corrupt block index entry " + std::to_string(b) + " (byte offset " +
                 std::to_string(at + 8 + kIndexEntryBytes * b) + "): a block of " + std::to_string(block.documents) +
                 " documents at byte offset " + std::to_string(block.offset) + ", " + std::to_string(block.bytes) +
                 " bytes, where the blocks tile bytes " + std::to_string(next) + " to " + std::to_string(at));
    next += block.bytes;
    documents += block.documents;
    items += block.items;
    index.blocks.push_back(block);
  }
  if (next != at)
    throw fail("corrupt block index at byte offset " + std::to_string(at) + ": its blocks end at byte offset " +
               std::to_string(next) + ", not where the index begins");
  if (documents != index.header.documents || items != index.header.items)
    throw fail("the block index counts " + std::to_string(documents) + " documents and " + std::to_string(items) +
               " items, the header (byte offset 24) " + std::to_string(index.header.documents) + " and " +
               std::to_string(index.header.items));
  return index;
}

BlockDecoder::BlockDecoder() : dctx_(ZSTD_createDCtx()) {
  if (!dctx_) throw DatasetError("cannot allocate a zstd decompression context");
}
BlockDecoder::~BlockDecoder() = default;

size_t BlockDecoder::memory() const { return ZSTD_sizeof_DCtx(dctx_.get()) + compressed_.capacity(); }

void BlockDecoder::decode(io::RangeFile& file, ShardKind kind, const ShardBlock& block, uint64_t number,
                          std::vector<char>& payload) {
  const std::string where = file.name() + ": block " + std::to_string(number) + " (bytes " +
                            std::to_string(block.offset) + ".." + std::to_string(block.offset + block.bytes) + ")";
  auto fail = [&](const std::string& what) { return DatasetError(where + ": " + what); };
  const bool text = kind == ShardKind::text;
  // The payload the index implies, checked against what the frame could decode to before
  // anything is allocated for it: a zstd block of 4 bytes or more decodes to at most 128 KiB.
  const uint64_t most = std::min<uint64_t>(block.bytes, uint64_t(1) << 40) * 32768;
  if (block.documents > most || block.items > most || payload_bytes(text, block.documents, block.items) > most)
    throw fail("the index records " + std::to_string(block.documents) + " documents and " + std::to_string(block.items) +
               " items, more than " + std::to_string(block.bytes) + " compressed bytes can hold");
  const uint64_t expected = payload_bytes(text, block.documents, block.items);
  compressed_.resize(block.bytes);
  if (file.read_at(block.offset, compressed_.data(), compressed_.size()) != compressed_.size())
    throw fail("truncated: the file ends at byte offset " + std::to_string(file.size()));
  const auto* head = reinterpret_cast<const unsigned char*>(compressed_.data());
  if (block.bytes < 6 || get_u32(head) != kZstdFrameMagic)
    throw fail("corrupt: no zstd frame at byte offset " + std::to_string(block.offset));
  if ((head[4] & 0x04) == 0) throw fail("the zstd frame has no content checksum; shards must be written with checksums on");
  const size_t frame = ZSTD_findFrameCompressedSize(compressed_.data(), compressed_.size());
  if (ZSTD_isError(frame) || frame != block.bytes)
    throw fail("corrupt: the zstd frame " +
               (ZSTD_isError(frame) ? std::string("cannot be delimited: ") + ZSTD_getErrorName(frame)
                                    : "is " + std::to_string(frame) + " bytes, the index records " + std::to_string(block.bytes)));
  const unsigned long long content = ZSTD_getFrameContentSize(compressed_.data(), compressed_.size());
  if (content != expected)
    throw fail("the zstd frame holds " +
               (content == ZSTD_CONTENTSIZE_UNKNOWN || content == ZSTD_CONTENTSIZE_ERROR ? std::string("an unrecorded number of")
                                                                                         : std::to_string(content)) +
               " payload bytes; the index's " + std::to_string(block.documents) + " documents and " +
               std::to_string(block.items) + " items make " + std::to_string(expected));
  payload.resize(expected);
  const size_t n = ZSTD_decompressDCtx(dctx_.get(), payload.data(), payload.size(), compressed_.data(), compressed_.size());
  if (ZSTD_isError(n)) throw fail(std::string("corrupt compressed data: zstd: ") + ZSTD_getErrorName(n));
  if (n != expected) throw fail("decoded " + std::to_string(n) + " payload bytes, expected " + std::to_string(expected));
  // Whole documents, as many as the index says.
  uint64_t documents = 0, items = 0;
  if (text) {
    for (size_t at = 0; at < payload.size(); ++documents) {
      if (payload.size() - at < 4) throw fail("the payload ends inside the length prefix of document " + std::to_string(documents));
      const uint32_t length = get_u32(reinterpret_cast<const unsigned char*>(payload.data() + at));
      at += 4;
      if (length > payload.size() - at)
        throw fail("document " + std::to_string(documents) + " claims " + std::to_string(length) + " bytes, the block holds " +
                   std::to_string(payload.size() - at) + " more");
      at += length;
      items += length;
    }
  } else {
    const auto* ids = reinterpret_cast<const uint16_t*>(payload.data());
    items = payload.size() / 2;
    if (items > 0 && ids[0] != kShardEotId)
      throw fail("the block does not start with an end-of-text id (50256): a block holds whole documents");
    documents = static_cast<uint64_t>(std::count(ids, ids + items, kShardEotId));
  }
  if (documents != block.documents || items != block.items)
    throw fail("the payload holds " + std::to_string(documents) + " documents and " + std::to_string(items) +
               " items, the index records " + std::to_string(block.documents) + " and " + std::to_string(block.items));
}

}  // namespace pipeline::datasets
