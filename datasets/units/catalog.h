// A source's catalogue: its files and its units in canonical order (docs/data_order.md).
//
// A unit is a byte range of one file that decodes on its own into documents or tokens, the
// thing a lane reads, a cache fetches and a plan deals (datasets/plan/data_plan.h):
//
//   source                        unit                                   found from
//   prepared shards, format 2     one block (one zstd frame)             each shard's block index
//   prepared shards, format 1     the whole shard, or a range of its     the manifest
//                                 documents when the split has fewer
//                                 shards than lanes
//   llm.c .bin                    a range of `llmc_unit_tokens` tokens   the headers and sizes
//   Parquet                       one (non-empty) row group               the footers
//
// The catalogue is built from what the source says of itself, through its store
// (datasets/io/store.h), without decoding any payload: files sorted by path (llm.c: by shard
// index), units by offset within each file. It records each file as the store saw it (size and
// version), so a file that changes under a run is an error naming it when a lane opens it.
//
// Example:
//   auto store = io::open_store("datasets/data/tinyshakespeare/text");
//   Catalog c = build_catalog(*store, "datasets/data/tinyshakespeare/text", {.split = "train"});
//   for (const Unit& u : c.units) std::puts(c.describe(u).c_str());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "datasets/io/store.h"
#include "datasets/shards/manifest.h"

namespace pipeline::datasets {

/// What a source's units decode into.
enum class UnitContent { documents, tokens };

/// How a source's files are laid out, which decides its units.
enum class SourceFormat {
  shards_v1,  // prepared shards of format 1 (one frame a shard), text or tokens
  shards_v2,  // prepared block shards (one frame a block), text or tokens
  llmc,       // llm.c / modded-nanogpt .bin token shards
  parquet,    // Parquet files, one text column
};
const char* source_format_name(SourceFormat format);  // "shards (format 1)", ...

inline constexpr uint64_t kUnknownCount = UINT64_MAX;

struct Unit {
  uint32_t file = 0;     // index into Catalog::files
  uint64_t offset = 0;   // the unit's bytes in the file (format 1: the shard's frame, which a
  uint64_t bytes = 0;    //   document range is reached through by decompressing from its start)
  uint64_t place = 0;    // its number in the file: block, document range, token range, row group
  uint64_t first = 0;    // format 1: documents of the shard before the unit; llm.c: the index of
                         // the unit's first token in the file; Parquet: the row group's index
  uint64_t documents = kUnknownCount;  // documents it holds (unknown for llm.c and Parquet, whose
                                       // null rows are not documents)
  uint64_t items = kUnknownCount;      // what a lane cursor counts in it: documents (text shards),
                                       // rows (Parquet), tokens (token sources; unknown for format-1
                                       // token shards cut into document ranges)
  uint64_t text_bytes = kUnknownCount;  // text block shards: the block's text bytes, as its index
                                        // records them (its decoding is checked against them)
};

struct CatalogFile {
  io::ObjectInfo object;  // uri, size and version when the catalogue was built
  std::string name;       // as printed: the uri
};

struct Catalog {
  std::string source;  // as given
  SourceFormat format = SourceFormat::shards_v2;
  UnitContent content = UnitContent::documents;
  std::string column;  // Parquet: the text column
  std::vector<CatalogFile> files;
  std::vector<Unit> units;

  /// "FILE block 3 (bytes 40+20511)", "FILE row group 2", "FILE tokens 65536..98304"
  std::string describe(const Unit& unit) const;
  /// Documents (text) or tokens the catalogue knows the source to hold; kUnknownCount when a unit
  /// does not know.
  uint64_t items() const;
  /// A line for the run's log when the source reads slowly by lanes (shards of format 1 cut into
  /// document ranges, each reached by decompressing its shard from the start), saying what to
  /// do about it; empty otherwise. Say it once a run.
  std::string slow_reading_note() const;
};

struct CatalogOptions {
  std::string split = "train";   // prepared shards and llm.c: the split
  std::string column = "text";   // Parquet: the text column
  /// Format-1 shards fewer than this are cut into document ranges, enough for one per lane (the
  /// run's K). Other formats ignore it: their units do not depend on K.
  uint32_t lanes = 1;
  uint64_t llmc_unit_tokens = 32768;  // 64 KiB of llm.c tokens a unit
  /// Prepared shards: on_open hashes every shard of the split through the store and compares the
  /// manifest's SHA-256; off (and while_reading, which random access cannot do) checks sizes only,
  /// and each block's zstd checksum catches a corrupt block when it is read.
  VerifyMode verify = VerifyMode::off;
};

/// Builds the catalogue of `source` (a prepared dataset directory or its manifest.json, a
/// directory of llm.c shards, Parquet: a file, a directory, a glob), reading through `store`.
/// Throws DatasetError naming the source or file: no such source, no split, a shard whose size
/// differs from the manifest's, a bad header, index or footer, no units at all.
Catalog build_catalog(io::Store& store, const std::string& source, const CatalogOptions& options = {});

/// Throws DatasetError naming the first file of `catalog` whose size or version in `store` now
/// differs from what the catalogue recorded (a resumed run on data that changed).
void check_unchanged(io::Store& store, const Catalog& catalog);

}  // namespace pipeline::datasets
