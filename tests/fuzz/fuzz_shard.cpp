// Fuzzes the shard reader (compiled twice: FUZZ_SHARD_TOKENS selects token shards): any file
// either reads to its end or raises DatasetError naming it; nothing else escapes, and a shard
// that reads to its end hashes to the SHA-256 of its bytes.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "datasets/shards/sha256.h"
#include "datasets/shards/shard.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ds = pipeline::datasets;
  static fuzz_util::InputFile file;
  const std::string& path = file.write(data, size);
#ifdef FUZZ_SHARD_TOKENS
  const auto kind = ds::ShardKind::tokens;
#else
  const auto kind = ds::ShardKind::text;
#endif
  try {
    ds::ShardReader r(path, kind, /*hash=*/true);
    if (kind == ds::ShardKind::text) {
      std::string doc;
      while (r.next_document(doc)) {
      }
    } else {
      std::vector<uint16_t> buf(1000);
      while (r.read_tokens(buf) > 0) {
      }
    }
    if (!r.finished()) fuzz_util::broken("reader stopped before the end without an error");
    if (r.sha256_hex() != ds::sha256_hex(fuzz_util::as_text(data, size))) fuzz_util::broken("hash of the file differs");
  } catch (const ds::DatasetError& e) {
    if (std::string(e.what()).rfind(path, 0) != 0) fuzz_util::broken(std::string("error does not name the file: ") + e.what());
  }
  return 0;
}
