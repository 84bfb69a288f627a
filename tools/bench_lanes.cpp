// Lanes' memory and speed (docs/data_order.md): one rank serving K lanes of a source, each lane
// reading its own units by random access (datasets/lanes/), text tokenized as the tokenize stage
// does, cut into rows of T+1 by LaneRows, every lane giving one row a step (K = the step's rows,
// the default). Prints, per K: the bytes the lanes hold (their open units and the readers they
// share), what LaneRows holds, the growth of the process's resident memory, and the speed in MB
// of text (or tokens) a second; then the same source read front to back by the streaming reader
// of the documents order, for comparison.
//
//   bench_lanes [--source PATH] [--lanes 1,8,64,512] [--seq-len 1024] [--steps 200]
//               [--mb 64] [--block-bytes 64K] [--read-only]
//
// --read-only leaves out tokenizing and rows: the lanes (and the stream) read documents only, one
// per lane in turn, as much text as the rows would have taken: the cost of reading by lanes.
//
// Without --source it prepares a block-shard dataset of --mb MB of generated text (blocks of
// --block-bytes) in the temporary directory, and removes it afterwards. Figures are for a quiet
// machine: run it alone.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "datasets/lanes/data_order.h"
#include "datasets/lanes/document_lanes.h"
#include "datasets/lanes/lane_rows.h"
#include "datasets/lanes/token_lanes.h"
#include "datasets/prepare/prepare.h"
#include "datasets/sources/dataset_reader.h"
#include "datasets/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace pipeline::datasets;

namespace {

// Resident memory of the process, from /proc/self/status (bytes).
size_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Generated English-like documents of 50 to 2,000 words, blank-line separated.
fs::path make_source(const fs::path& dir, uint64_t mb, uint64_t block_bytes) {
  static const char* words[] = {"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was",
                                "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at",
                                "which", "but", "have", "an", "had", "they", "you", "were", "their", "one", "all"};
  fs::create_directories(dir);
  std::mt19937 rng(7);
  {
    std::ofstream out(dir / "corpus.txt", std::ios::binary);
    std::string doc;
    for (uint64_t bytes = 0; bytes < (mb << 20);) {
      doc.clear();
      for (size_t w = 0, n = 50 + rng() % 1950; w < n; ++w) {
        doc += words[rng() % std::size(words)];
        doc += (rng() % 17 == 0) ? ".\n" : " ";
      }
      doc += "\n\n";
      out << doc;
      bytes += doc.size();
    }
  }
  PrepareOptions o;
  o.out_dir = dir / "data";
  o.val_fraction = 0;
  o.block_bytes = block_bytes;
  prepare_dataset({dir / "corpus.txt"}, o);
  fs::remove(dir / "corpus.txt");
  return o.out_dir;
}

// A rank's lanes of either kind, fresh.
struct Lanes {
  std::vector<LaneCursor> cursors;
  std::optional<DocumentLanes> docs;
  std::optional<TokenLanes> tokens;
  explicit Lanes(const DataOrder& order) : cursors(start_cursors(order, lanes_of(0, 1, order.lanes))) {
    if (order.content == UnitContent::documents)
      docs.emplace(order, cursors);
    else
      tokens.emplace(order, cursors);
  }
  size_t memory() const { return docs ? docs->memory() : tokens->memory(); }
};

struct Result {
  size_t lanes_bytes = 0, rows_bytes = 0, rss_growth = 0;
  double mb_per_s = 0, tokens_per_s = 0;
};

Result run(const DataOrder& order, uint32_t T, uint64_t steps) {
  const size_t rss_before = rss_bytes();
  Lanes lanes(order);
  auto& docs = lanes.docs;
  auto& tokens = lanes.tokens;
  LaneRows rows(T, order.content, lanes.cursors);
  const Tokenizer& tok = Tokenizer::gpt2();
  std::vector<uint32_t> ids;
  std::vector<uint16_t> piece(4096), row(T + 1);
  uint64_t bytes = 0, token_count = 0;
  Result r;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t s = 0; s < steps; ++s)
    for (size_t i = 0; i < rows.size(); ++i) {
      while (rows.rows_ready(i) == 0) {
        LanePlace place;
        if (docs) {
          std::string_view doc;
          if (!docs->next(i, doc, place)) throw DatasetError("a lane ended");
          ids.assign(1, Tokenizer::eot_id);
          tok.encode_ordinary_append(doc, ids);
          piece.assign(ids.begin(), ids.end());
          rows.push(i, piece, place);
          bytes += doc.size();
        } else {
          piece.resize(4096);
          const size_t n = tokens->read(i, piece, place);
          if (n == 0) throw DatasetError("a lane ended");
          rows.push(i, std::span<const uint16_t>(piece).first(n), place);
          bytes += 2 * n;
        }
      }
      rows.take_row(i, row);
      token_count += T;
    }
  const double secs = seconds_since(start);
  r.lanes_bytes = lanes.memory();
  r.rows_bytes = rows.memory();
  const size_t rss_after = rss_bytes();
  r.rss_growth = rss_after > rss_before ? rss_after - rss_before : 0;
  r.mb_per_s = bytes / 1e6 / secs;
  r.tokens_per_s = token_count / secs;
  return r;
}

// Reads only: one document (or piece of tokens) per lane in turn, until `bytes` have been read.
Result read_only(const DataOrder& order, uint64_t bytes_wanted) {
  const size_t rss_before = rss_bytes();
  Lanes lanes(order);
  auto& docs = lanes.docs;
  auto& tokens = lanes.tokens;
  std::vector<uint16_t> piece(4096);
  uint64_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  while (bytes < bytes_wanted)
    for (size_t i = 0; i < lanes.cursors.size(); ++i) {
      LanePlace place;
      if (docs) {
        std::string_view doc;
        if (!docs->next(i, doc, place)) throw DatasetError("a lane ended");
        bytes += doc.size();
      } else {
        bytes += 2 * tokens->read(i, piece, place);
      }
    }
  Result r;
  r.mb_per_s = bytes / 1e6 / seconds_since(start);
  r.lanes_bytes = lanes.memory();
  const size_t rss_after = rss_bytes();
  r.rss_growth = rss_after > rss_before ? rss_after - rss_before : 0;
  return r;
}

std::vector<uint32_t> parse_list(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i <= s.size();) {
    const size_t comma = std::min(s.find(',', i), s.size());
    out.push_back(static_cast<uint32_t>(std::stoul(s.substr(i, comma - i))));
    i = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string source;
  std::vector<uint32_t> lane_counts = {1, 8, 64, 512};
  uint32_t T = 1024;
  uint64_t steps = 200, mb = 64, block_bytes = kDefaultBlockBytes;
  bool tokenize = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--source" && more) source = argv[++i];
    else if (a == "--lanes" && more) lane_counts = parse_list(argv[++i]);
    else if (a == "--seq-len" && more) T = static_cast<uint32_t>(std::stoul(argv[++i]));
    else if (a == "--steps" && more) steps = std::stoull(argv[++i]);
    else if (a == "--mb" && more) mb = std::stoull(argv[++i]);
    else if (a == "--block-bytes" && more) block_bytes = parse_byte_size(argv[++i]);
    else if (a == "--read-only") tokenize = false;
    else {
      std::fprintf(stderr, "usage: bench_lanes [--source PATH] [--lanes 1,8,64,512] [--seq-len 1024] "
                           "[--steps 200] [--mb 64] [--block-bytes 64K] [--read-only]\n");
      return 2;
    }
  }
  fs::path made;
  if (source.empty()) {
    made = fs::temp_directory_path() / ("pipeline_bench_lanes_" + std::to_string(::getpid()));
    const auto t = std::chrono::steady_clock::now();
    source = make_source(made, mb, block_bytes).string();
    std::printf("prepared %llu MB of generated text as block shards of %llu-byte blocks in %.1f s: %s\n",
                static_cast<unsigned long long>(mb), static_cast<unsigned long long>(block_bytes), seconds_since(t),
                source.c_str());
  }
  std::printf("source %s, T = %u, %llu steps of one row per lane\n", source.c_str(), T,
              static_cast<unsigned long long>(steps));
  std::printf("%6s %8s %14s %12s %14s %12s %10s %12s\n", "lanes", "units", "lanes hold", "per lane", "rows hold",
              "RSS growth", "MB/s", "tokens/s");
  for (uint32_t k : lane_counts) {
    const DataOrder order = open_data_order({{source}}, {.lanes = k, .seed = 1337});
    // About 4 bytes of text a token: the text the rows would take.
    const Result r = tokenize ? run(order, T, steps) : read_only(order, uint64_t(k) * steps * T * 4);
    std::printf("%6u %8zu %11.1f MB %9.1f KB %11.1f MB %9.1f MB %10.1f %12.0f\n", k,
                order.sources[0].catalog->units.size(), r.lanes_bytes / 1e6, r.lanes_bytes / 1e3 / k,
                r.rows_bytes / 1e6, r.rss_growth / 1e6, r.mb_per_s, r.tokens_per_s);
  }
  // The documents order's streaming reader over the same data, as far as the largest run read.
  if (fs::exists(fs::path(source) / "manifest.json")) {
    const DataOrder order = open_data_order({{source}}, {.lanes = 1});
    if (order.content == UnitContent::documents) {
      TextDatasetReader reader;
      reader.open(source, "train", {}, /*loop=*/true, {.verify = VerifyMode::off});
      const Tokenizer& tok = Tokenizer::gpt2();
      std::vector<uint32_t> ids;
      uint64_t bytes = 0, tokens = 0;
      const uint64_t want = uint64_t(lane_counts.back()) * steps * T;
      const auto t = std::chrono::steady_clock::now();
      for (std::string doc; (tokenize ? tokens < want : bytes < 4 * want) && reader.next(doc);) {
        bytes += doc.size();
        if (!tokenize) continue;
        ids.clear();
        tok.encode_ordinary_append(doc, ids);
        tokens += ids.size() + 1;
      }
      const double secs = seconds_since(t);
      std::printf("%6s %8s %14s %12s %14s %12s %10.1f %12.0f   (the documents order: one stream, front to back)\n",
                  "stream", "-", "-", "-", "-", "-", bytes / 1e6 / secs, tokenize ? tokens / secs : 0.0);
    }
  }
  if (!made.empty()) fs::remove_all(made);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_lanes: %s\n", e.what());
  return 1;
}
