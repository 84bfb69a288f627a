// Shared by the data-parallel end-to-end tests (and the spike guard's): datasets whose documents
// are exactly B*T tokens (<|endoftext|> and B*T-1 single-letter words, or the bundled text's
// tokens), so that a batch is one document, and reading round-robin by document over R ranks
// gives one process's batches, R per step; and the comparisons of their runs (recorded tokens,
// final weights).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "datasets/prepare/prepare.h"
#include "datasets/sources/split_tokens.h"
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

enum class Doc { text, letters, random, nan };

/// llm.c token shards (train and val alike) of documents of exactly `doc_tokens` tokens:
/// <|endoftext|>, then the bundled text's next tokens (text), single-letter words (letters: a
/// model learns them in a few dozen steps), or uniform random ids (random). A
/// window of B*T = doc_tokens (grad_accum 1) is one document and the next one's <|endoftext|>:
/// leaving a document out leaves exactly its window out, and every other window as it was. A nan
/// document is an id of the embedding's padding (>= vocab_size) throughout, and so is the token
/// after it (where the next <|endoftext|> would be): every target of its window is ignored, and
/// the loss is 0/0.
inline fs::path write_docs(const fs::path& dir, const std::vector<Doc>& docs, int doc_tokens) {
  const std::vector<uint16_t> text = pipeline::datasets::read_split_tokens(
      train_harness::kData + "tokens", "train", static_cast<int64_t>(docs.size()) * doc_tokens);
  std::vector<uint16_t> letters;  // " a" .. " z", one GPT-2 token each
  for (char c = 'a'; c <= 'z'; ++c) letters.push_back(pipeline::datasets::Tokenizer::gpt2().encode_ordinary(std::string(" ") + c).at(0));
  fs::create_directories(dir);
  std::vector<uint16_t> tokens;
  size_t at = 0;
  uint64_t x = 99;
  for (Doc d : docs) {
    tokens.push_back(50256);
    for (int i = 1; i < doc_tokens; ++i) {
      if (d == Doc::text) {
        const uint16_t t = text.at(at++ % text.size());
        tokens.push_back(t == 50256 ? 13 : t);  // (13: ".") the text's own separators would end documents
      } else if (d == Doc::random || d == Doc::letters) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tokens.push_back(d == Doc::random ? static_cast<uint16_t>((x >> 33) % 50257) : letters[(x >> 33) % 26]);
      } else {
        tokens.push_back(50300);
      }
    }
  }
  tokens.push_back(50256);  // the last window's last target
  for (size_t d = 0; d < docs.size(); ++d) {
    if (docs[d] != Doc::nan) continue;
    tokens[d * static_cast<size_t>(doc_tokens)] = 50300;
    tokens[(d + 1) * static_cast<size_t>(doc_tokens)] = 50300;
  }
  for (const char* split : {"train", "val"}) {
    std::ofstream out(dir / (std::string("docs_") + split + "_000000.bin"), std::ios::binary);
    const int32_t header[256] = {20240520, 1, static_cast<int32_t>(tokens.size())};  // llm.c: magic, version, count
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  }
  return dir;
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
