// Fuzzes the shard readers (compiled twice: FUZZ_SHARD_TOKENS selects token shards): any file
// either reads to its end or raises DatasetError naming it; nothing else escapes, and a shard
// that reads to its end hashes to the SHA-256 of its bytes. A block shard (format 2) is also read
// by random access, block by block through its index, as lanes read it: either that raises
// DatasetError naming the file, or, when both paths read it, they give the same payload.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "datasets/io/store.h"
#include "datasets/shards/block_shard.h"
#include "datasets/shards/sha256.h"
#include "datasets/shards/shard.h"
#include "fuzz_util.h"

namespace {

namespace ds = pipeline::datasets;

// The streamed payload: text documents (each with its length) or the token stream; false when
// the reader refused the file.
bool stream(const std::string& path, ds::ShardKind kind, std::string& payload, const uint8_t* data, size_t size) {
  try {
    ds::ShardReader r(path, kind, /*hash=*/true);
    if (kind == ds::ShardKind::text) {
      for (std::string doc; r.next_document(doc);) payload += std::to_string(doc.size()) + ":" + doc;
    } else {
      std::vector<uint16_t> buf(1000);
      for (size_t n; (n = r.read_tokens(buf)) > 0;) payload.append(reinterpret_cast<const char*>(buf.data()), 2 * n);
    }
    if (!r.finished()) fuzz_util::broken("reader stopped before the end without an error");
    if (r.sha256_hex() != ds::sha256_hex(fuzz_util::as_text(data, size))) fuzz_util::broken("hash of the file differs");
    return true;
  } catch (const ds::DatasetError& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) fuzz_util::broken(std::string("error does not name the file: ") + e.what());
    return false;
  }
}

// The same payload through the block index, block by block.
bool by_blocks(const std::string& path, ds::ShardKind kind, std::string& payload) {
  try {
    auto file = ds::io::open_local_file(path);
    const ds::BlockIndex index = ds::read_block_index(*file, kind);
    ds::BlockDecoder decoder;
    std::vector<char> block;
    for (size_t b = 0; b < index.blocks.size(); ++b) {
      decoder.decode(*file, kind, index.blocks[b], b, block);
      if (kind == ds::ShardKind::tokens) {
        payload.append(block.data(), block.size());
        continue;
      }
      for (size_t at = 0; at < block.size();) {  // the layout decode() checked
        uint32_t length = 0;
        for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(block[at + i]);
        payload += std::to_string(length) + ":" + std::string(block.data() + at + 4, length);
        at += 4 + size_t(length);
      }
    }
    return true;
  } catch (const ds::DatasetError& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) fuzz_util::broken(std::string("error does not name the file: ") + e.what());
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz_util::InputFile file;
  const std::string& path = file.write(data, size);
#ifdef FUZZ_SHARD_TOKENS
  const auto kind = ds::ShardKind::tokens;
#else
  const auto kind = ds::ShardKind::text;
#endif
  std::string streamed, blocked;
  const bool whole = stream(path, kind, streamed, data, size);
  if (size >= 20 && data[16] == ds::kShardFormatVersion && by_blocks(path, kind, blocked) && whole &&
      streamed != blocked)
    fuzz_util::broken("the streamed payload and the blocks' payload differ");
  return 0;
}
