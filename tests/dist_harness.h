// Shared by the data-parallel end-to-end tests: a dataset whose documents are exactly B*T
// tokens (<|endoftext|> and B*T-1 single-letter words), so that a batch is one document, and
// reading round-robin by document over R ranks gives one process's batches, R per step; and the
// comparisons of their runs (recorded tokens, final weights).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "datasets/prepare/prepare.h"
#include "datasets/tokenizer/tokenizer.h"
#include "model/checkpoint/checkpoint.h"
#include "test_util.h"
#include "train_harness.h"

namespace dist_harness {

namespace fs = std::filesystem;

inline constexpr int kB = 2, kT = 32;  // train_harness::tiny_config's batch

inline fs::path make_letters_dataset(const fs::path& root, int documents = 64) {
  const auto& tok = pipeline::datasets::Tokenizer::gpt2();
  std::ofstream in(root / "letters.txt");
  uint64_t x = 12345;
  for (int d = 0; d < documents; ++d) {
    std::string line;
    for (int w = 0; w < kB * kT - 1; ++w) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      line += (w ? " " : "") + std::string(1, static_cast<char>('a' + (x >> 33) % 26));
    }
    if (tok.encode_ordinary(line).size() != static_cast<size_t>(kB * kT - 1))
      throw std::logic_error("a single-letter word is not one GPT-2 token in: " + line);
    in << line << "\n";
  }
  in.close();
  pipeline::datasets::PrepareOptions o;
  o.out_dir = root / "letters";
  o.rule = pipeline::datasets::DocumentRule::lines;
  o.val_fraction = 0;
  o.threads = 1;
  o.block_bytes = 512;  // blocks of about 4 documents: units enough for the lanes of a few ranks
  pipeline::datasets::prepare_dataset({root / "letters.txt"}, o);
  return o.out_dir;
}

/// The token ids a record_batches stage wrote (uint16 each).
inline std::vector<uint16_t> read_u16(const fs::path& p) {
  auto bytes = test_util::read_file(p);
  std::vector<uint16_t> out(bytes.size() / 2);
  std::memcpy(out.data(), bytes.data(), out.size() * 2);
  return out;
}

/// The newest checkpoint of a run directory, read; throws when there is none.
inline pipeline::model::CheckpointState final_checkpoint(const fs::path& run_dir) {
  auto ckpt = pipeline::stages::latest_checkpoint(run_dir);
  if (ckpt.empty()) throw std::runtime_error("no checkpoint in " + run_dir.string());
  return pipeline::model::read_checkpoint(ckpt.string());
}

/// Every weight tensor bit for bit the same.
inline bool same_weights(const pipeline::model::CheckpointState& a, const pipeline::model::CheckpointState& b) {
  if (a.model.size() != b.model.size()) return false;
  for (size_t i = 0; i < a.model.size(); ++i)
    if (!torch::equal(a.model[i].second, b.model[i].second)) return false;
  return true;
}

}  // namespace dist_harness
