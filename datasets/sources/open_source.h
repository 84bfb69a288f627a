// The one place a training source is opened, torch-free: the read stages open what they read
// through it, and `pipeline check` opens the same sources the same way to know that a run will
// (a dry run). A source is a prepared dataset's split (text or tokens), llm.c shards, Parquet,
// or a weighted mix of documents from several of these. In the documents order it is opened as a
// stream from a start position: the manifest, the shards (present, of their size, hashed as the
// reader's options say), Parquet's files and column, and the position checked. In the lanes
// order ([data] order = "lanes", docs/data_order.md) it is opened as the run's data order over K
// lanes: every source catalogued into units and planned (datasets/lanes/data_order.h), which
// refuses, among others, a source with fewer units than lanes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "datasets/lanes/data_order.h"
#include "datasets/parquet/parquet_reader.h"
#include "datasets/sources/dataset_mix.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/sources/document_mix.h"

namespace pipeline::datasets {

/// What a source stage reads. Example (read_shards on the bundled corpus):
///   SourceRequest r;
///   r.dataset = "datasets/data/tinyshakespeare/text";
///   r.split = "train";
///   OpenedSource s = open_source(r);  // s.text reads it
struct SourceRequest {
  std::filesystem::path dataset;  // a prepared dataset, llm.c shards, or Parquet (is_parquet_source)
  std::string split = "train";    // (Parquet has none)
  std::vector<MixSource> mix;     // documents drawn from these by weight instead (not empty: a mix)
  bool tokens = false;            // token ids (read_tokens) rather than documents
  std::string column = "text";    // Parquet's text column (a mix's Parquet sources too)
  bool shuffle = true;            // Parquet: row groups in an order drawn from `seed`
  uint64_t seed = 0;              // Parquet's order; a mix's draws
  bool loop = true;               // the next epoch after the last (a mix always loops)
  DatasetPosition start;          // where one dataset resumes
  MixPosition mix_start;          // where a mix resumes
  DatasetReaderOptions options;   // this rank's partition; how shards are verified
  uint32_t lanes = 0;             // the lanes order's K (0: the documents order)
  uint64_t llmc_unit_tokens = 32768;  // the lanes order: llm.c shards' tokens a unit
};

/// A source opened: exactly one of these is set, by the order and the kind of source.
struct OpenedSource {
  std::unique_ptr<TextDatasetReader> text;
  std::unique_ptr<ParquetDocumentReader> parquet;
  std::unique_ptr<MixedDocumentReader> mixed;
  std::unique_ptr<TokenDatasetReader> tokens;
  std::unique_ptr<DataOrder> order;  // the lanes order: the sources' units and plans (its content: text or tokens)
};

/// Opens `r`. Throws DatasetError (or std::invalid_argument for a request no reader serves, such
/// as a mix of token ids) naming the path and what is wrong with it. In the lanes order the start
/// positions, the partition and `tokens` are not used: where the lanes start is the caller's
/// (LaneCursors), and the order says what its sources hold.
OpenedSource open_source(const SourceRequest& r);

}  // namespace pipeline::datasets
