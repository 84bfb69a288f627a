// Fuzzes the llm.c / modded-nanogpt shard reader: any bytes either give a token count that
// matches the file (1024-byte header + 2 bytes a token) or raise DatasetError; a shard that opens
// reads back exactly its tokens, the same from any offset.
#include <cstdint>
#include <cstring>
#include <vector>

#include "datasets/llmc/llmc_shard.h"
#include "datasets/shards/shard.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipeline::datasets;
  uint64_t count = 0;
  try {
    count = parse_llmc_header(fuzz_util::as_text(data, size), size, "fuzz_train_000000.bin");
  } catch (const DatasetError&) {
    return 0;
  }
  if (kLlmcHeaderBytes + 2 * count != size) fuzz_util::broken("a count that disagrees with the file size was accepted");

  static fuzz_util::InputFile file;
  const auto& path = file.write(data, size);
  try {
    LlmcShardReader reader(path);
    if (reader.tokens() != count) fuzz_util::broken("the reader counts other tokens than the header");
    std::vector<uint16_t> all(count + 1);
    const size_t n = reader.read(0, {all.data(), all.size()});
    if (n != count) fuzz_util::broken("a whole read returned another count");
    if (count && std::memcmp(all.data(), data + kLlmcHeaderBytes, 2 * count) != 0) fuzz_util::broken("tokens differ from the file's");
    const uint64_t mid = count / 2;
    std::vector<uint16_t> tail(count - mid + 1);
    if (reader.read(mid, {tail.data(), tail.size()}) != count - mid) fuzz_util::broken("a read from the middle returned another count");
    if (count - mid && std::memcmp(tail.data(), all.data() + mid, 2 * (count - mid)) != 0) fuzz_util::broken("a read from the middle differs");
    if (reader.read(count, {tail.data(), tail.size()}) != 0) fuzz_util::broken("a read at the end returned tokens");
  } catch (const DatasetError& e) {
    fuzz_util::broken(std::string("a header that parses fails to read: ") + e.what());
  }
  return 0;
}
