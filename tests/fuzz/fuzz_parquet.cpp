// Fuzzes the Parquet reader's open-and-first-read path (Arrow C++ underneath): any bytes either
// give documents or raise DatasetError, never a crash; a file the in-memory path reads gives the
// same first documents through the file reader (its own decoding thread, the footer checks of
// open()) unless that reader refuses it with a DatasetError, and through the row cursors lanes
// read a row group with (parquet_module.h: open_rows), which give them or raise DatasetError. Seeds: small files written by
// tests/parquet/make_files.py (codecs, nulls, an empty row group, large_string, wrong columns).
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/parquet/parquet_module.h"
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

  try {  // the row cursors, one row group after another
    const std::string bytes(fuzz_util::as_text(data, size));
    const auto f = parquet_module("fuzz.parquet").open_buffer(bytes, "fuzz.parquet", "text");
    std::vector<std::string> pulled;
    for (int g = 0; g < f->row_groups() && pulled.size() < first.size(); ++g) {
      f->row_group_range(g);
      const auto cursor = f->open_rows(g, "fuzz.parquet: row group " + std::to_string(g), 3);
      std::string_view text;
      bool null = false;
      while (pulled.size() < first.size() && cursor->next(text, null))
        if (!null) pulled.emplace_back(text);
    }
    if (pulled != first) fuzz_util::broken("the row cursors and the callback path disagree on the first documents");
  } catch (const DatasetError&) {
    // Refused by a check the callback path does not make (the row group's byte range).
  }

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
