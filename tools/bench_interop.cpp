// Figures for the interop formats (issue 11): Hugging Face export and import time and the size of
// model.safetensors, and how fast the token reader streams llm.c shards against our zstd shards.
//
// usage: bench_interop export [--preset gpt2] [--repeats 3] [--dir DIR]
//          A randomly initialised model of the preset (fp32, CPU) written as a Hugging Face
//          directory (model.safetensors + config) and read back into a model, --repeats times;
//          reports each time and the file size. DIR (default: a temporary directory) holds it.
//        bench_interop tokens [--tokens 50000000] [--repeats 5] [--chunk 65536] [--dir DIR]
//          The bundled tiny-shakespeare token stream, repeated to --tokens tokens, written once as
//          our token shards (zstd level 3, 128 MiB payload per shard, as `pipeline prepare
//          --tokens` does) and once as llm.c shards; each is then read whole with
//          TokenDatasetReader in --chunk token reads (read_tokens' default chunk), --repeats times.
//          Reports tokens/s (best and median) and the bytes on disk. The files are read from the
//          page cache (they were just written): this measures the CPU cost of each format.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "datasets/sources/dataset_reader.h"
#include "datasets/llmc/llmc_shard.h"
#include "datasets/shards/manifest.h"
#include "datasets/shards/shard.h"
#include "model/hf/hf_gpt2.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace pipeline;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string arg(const std::vector<std::string>& args, const std::string& flag, const std::string& def) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag) return args[i + 1];
  return def;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? e.file_size() : 0;
  return n;
}

fs::path work_dir(const std::vector<std::string>& args, const std::string& tag) {
  fs::path d = arg(args, "--dir", "");
  if (d.empty()) d = fs::temp_directory_path() / ("bench_interop_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

int bench_export(const std::vector<std::string>& args) {
  const auto preset = arg(args, "--preset", "gpt2");
  const int repeats = std::stoi(arg(args, "--repeats", "3"));
  const fs::path dir = work_dir(args, "export");
  torch::NoGradGuard no_grad;
  const auto cfg = model::GPTConfig::preset(preset);
  model::GPT gpt(cfg, 1337);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& p : gpt->named_parameters()) params.emplace_back(p.key(), p.value());
  std::printf("model %s: %lld parameters (fp32, CPU), %d threads\n", preset.c_str(),
              static_cast<long long>(cfg.num_parameters()), at::get_num_threads());
  std::vector<double> write_s, read_s;
  uint64_t bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    bytes = model::write_hf_model(dir, cfg, params);
    write_s.push_back(seconds_since(t0));
    model::GPT back(cfg, 7);
    t0 = Clock::now();
    model::load_hf_weights(back, dir);
    read_s.push_back(seconds_since(t0));
    // The file holds the real vocabulary's rows; the import zero-pads the rest of wte.
    const int64_t V = cfg.vocab_size;
    if (!back->wte->weight.narrow(0, 0, V).equal(gpt->wte->weight.narrow(0, 0, V)))
      throw std::runtime_error("import did not restore the weights");
    std::printf("  run %d: export %.3f s, import %.3f s\n", r + 1, write_s.back(), read_s.back());
  }
  std::printf("model.safetensors: %llu bytes (%.1f MB)\n", static_cast<unsigned long long>(bytes), bytes / 1e6);
  std::printf("export: min %.3f s, median %.3f s; import: min %.3f s, median %.3f s (%.0f MB/s at the median)\n",
              *std::min_element(write_s.begin(), write_s.end()), median(write_s),
              *std::min_element(read_s.begin(), read_s.end()), median(read_s), bytes / 1e6 / median(read_s));
  if (arg(args, "--dir", "").empty()) fs::remove_all(dir);
  return 0;
}

// The bundled token stream, split at its end-of-text ids into documents and repeated.
std::vector<std::vector<uint32_t>> documents(uint64_t want_tokens) {
  datasets::TokenDatasetReader r;
  r.open(fs::path(PIPELINE_SOURCE_DIR) / "datasets/data/tinyshakespeare/tokens", "train");
  std::vector<uint16_t> all, buf(1 << 16);
  for (size_t n; (n = r.read(buf)) > 0;) all.insert(all.end(), buf.begin(), buf.begin() + static_cast<long>(n));
  std::vector<std::vector<uint32_t>> docs;
  uint64_t total = 0;
  while (total < want_tokens) {
    for (size_t i = 0; i < all.size() && total < want_tokens;) {
      size_t j = i + 1;  // all[i] is the EOT that starts a document
      while (j < all.size() && all[j] != datasets::kShardEotId) ++j;
      docs.emplace_back(all.begin() + static_cast<long>(i) + 1, all.begin() + static_cast<long>(j));
      total += j - i;
      i = j;
    }
  }
  return docs;
}

// Reads a split whole; returns tokens read.
uint64_t read_all(const fs::path& dir, size_t chunk) {
  datasets::TokenDatasetReader r;
  r.open(dir, "train", {}, false, {.verify = datasets::VerifyMode::off});
  std::vector<uint16_t> buf(chunk);
  uint64_t n = 0;
  for (size_t k; (k = r.read(buf)) > 0;) n += k;
  return n;
}

int bench_tokens(const std::vector<std::string>& args) {
  const uint64_t want = std::stoull(arg(args, "--tokens", "50000000"));
  const int repeats = std::stoi(arg(args, "--repeats", "5"));
  const size_t chunk = std::stoul(arg(args, "--chunk", "65536"));
  const fs::path dir = work_dir(args, "tokens");
  const auto docs = documents(want);
  const uint64_t shard_payload = uint64_t(128) << 20;

  // Ours: zstd token shards plus manifest, as `pipeline prepare --tokens` lays them out.
  const fs::path ours = dir / "ours", llmc = dir / "llmc";
  fs::create_directories(ours);
  fs::create_directories(llmc);
  datasets::Manifest m;
  m.kind = datasets::ShardKind::tokens;
  m.created_by = "bench_interop";
  {
    std::unique_ptr<datasets::ShardWriter> w;
    auto close = [&] {
      auto s = w->finish();
      m.splits["train"].push_back({s.path.filename().string(), s.bytes, s.documents, s.items, s.sha256});
      w.reset();
    };
    for (const auto& d : docs) {
      if (!w) {
        char name[64];
        std::snprintf(name, sizeof name, "train_%05zu.tokens.zst", m.splits["train"].size());
        w = std::make_unique<datasets::ShardWriter>(ours / name, datasets::ShardKind::tokens);
      }
      w->add_document(d);
      if (w->payload_bytes() >= shard_payload) close();
    }
    if (w) close();
    m.save(ours);
  }
  // llm.c: the same documents, the same shard size.
  {
    std::unique_ptr<datasets::LlmcShardWriter> w;
    size_t index = 0;
    for (const auto& d : docs) {
      if (!w) w = std::make_unique<datasets::LlmcShardWriter>(llmc / datasets::llmc_shard_name("bench", "train", index++));
      w->add_document(d);
      if (2 * w->tokens() >= shard_payload) {
        w->finish();
        w.reset();
      }
    }
    if (w) w->finish();
  }
  std::printf("%llu tokens in %zu documents; chunk %zu tokens\n",
              static_cast<unsigned long long>(m.items("train")), docs.size(), chunk);
  for (const auto& [name, path] : {std::pair{"pipeline zstd shards", ours}, std::pair{"llm.c .bin shards", llmc}}) {
    std::vector<double> rate;
    uint64_t n = 0;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = Clock::now();
      n = read_all(path, chunk);
      rate.push_back(static_cast<double>(n) / seconds_since(t0));
    }
    std::printf("%-22s %6.1f MB on disk: best %7.1f M tokens/s, median %7.1f M tokens/s (%.0f MB/s of tokens)\n", name,
                dir_bytes(path) / 1e6, *std::max_element(rate.begin(), rate.end()) / 1e6, median(rate) / 1e6,
                median(rate) * 2 / 1e6);
    if (n != m.items("train")) throw std::runtime_error(std::string(name) + ": read a different token count");
  }
  if (arg(args, "--dir", "").empty()) fs::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && args[0] == "export") return bench_export(args);
    if (!args.empty() && args[0] == "tokens") return bench_tokens(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_interop: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: bench_interop export [--preset gpt2] [--repeats 3] [--dir DIR]\n"
                       "       bench_interop tokens [--tokens 50000000] [--repeats 5] [--chunk 65536] [--dir DIR]\n");
  return 2;
}
