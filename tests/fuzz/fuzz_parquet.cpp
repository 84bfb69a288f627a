// Fuzzes the Parquet reader's open-and-first-read path (Arrow C++ underneath): any bytes either
// give documents or raise DatasetError, never a crash; a file the in-memory path reads gives the
// same first documents through the file reader (its own decoding thread, the footer checks of
// open()) unless that reader refuses it with a DatasetError. Seeds: small files written by
// tests/parquet/make_files.py (codecs, nulls, an empty row group, large_string, wrong columns).
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/parquet/parquet_reader.h"
#include "datasets/shards/shard.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipeline::datasets;
  constexpr size_t kDocuments = 8;
  std::vector<std::string> first;
  try {
    first = read_parquet_buffer(fuzz_util::as_text(data, size), "fuzz.parquet", "text", kDocuments);
  } catch (const DatasetError&) {
    return 0;
  }
  if (first.size() > kDocuments) fuzz_util::broken("more documents than asked for");

  static fuzz_util::InputFile file;
  const auto& path = file.write(data, size);
  try {
    ParquetDocumentReader reader;
    ParquetReaderOptions options;
    options.shuffle = false;
    options.read_ahead_bytes = 1 << 20;
    reader.open(path, {}, /*loop=*/false, options);
    std::string doc;
    for (size_t i = 0; i < first.size(); ++i) {
      if (!reader.next(doc)) fuzz_util::broken("the file reader ends before the in-memory path's documents");
      if (doc != first[i]) fuzz_util::broken("the file reader and the in-memory path disagree on a document");
    }
  } catch (const DatasetError&) {
    // Refused by a check the first-read path does not make (every row group's count, later pages).
  }
  return 0;
}
