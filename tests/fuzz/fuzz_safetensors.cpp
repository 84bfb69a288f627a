// Fuzzes the safetensors reader: any bytes either give a header that keeps the format's promises
// or raise DatasetError. A header that parses has every tensor's bytes inside the file, in order,
// without gap or overlap, sized as its dtype and shape say; the reader then reads each one whole.
#include <cstdint>
#include <vector>

#include "datasets/weights/safetensors.h"
#include "datasets/shards/shard.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipeline::datasets;
  SafetensorsHeader h;
  try {
    h = parse_safetensors_header(fuzz_util::as_text(data, size), size, "fuzz.safetensors");
  } catch (const DatasetError&) {
    return 0;
  }
  if (h.data_start < 8 || h.data_start > size) fuzz_util::broken("data buffer starts outside the file");
  uint64_t at = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != at) fuzz_util::broken(t.name + ": a gap or an overlap before it");
    if (t.end < t.begin || t.end > size - h.data_start) fuzz_util::broken(t.name + ": bytes outside the file");
    if (t.numel() * safetensors_dtype_size(t.dtype) != t.bytes()) fuzz_util::broken(t.name + ": size disagrees with its shape");
    if (h.find(t.name) != &t) fuzz_util::broken(t.name + ": find() does not return it");
    at = t.end;
  }

  static fuzz_util::InputFile file;
  const auto& path = file.write(data, size);
  try {
    SafetensorsReader reader(path);
    if (reader.header().tensors.size() != h.tensors.size()) fuzz_util::broken("the reader sees other tensors");
    std::vector<uint8_t> buf;
    for (const auto& t : reader.header().tensors) {
      buf.resize(t.bytes());
      reader.read(t, buf.data());
      for (uint64_t i = 0; i < t.bytes(); ++i)
        if (buf[i] != data[h.data_start + t.begin + i]) fuzz_util::broken(t.name + ": read other bytes than the file's");
    }
  } catch (const DatasetError& e) {
    fuzz_util::broken(std::string("a header that parses fails to read: ") + e.what());
  }
  return 0;
}
