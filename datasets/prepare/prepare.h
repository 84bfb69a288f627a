// `pipeline prepare` as a library call: turn text files, directories of them, or JSON Lines
// into train/val shards plus manifest.json, deterministically for a seed.
//
// Inputs. A directory is walked recursively and its files taken in sorted path order (names
// starting with '.' are skipped and counted); a directory of Parquet files (or a hub snapshot)
// or a quoted glob of them gives its Parquet files (parquet_reader.h). Files ending in .parquet
// are read row by row: each non-null value of the `column` option is one document, in file and
// row-group order (nulls are skipped and counted). Files ending in .jsonl or .ndjson are JSON
// Lines: one JSON object per line, its "text" string is one document (an empty or invalid line,
// or one without a string "text", is an error naming file:line). Every other file is plain text,
// refused when it starts with a binary signature (Parquet, gzip, zstd, Arrow IPC, ...) or holds a
// NUL byte (text_check.h), and cut into documents by the DocumentRule:
//   blank_lines (default): a document is a run of non-blank lines, each with its newline;
//                 blank lines (empty or only spaces, tabs, '\r') separate documents and are
//                 dropped. Suits tiny-shakespeare (one speech per document) and prose.
//   lines:        every non-blank line is a document, without its "\n" or "\r\n".
//   file:         each file is one document, byte for byte.
//
// Invalid UTF-8 is kept (GPT-2's BPE encodes any bytes) and counted in the result.
//
// Split. Document i (counting from 0 over all inputs in order) goes to "val" when
// splitmix64(seed, i) / 2^64 < val_fraction, else to "train"; order within a split is input
// order. The decision needs no look-ahead, so input of any size streams through.
//
// Shards. A shard is closed once its uncompressed payload reaches shard_size bytes (text bytes
// plus 4 per document, or 2 per token); documents are never split across shards. Names are
// "<split>_<NNNNN>.<text|tokens>.zst". Shards are block shards (format 2, shard.h): blocks of
// about block_bytes of payload, whole documents each, one zstd frame each, which a lane reads by
// random access (docs/data_order.md); block_bytes = 0 writes format 1 (one frame a shard).
// manifest.json is written last, so a directory with a manifest is a complete dataset.
//
// llm.c format (llmc = true): token shards in llm.c's .bin layout (datasets/llmc/llmc_shard.h), named
// "<prefix>_<split>_<NNNNNN>.bin", with no manifest (llm.c directories carry none; readers derive
// it from the names and headers). Each shard appears complete or not at all (written to .tmp,
// renamed once its header holds the final count).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/shards/manifest.h"

namespace pipeline::datasets {

enum class DocumentRule { blank_lines, lines, file };
const char* document_rule_name(DocumentRule rule);  // "blank-lines", "lines", "file"
/// Throws std::invalid_argument listing the valid names.
DocumentRule parse_document_rule(std::string_view name);

struct PrepareOptions {
  std::filesystem::path out_dir;                 // required
  bool tokens = false;                           // token shards (GPT-2 BPE) instead of text shards
  bool llmc = false;                             // llm.c .bin token shards (implies tokens)
  std::string llmc_prefix;                       // llm.c file name prefix ("": out_dir's name)
  uint64_t shard_size = uint64_t(128) << 20;     // uncompressed payload bytes per shard
  uint64_t block_bytes = kDefaultBlockBytes;     // payload bytes a block (0: format 1, no blocks)
  double val_fraction = 0.1;                     // share of documents in "val", in [0, 1)
  uint64_t seed = 1337;
  DocumentRule rule = DocumentRule::blank_lines;
  int level = 3;                                 // zstd level
  int threads = 0;                               // tokenizing threads; 0 = hardware concurrency
  bool overwrite = false;                        // replace a dataset already in out_dir
  bool progress = false;                         // report progress on stderr
  std::string column = "text";                   // Parquet inputs: the text column
};

struct PrepareResult {
  Manifest manifest;
  uint64_t input_files = 0;
  uint64_t input_bytes = 0;
  uint64_t documents = 0;
  uint64_t hidden_files_skipped = 0;
  uint64_t parquet_nulls = 0;           // null rows skipped in Parquet inputs
  uint64_t invalid_utf8_documents = 0;  // documents holding bytes that are not UTF-8
  uint64_t invalid_utf8_bytes = 0;      // (tokenized as bytes, as GPT-2's BPE allows)
  double seconds = 0;
};

/// Files the inputs expand to, in processing order. Throws when an input does not exist.
std::vector<std::filesystem::path> expand_inputs(const std::vector<std::filesystem::path>& inputs,
                                                 uint64_t* hidden_files_skipped = nullptr);

/// Writes the dataset; throws DatasetError / std::invalid_argument with file names on bad input.
PrepareResult prepare_dataset(const std::vector<std::filesystem::path>& inputs, const PrepareOptions& options);

/// "1048576", "512K", "64M", "2G" (powers of 1024) -> bytes. Throws std::invalid_argument.
uint64_t parse_byte_size(std::string_view text);

}  // namespace pipeline::datasets
