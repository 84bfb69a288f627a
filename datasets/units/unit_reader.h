// Reading one unit of a catalogue (catalog.h) by random access through its store: a lane opens
// its units one at a time and holds at most one open (docs/data_order.md).
//
//   block shards (format 2)   the block's frame is read by its byte range and decoded whole: the
//                             unit holds its payload (about the shard's block bytes)
//   shards of format 1        the shard's frame is streamed from its start, skipping the
//                             documents before the unit's range: correct, but a unit late in a
//                             large shard costs decompressing what precedes it, and the stream
//                             holds zstd's window (up to 8 MiB at level 19)
//   llm.c                     the unit's tokens are read where they lie, as asked for
//   Parquet                   a row cursor over the row group (parquet_module.h): one batch of
//                             rows and Arrow's page buffers, never the whole row group
//
// A UnitOpener belongs to one thread (a read stage's, for the lanes it serves): it keeps what
// its units share (a zstd context, the compressed bytes of a block, the Parquet files it has
// opened, each footer read once).
//
// Example:
//   UnitOpener opener(store, catalog);
//   auto unit = opener.documents(7);
//   std::string_view doc;
//   for (uint64_t item; unit->next(doc, item);) use(doc);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "datasets/io/store.h"
#include "datasets/units/catalog.h"

namespace pipeline::datasets {

/// A unit of documents, open.
class DocumentUnit {
 public:
  virtual ~DocumentUnit() = default;
  /// The next document, a view valid until the next call, and its item (its index in the unit;
  /// Parquet: its row, null rows counted but never returned); false at the end of the unit,
  /// after checking that the unit held what the catalogue says.
  virtual bool next(std::string_view& document, uint64_t& item) = 0;
  /// Passes over the first `items` items; only before the first next(). Throws DatasetError when
  /// the unit holds fewer.
  virtual void skip(uint64_t items) = 0;
  /// Bytes this unit holds: its decoded payload or decoder state.
  virtual size_t memory() const = 0;
};

/// A unit of tokens, open.
class TokenUnit {
 public:
  virtual ~TokenUnit() = default;
  /// Up to out.size() of the unit's next tokens; 0 at the end of the unit (after checking that
  /// it held what the catalogue says).
  virtual size_t read(std::span<uint16_t> out) = 0;
  /// Passes over the first `tokens` tokens; only before the first read(). Throws DatasetError
  /// when the unit holds fewer.
  virtual void skip(uint64_t tokens) = 0;
  /// Tokens read or skipped so far: the offset in the unit of the next token.
  virtual uint64_t offset() const = 0;
  virtual size_t memory() const = 0;
};

class UnitOpener {
 public:
  UnitOpener(io::Store& store, std::shared_ptr<const Catalog> catalog);
  ~UnitOpener();
  UnitOpener(const UnitOpener&) = delete;
  UnitOpener& operator=(const UnitOpener&) = delete;

  const Catalog& catalog() const { return *catalog_; }
  /// Opens unit `unit` (< catalog().units.size()) of a document source. Throws DatasetError
  /// naming the file (and the byte range or row group): a changed file, a corrupt block.
  std::unique_ptr<DocumentUnit> documents(uint64_t unit);
  /// The same for a token source.
  std::unique_ptr<TokenUnit> tokens(uint64_t unit);
  /// Bytes the opener itself holds (zstd context, buffers, Parquet footers).
  size_t memory() const;

  struct Shared;  // what its units share (unit_reader.cpp)

 private:
  io::Store& store_;
  std::shared_ptr<const Catalog> catalog_;
  std::unique_ptr<Shared> shared_;
};

}  // namespace pipeline::datasets
