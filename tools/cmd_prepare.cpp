// `pipeline prepare`: turns text files, directories and JSON Lines into train/val shards plus
// manifest.json. Argument parsing only; the work is datasets::prepare_dataset.
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "datasets/prepare/prepare.h"

namespace {

using pipeline::datasets::PrepareOptions;
using pipeline::cli::option_value;
using pipeline::cli::parse_int;

const char* kUsage = R"(usage: pipeline prepare INPUT... --out DIR [options]

Turns text into a dataset that `pipeline run` reads: train and val shards (zstd, with content
checksums) and DIR/manifest.json (shard names, sizes, document and token counts, sha256).
The same inputs and options always produce byte-identical output.

INPUT is a text file, a directory (walked recursively in sorted order; names starting with
'.' are skipped and counted), a JSON Lines file (.jsonl/.ndjson) whose lines are objects
with a "text" string, one document per line, or Parquet: a .parquet file, a directory of
them or a Hugging Face snapshot (its data/*/*.parquet), or a quoted glob, each non-null
value of the text column one document. Binary files given as text (Parquet without its
name, gzip, zstd, Arrow IPC, NUL bytes) are refused; invalid UTF-8 is kept and counted.

options:
  --out DIR            output directory (created; must be empty unless --force)
  --tokens             write GPT-2 token shards (uint16 ids, EOT 50256 before every document)
                       instead of text shards, so training skips tokenization
  --format F           text (default), tokens (= --tokens), or llmc: GPT-2 token shards in
                       llm.c / modded-nanogpt's .bin layout, named PREFIX_{train,val}_NNNNNN.bin,
                       without manifest.json (what llm.c's own scripts produce)
  --llmc-prefix P      file name prefix of llmc shards (default: DIR's name)
  --split RULE         how plain text files become documents (default blank-lines):
                         blank-lines  runs of non-blank lines, separated by blank lines
                         lines        one document per non-blank line
                         file         one document per file
  --val-fraction F     share of documents put in the val split, 0 <= F < 1 (default 0.1);
                       each document is assigned by a hash of (seed, its index)
  --seed N             seed of the train/val assignment (default 1337)
  --shard-size SIZE    close a shard once it holds SIZE uncompressed bytes (default 128M;
                       suffixes K, M, G are powers of 1024)
  --block-bytes SIZE   cut each shard into blocks of about SIZE uncompressed bytes of whole
                       documents, each a zstd frame read on its own (default 64K): the units
                       a run's lanes read by random access (docs/data_order.md); 0 writes one
                       frame a shard (format 1)
  --level N            zstd compression level, 1..19 (default 3)
  --threads N          tokenizing threads with --tokens (default: all cores)
  --column NAME        the text column of Parquet inputs (default text)
  --force              replace a dataset already in DIR
  --quiet              no progress or summary on stderr

example (tiny-shakespeare ships compressed in the repository):
  zstd -d datasets/data/tinyshakespeare/tinyshakespeare.txt.zst -o tinyshakespeare.txt
  pipeline prepare tinyshakespeare.txt --out data/shakespeare --tokens
  pipeline prepare tinyshakespeare.txt --out data/shakespeare_llmc --format llmc
  pipeline prepare fineweb-edu/sample/10BT --out data/edu_fineweb --format llmc --val-fraction 0.01
)";

int prepare_main(const std::vector<std::string>& args) {
  PrepareOptions o;
  std::vector<std::filesystem::path> inputs;
  bool quiet = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--out") {
      o.out_dir = option_value(args, i, "prepare");
    } else if (a == "--tokens") {
      o.tokens = true;
    } else if (a == "--format") {
      std::string f = option_value(args, i, "prepare");
      if (f == "tokens") {
        o.tokens = true;
      } else if (f == "llmc") {
        o.llmc = true;
      } else if (f != "text") {
        throw std::invalid_argument("--format " + f + ": expected text, tokens or llmc");
      }
    } else if (a == "--llmc-prefix") {
      o.llmc_prefix = option_value(args, i, "prepare");
    } else if (a == "--split") {
      o.rule = pipeline::datasets::parse_document_rule(option_value(args, i, "prepare"));
    } else if (a == "--val-fraction") {
      std::string v = option_value(args, i, "prepare");
      size_t used = 0;
      try {
        o.val_fraction = std::stod(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || !(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
        throw std::invalid_argument("--val-fraction " + v + ": expected a number in [0, 1)");
    } else if (a == "--seed") {
      std::string v = option_value(args, i, "prepare");
      size_t used = 0;
      try {
        o.seed = std::stoull(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || v.empty() || v[0] == '-')
        throw std::invalid_argument("--seed " + v + ": expected a non-negative integer");
    } else if (a == "--shard-size") {
      o.shard_size = pipeline::datasets::parse_byte_size(option_value(args, i, "prepare"));
    } else if (a == "--block-bytes") {
      const std::string v = option_value(args, i, "prepare");
      o.block_bytes = v == "0" ? 0 : pipeline::datasets::parse_byte_size(v);
    } else if (a == "--level") {
      o.level = static_cast<int>(parse_int(a, option_value(args, i, "prepare"), 1, 19));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, option_value(args, i, "prepare"), 1, 1024));
    } else if (a == "--column") {
      o.column = option_value(args, i, "prepare");
    } else if (a == "--force") {
      o.overwrite = true;
    } else if (a == "--quiet" || a == "-q") {
      quiet = true;
    } else if (a.starts_with("-") && a != "-") {
      throw std::invalid_argument("unknown option " + a + " (see pipeline prepare --help)");
    } else {
      inputs.emplace_back(a);
    }
  }
  if (inputs.empty()) throw std::invalid_argument("no INPUT given (see pipeline prepare --help)");
  if (o.out_dir.empty()) throw std::invalid_argument("--out DIR is required (see pipeline prepare --help)");
  o.progress = !quiet;
  auto r = pipeline::datasets::prepare_dataset(inputs, o);
  if (r.invalid_utf8_documents)  // a warning even with --quiet: the data is not what it claims
    std::fprintf(stderr,
                 "prepare: warning: %llu documents hold %llu bytes that are not valid UTF-8; they were kept and "
                 "tokenized as bytes\n",
                 (unsigned long long)r.invalid_utf8_documents, (unsigned long long)r.invalid_utf8_bytes);
  if (!quiet) {
    const auto& m = r.manifest;
    const char* unit = o.tokens || o.llmc ? "tokens" : "text bytes";
    std::fprintf(stderr, "prepare: %llu files, %.1f MB in %.2f s -> %s\n", (unsigned long long)r.input_files,
                 r.input_bytes / 1e6, r.seconds, o.out_dir.c_str());
    for (const auto& [split, shards] : m.splits) {
      uint64_t bytes = 0;
      for (const auto& s : shards) bytes += s.bytes;
      std::fprintf(stderr, "  %-5s %zu shards, %llu documents, %llu %s, %.1f KB on disk\n", split.c_str(),
                   shards.size(), (unsigned long long)m.documents(split), (unsigned long long)m.items(split), unit,
                   bytes / 1e3);
    }
    if (r.parquet_nulls)
      std::fprintf(stderr, "  skipped %llu null rows of Parquet column \"%s\"\n", (unsigned long long)r.parquet_nulls,
                   o.column.c_str());
    if (r.hidden_files_skipped)
      std::fprintf(stderr, "  skipped %llu hidden files or directories (names starting with '.')\n",
                   (unsigned long long)r.hidden_files_skipped);
  }
  return 0;
}

}  // namespace

PIPELINE_COMMAND({"prepare", "turn text files / JSON Lines / Parquet into train and val shards", kUsage, &prepare_main});
