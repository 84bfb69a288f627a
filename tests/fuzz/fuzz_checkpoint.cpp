// Fuzzes the checkpoint file reader (model/checkpoint/checkpoint_file, the torch-free half of
// read_checkpoint): any file either reads completely with a matching CRC-32 or raises
// std::runtime_error naming it; no allocation exceeds what the file holds.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "base/json.h"
#include "model/checkpoint/checkpoint_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz_util::InputFile file;
  const std::string& path = file.write(data, size);
  try {
    pipeline::model::CheckpointFileReader r(path);
    const std::string meta = r.read_metadata();
    std::vector<char> buf;
    for (uint32_t i = 0; i < r.header().tensor_count; ++i) {
      auto t = r.next_tensor();
      if (t.nbytes > size) fuzz_util::broken("tensor larger than the file passed the checks");
      buf.resize(t.nbytes);
      r.read_data(buf.data(), t.nbytes);
    }
    r.finish();
    try {
      (void)pipeline::json_parse(meta);  // resume reads the metadata as JSON
    } catch (const pipeline::JsonParseError&) {
    }
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find(path) == std::string::npos)
      fuzz_util::broken(std::string("error does not name the file: ") + e.what());
  }
  return 0;
}
