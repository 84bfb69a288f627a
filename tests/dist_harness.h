// Shared by the data-parallel end-to-end tests: a dataset whose documents are exactly B*T
// tokens (<|endoftext|> and B*T-1 single-letter words), so that a batch is one document, and
// reading round-robin by document over R ranks gives one process's batches, R per step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "datasets/prepare.h"
#include "datasets/tokenizer.h"
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
  pipeline::datasets::prepare_dataset({root / "letters.txt"}, o);
  return o.out_dir;
}

}  // namespace dist_harness
