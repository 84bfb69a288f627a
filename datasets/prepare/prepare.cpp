// Dataset preparation: read documents, assign each to train/val, write shards, then the
// manifest. Token shards are tokenized in batches on several threads; the writer consumes
// each batch in input order, so the output does not depend on the thread count.
#include "datasets/prepare/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>

#include "base/json.h"
#include "datasets/llmc/llmc_shard.h"
#include "datasets/parquet/parquet_reader.h"
#include "datasets/shards/shard.h"
#include "datasets/plan/splitmix.h"
#include "datasets/shards/text_check.h"
#include "datasets/tokenizer/tokenizer.h"

namespace pipeline::datasets {
namespace fs = std::filesystem;
namespace {

bool goes_to_val(uint64_t seed, uint64_t doc_index, double val_fraction) {
  uint64_t h = splitmix64(seed ^ splitmix64(doc_index));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < val_fraction;
}

bool is_jsonl(const fs::path& p) {
  auto ext = p.extension().string();
  return ext == ".jsonl" || ext == ".ndjson";
}

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

using EmitFn = std::function<void(std::string&&)>;
using AdvanceFn = std::function<void(uint64_t)>;

void read_jsonl(std::ifstream& in, const fs::path& path, const EmitFn& emit, const AdvanceFn& advance) {
  std::string line;
  uint64_t offset = 0;
  for (uint64_t line_no = 1; std::getline(in, line); ++line_no) {
    refuse_nul_bytes(path, line, offset);
    offset += line.size() + 1;
    advance(line.size() + 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string where = path.string() + ":" + std::to_string(line_no);
    if (is_blank(line)) throw DatasetError(where + ": empty line; JSON Lines needs one JSON object per line");
    JsonValue v;
    try {
      v = json_parse(line);
    } catch (const JsonParseError& e) {
      throw DatasetError(where + ":" + std::to_string(e.column) + ": not valid JSON: " + e.message);
    }
    if (v.type != JsonValue::Type::object)
      throw DatasetError(where + ": expected a JSON object with a \"text\" field, found a " +
                         JsonValue::type_name(v.type));
    auto it = std::find_if(v.members.begin(), v.members.end(), [](const auto& m) { return m.first == "text"; });
    if (it == v.members.end()) throw DatasetError(where + ": the object has no \"text\" field");
    if (it->second.type != JsonValue::Type::string)
      throw DatasetError(where + ": \"text\" is a " + std::string(JsonValue::type_name(it->second.type)) +
                         ", expected a string");
    emit(std::move(it->second.text));
  }
}

void read_plain(std::ifstream& in, const fs::path& path, DocumentRule rule, const EmitFn& emit,
                const AdvanceFn& advance) {
  uint64_t offset = 0;
  if (rule == DocumentRule::file) {
    std::string doc;
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      const std::string_view chunk(buf, static_cast<size_t>(in.gcount()));
      refuse_nul_bytes(path, chunk, offset);
      offset += chunk.size();
      doc.append(chunk);
      advance(chunk.size());
    }
    emit(std::move(doc));
    return;
  }
  std::string line, doc;
  while (std::getline(in, line)) {
    bool had_newline = !in.eof();
    refuse_nul_bytes(path, line, offset);
    offset += line.size() + (had_newline ? 1 : 0);
    advance(line.size() + (had_newline ? 1 : 0));
    if (is_blank(line)) {
      if (!doc.empty()) emit(std::move(doc));
      doc.clear();
      continue;
    }
    if (rule == DocumentRule::lines) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      emit(std::move(line));
      continue;
    }
    doc += line;
    if (had_newline) doc += '\n';
  }
  if (!doc.empty()) emit(std::move(doc));
}

// Parquet: the column's non-null values in file and row-group order; the bytes count as read
// once the file is done. Returns the nulls skipped.
uint64_t read_parquet(const fs::path& path, const std::string& column, const EmitFn& emit, const AdvanceFn& advance) {
  ParquetDocumentReader reader;
  ParquetReaderOptions o;
  o.column = column;
  o.shuffle = false;
  reader.open(path, {}, /*loop=*/false, o);
  for (std::string doc; reader.next(doc);) emit(std::move(doc));
  advance(fs::file_size(path));
  return reader.nulls_skipped();
}

void read_documents(const fs::path& path, const PrepareOptions& o, const EmitFn& emit, const AdvanceFn& advance,
                    PrepareResult& result) {
  if (path.extension() == ".parquet") {
    result.parquet_nulls += read_parquet(path, o.column, emit, advance);
    return;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DatasetError(path.string() + ": cannot open input");
  char head[8] = {};
  in.read(head, sizeof head);
  refuse_binary_signature(path, std::string_view(head, static_cast<size_t>(in.gcount())));
  in.clear();
  in.seekg(0);
  if (is_jsonl(path))
    read_jsonl(in, path, emit, advance);
  else
    read_plain(in, path, o.rule, emit, advance);
  if (in.bad()) throw DatasetError(path.string() + ": read error");
}

// Writes one split's shards, rolling over to a new shard at the size limit: zstd shards, or
// llm.c .bin shards when o.llmc.
class SplitWriter {
 public:
  SplitWriter(fs::path dir, std::string split, const PrepareOptions& o, std::string llmc_prefix = {})
      : dir_(std::move(dir)), split_(std::move(split)), o_(o), llmc_prefix_(std::move(llmc_prefix)) {}

  void add(std::string_view text) {
    open_if_needed();
    cur_->add_document(text);
    roll_if_full(cur_->payload_bytes());
  }
  void add(std::span<const uint32_t> tokens) {
    open_if_needed();
    if (llmc_) {
      llmc_->add_document(tokens);
      roll_if_full(2 * llmc_->tokens());
    } else {
      cur_->add_document(tokens);
      roll_if_full(cur_->payload_bytes());
    }
  }
  std::vector<ShardInfo> finish() {
    close_current();
    return std::move(shards_);
  }

 private:
  void open_if_needed() {
    if (cur_ || llmc_) return;
    if (o_.llmc) {
      name_ = llmc_shard_name(llmc_prefix_, split_, shards_.size());
      llmc_ = std::make_unique<LlmcShardWriter>(dir_ / name_);
      return;
    }
    char name[64];
    std::snprintf(name, sizeof name, "%s_%05zu.%s.zst", split_.c_str(), shards_.size(),
                  o_.tokens ? "tokens" : "text");
    name_ = name;
    cur_ = std::make_unique<ShardWriter>(dir_ / name_, o_.tokens ? ShardKind::tokens : ShardKind::text,
                                         ShardWriterOptions{.level = o_.level, .block_bytes = o_.block_bytes});
  }
  void roll_if_full(uint64_t payload_bytes) {
    if (payload_bytes >= o_.shard_size) close_current();
  }
  void close_current() {
    if (llmc_) {
      const uint64_t tokens = llmc_->tokens(), documents = llmc_->documents();
      const uint64_t bytes = llmc_->finish();
      llmc_.reset();
      shards_.push_back(ShardInfo{name_, bytes, documents, tokens, ""});
      return;
    }
    if (!cur_) return;
    ShardWriter::Summary s = cur_->finish();
    cur_.reset();
    shards_.push_back(ShardInfo{name_, s.bytes, s.documents, s.items, s.sha256, s.blocks});
  }

  fs::path dir_;
  std::string split_;
  const PrepareOptions& o_;
  std::string llmc_prefix_;
  std::unique_ptr<ShardWriter> cur_;
  std::unique_ptr<LlmcShardWriter> llmc_;
  std::string name_;
  std::vector<ShardInfo> shards_;
};

// The llm.c file name prefix: the option, else the output directory's name, kept to
// [A-Za-z0-9_-] so names stay portable.
std::string llmc_prefix_of(const PrepareOptions& o) {
  std::string p = o.llmc_prefix.empty() ? fs::absolute(o.out_dir).lexically_normal().filename().string() : o.llmc_prefix;
  if (p.empty()) p = "data";
  for (char& c : p)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return p;
}

class Progress {
 public:
  Progress(bool enabled, uint64_t total) : enabled_(enabled), total_(total), tty_(enabled && isatty(2)) {}
  void update(uint64_t bytes, uint64_t docs, bool final = false) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    auto since_last = std::chrono::duration<double>(now - last_).count();
    if (!final && since_last < (tty_ ? 0.25 : 5.0)) return;
    last_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    double mb = bytes / 1e6;
    std::fprintf(stderr, "%sprepare: %.1f / %.1f MB (%.0f%%), %.1f MB/s, %llu documents%s", tty_ ? "\r" : "", mb,
                 total_ / 1e6, total_ ? 100.0 * bytes / total_ : 100.0, secs > 0 ? mb / secs : 0.0,
                 static_cast<unsigned long long>(docs), (tty_ && !final) ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  uint64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

bool is_our_output(const fs::path& p) {
  std::string n = p.filename().string();
  if (n == kManifestFileName) return true;
  if (n.ends_with(".bin") && (n.find("_train_") != std::string::npos || n.find("_val_") != std::string::npos))
    return true;  // llm.c shards
  for (const char* split : {"train_", "val_"})
    for (const char* ext : {".text.zst", ".tokens.zst"}) {
      std::string_view s(n), e(ext);
      if (s.starts_with(split) && s.ends_with(e)) return true;
    }
  return false;
}

void prepare_out_dir(const PrepareOptions& o) {
  if (o.out_dir.empty()) throw std::invalid_argument("no output directory given (--out DIR)");
  if (fs::exists(o.out_dir) && !fs::is_directory(o.out_dir))
    throw DatasetError(o.out_dir.string() + ": exists and is not a directory");
  fs::create_directories(o.out_dir);
  std::vector<fs::path> ours, others;
  for (const auto& e : fs::directory_iterator(o.out_dir)) (is_our_output(e.path()) ? ours : others).push_back(e.path());
  if (!ours.empty() && !o.overwrite)
    throw DatasetError(o.out_dir.string() + ": already holds a dataset (" + ours.front().filename().string() +
                       "); pass --force to replace it");
  if (!others.empty())
    throw DatasetError(o.out_dir.string() + ": is not empty (" + others.front().filename().string() +
                       "); choose an empty or new directory");
  fs::remove(o.out_dir / kManifestFileName);  // first, so a half-replaced dataset never looks complete
  for (const auto& p : ours) fs::remove(p);
}

}  // namespace

const char* document_rule_name(DocumentRule rule) {
  switch (rule) {
    case DocumentRule::blank_lines: return "blank-lines";
    case DocumentRule::lines: return "lines";
    case DocumentRule::file: return "file";
  }
  return "?";
}

DocumentRule parse_document_rule(std::string_view name) {
  for (auto r : {DocumentRule::blank_lines, DocumentRule::lines, DocumentRule::file})
    if (name == document_rule_name(r)) return r;
  throw std::invalid_argument("unknown document rule \"" + std::string(name) +
                              "\" (expected blank-lines, lines or file)");
}

uint64_t parse_byte_size(std::string_view text) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  std::string_view suffix(p, static_cast<size_t>(text.data() + text.size() - p));
  int shift = suffix.empty() || suffix == "B" ? 0
              : (suffix == "K" || suffix == "k" || suffix == "KiB") ? 10
              : (suffix == "M" || suffix == "m" || suffix == "MiB") ? 20
              : (suffix == "G" || suffix == "g" || suffix == "GiB") ? 30
                                                                      : -1;
  if (ec != std::errc() || p == text.data() || shift < 0 || v == 0 || v > (UINT64_MAX >> shift))
    throw std::invalid_argument("bad size \"" + std::string(text) +
                                "\" (expected a positive integer with an optional K, M or G suffix, e.g. 64M)");
  return v << shift;
}

std::vector<fs::path> expand_inputs(const std::vector<fs::path>& inputs, uint64_t* hidden_files_skipped) {
  std::vector<fs::path> files;
  uint64_t hidden = 0;
  for (const auto& in : inputs) {
    if (!fs::is_regular_file(in) && is_parquet_source(in)) {  // a directory of Parquet, a hub snapshot, a glob
      auto parquet = list_parquet_files(in);
      files.insert(files.end(), parquet.begin(), parquet.end());
      continue;
    }
    if (!fs::exists(in)) throw DatasetError(in.string() + ": input does not exist");
    if (!fs::is_directory(in)) {
      files.push_back(in);
      continue;
    }
    std::vector<fs::path> found;
    for (auto it = fs::recursive_directory_iterator(in); it != fs::recursive_directory_iterator(); ++it) {
      if (it->path().filename().string().starts_with(".")) {
        if (it->is_directory()) it.disable_recursion_pending();
        ++hidden;
        continue;
      }
      if (it->is_regular_file()) found.push_back(it->path());
    }
    std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) {
      return a.generic_string() < b.generic_string();
    });
    files.insert(files.end(), found.begin(), found.end());
  }
  if (hidden_files_skipped) *hidden_files_skipped = hidden;
  return files;
}

PrepareResult prepare_dataset(const std::vector<fs::path>& inputs, const PrepareOptions& o) {
  if (inputs.empty()) throw std::invalid_argument("no inputs given");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw std::invalid_argument("val fraction " + std::to_string(o.val_fraction) + " is outside [0, 1)");
  if (o.shard_size == 0) throw std::invalid_argument("shard size must be positive");
  auto start = std::chrono::steady_clock::now();

  PrepareResult result;
  std::vector<fs::path> files = expand_inputs(inputs, &result.hidden_files_skipped);
  if (files.empty()) throw DatasetError("no input files found in the given inputs");
  for (const auto& f : files) result.input_bytes += fs::file_size(f);
  result.input_files = files.size();
  prepare_out_dir(o);

  const std::string prefix = o.llmc ? llmc_prefix_of(o) : std::string();
  SplitWriter train(o.out_dir, "train", o, prefix), val(o.out_dir, "val", o, prefix);
  Progress progress(o.progress, result.input_bytes);
  uint64_t bytes_done = 0, doc_index = 0;

  // Token mode batches documents so tokenizing can run on several threads.
  const Tokenizer* tok = o.tokens || o.llmc ? &Tokenizer::gpt2() : nullptr;
  unsigned threads = o.threads > 0 ? static_cast<unsigned>(o.threads) : std::max(1u, std::thread::hardware_concurrency());
  constexpr size_t kBatchBytes = size_t(8) << 20;
  std::vector<std::string> batch;
  std::vector<char> batch_val;
  std::vector<std::vector<uint32_t>> batch_ids;
  size_t batch_bytes = 0;
  auto flush_batch = [&] {
    batch_ids.assign(batch.size(), {});
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < batch.size();) batch_ids[i] = tok->encode_ordinary(batch[i]);
    };
    unsigned n = std::min<unsigned>(threads, static_cast<unsigned>(batch.size()));
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < n; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (size_t i = 0; i < batch.size(); ++i) (batch_val[i] ? val : train).add(batch_ids[i]);
    batch.clear();
    batch_val.clear();
    batch_bytes = 0;
  };

  for (const auto& file : files) {
    read_documents(
        file, o,
        [&](std::string&& doc) {
          if (const uint64_t bad = invalid_utf8_bytes(doc)) {
            ++result.invalid_utf8_documents;
            result.invalid_utf8_bytes += bad;
          }
          bool is_val = goes_to_val(o.seed, doc_index++, o.val_fraction);
          if (!tok) {
            (is_val ? val : train).add(std::string_view(doc));
          } else {
            batch_bytes += doc.size();
            batch.push_back(std::move(doc));
            batch_val.push_back(is_val);
            if (batch_bytes >= kBatchBytes) flush_batch();
          }
          progress.update(bytes_done, doc_index);
        },
        [&](uint64_t n) { bytes_done += n; }, result);
  }
  if (tok && !batch.empty()) flush_batch();

  Manifest& m = result.manifest;
  m.format = o.llmc ? DatasetFormat::llmc : DatasetFormat::pipeline;
  m.kind = tok ? ShardKind::tokens : ShardKind::text;
  m.created_by = "pipeline prepare";
  m.seed = o.seed;
  m.val_fraction = o.val_fraction;
  m.split_rule = document_rule_name(o.rule);
  m.version = o.block_bytes > 0 ? kManifestVersion : kManifestVersionOneFrame;
  m.block_bytes = o.block_bytes;
  m.splits["train"] = train.finish();
  m.splits["val"] = val.finish();
  if (!o.llmc) m.save(o.out_dir);  // llm.c directories carry no manifest
  result.documents = doc_index;
  progress.update(bytes_done, doc_index, /*final=*/true);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace pipeline::datasets
