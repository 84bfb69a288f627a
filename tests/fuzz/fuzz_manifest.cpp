// Fuzzes the dataset manifest reader: any bytes either parse or raise DatasetError; a parsed
// manifest written back and read again is the same manifest.
#include <cstdint>

#include "datasets/shards/manifest.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pipeline::datasets::Manifest;
  Manifest m;
  try {
    m = Manifest::parse(fuzz_util::as_text(data, size), "fuzz/manifest.json");
  } catch (const pipeline::datasets::DatasetError&) {
    return 0;
  }
  const std::string json = m.to_json();
  Manifest again;
  try {
    again = Manifest::parse(json, "fuzz/rewritten.json");
  } catch (const pipeline::datasets::DatasetError& e) {
    fuzz_util::broken(std::string("a manifest we wrote does not read back: ") + e.what() + "\n" + json);
  }
  if (again.to_json() != json) fuzz_util::broken("manifest round trip changed it:\n" + json);
  return 0;
}
