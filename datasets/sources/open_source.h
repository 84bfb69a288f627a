// The one place a training source is opened, torch-free: the read stages open what they read
// through it, and `pipeline check` opens the same sources the same way to know that a run will
// (a dry run). A source is a prepared dataset's split (text or tokens), llm.c shards, Parquet,
// or a weighted mix of documents from several of these; opening it checks the manifest, the
// shards (present, of their size, hashed as the reader's options say), Parquet's files and
// column, and the start position.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

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
};

/// A source opened: exactly one of the readers is set, by the kind of source.
struct OpenedSource {
  std::unique_ptr<TextDatasetReader> text;
  std::unique_ptr<ParquetDocumentReader> parquet;
  std::unique_ptr<MixedDocumentReader> mixed;
  std::unique_ptr<TokenDatasetReader> tokens;
};

/// Opens `r`. Throws DatasetError (or std::invalid_argument for a request no reader serves, such
/// as a mix of token ids) naming the path and what is wrong with it.
OpenedSource open_source(const SourceRequest& r);

}  // namespace pipeline::datasets
