// Shared by the data-parallel end-to-end tests (and the spike guard's): a dataset whose documents
// are exactly B*T tokens (<|endoftext|> and B*T-1 single-letter words), so that in the documents
// order a batch is one document, and reading round-robin by document over R ranks gives one
// process's batches, R per step; data for the lanes order in which each data step's rows are
// documents of one kind (write_lane_docs: text, letters, random tokens, padding); and the
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

/// Documents of kind Doc as tokens, one after another (write_lane_docs): each is
/// <|endoftext|> and then the bundled text's tokens from `text_at` (text), single-letter words
/// (letters: a model learns them in a few dozen steps), or uniform random ids (random). A nan document is an
/// id of the embedding's padding (>= vocab_size) throughout, and so is the token after it (where
/// the next <|endoftext|> would be): every target of a row that is that document is ignored, and
/// the loss of a batch of such rows is 0/0.
class DocTokens {
 public:
  explicit DocTokens(int64_t text_tokens)
      : text_(pipeline::datasets::read_split_tokens(train_harness::kData + "tokens", "train", text_tokens)) {
    for (char c = 'a'; c <= 'z'; ++c)
      letters_.push_back(pipeline::datasets::Tokenizer::gpt2().encode_ordinary(std::string(" ") + c).at(0));
  }
  void document(Doc d, int doc_tokens, size_t text_at = 0) {
    tokens.push_back(d == Doc::nan || after_nan_ ? 50300 : 50256);
    for (int i = 1; i < doc_tokens; ++i) {
      if (d == Doc::text) {
        const uint16_t t = text_.at(text_at++ % text_.size());
        tokens.push_back(t == 50256 ? 13 : t);  // (13: ".") the text's own separators would end documents
      } else if (d == Doc::random || d == Doc::letters) {
        x_ = x_ * 6364136223846793005ull + 1442695040888963407ull;
        tokens.push_back(d == Doc::random ? static_cast<uint16_t>((x_ >> 33) % 50257) : letters_[(x_ >> 33) % 26]);
      } else {
        tokens.push_back(50300);
      }
    }
    after_nan_ = d == Doc::nan;
  }
  /// The last document's last target: an <|endoftext|> (padding after a nan document).
  void end() {
    tokens.push_back(after_nan_ ? 50300 : 50256);
    after_nan_ = false;
  }
  std::vector<uint16_t> tokens;

 private:
  std::vector<uint16_t> text_, letters_;  // letters: " a" .. " z", one GPT-2 token each
  uint64_t x_ = 99;
  bool after_nan_ = false;
};

/// Data for the lanes order (docs/data_order.md) whose data step s is rows of kind steps[s] alone:
/// an llm.c shard of `lanes` units, unit l holding one document of T tokens a step (DocTokens)
/// and a last <|endoftext|>. Run with [data] lanes = `lanes` (auto, where the step's rows are that
/// many), [stages.read] llmc_unit_tokens = `unit_tokens` and [data] loop = false, each lane reads
/// one unit, whichever the seed deals it, and its row s (T+1 tokens) is its s-th document and the
/// next one's first token: step s takes row s of every lane. So leaving steps' documents out of
/// every unit leaves exactly those steps' rows out, and every other row as it was, one step earlier
/// for each step left out before it. A text step's rows are consecutive pieces of the text (unit l
/// holds piece l of each step), as a step of the documents order reads it; steps of other kinds
/// take none of it, so the text steps are the same with them or without.
struct LaneDocs {
  fs::path dir;
  int64_t unit_tokens = 0;
  /// The --set that makes each lane one unit.
  std::string unit_set() const { return "stages.read.llmc_unit_tokens=" + std::to_string(unit_tokens); }
};
inline LaneDocs write_lane_docs(const fs::path& dir, const std::vector<Doc>& steps, int lanes, int T) {
  DocTokens out(static_cast<int64_t>(steps.size()) * lanes * (T - 1));
  for (int l = 0; l < lanes; ++l) {
    size_t text_steps = 0;  // before this one: a step of another kind takes none of the text
    for (Doc d : steps) {
      out.document(d, T, (text_steps * static_cast<size_t>(lanes) + static_cast<size_t>(l)) * (T - 1));
      text_steps += d == Doc::text;
    }
    out.end();
  }
  fs::create_directories(dir);
  for (const char* split : {"train", "val"}) {  // the same shard for both
    std::ofstream shard(dir / (std::string("docs_") + split + "_000000.bin"), std::ios::binary);
    const int32_t header[256] = {20240520, 1, static_cast<int32_t>(out.tokens.size())};  // llm.c: magic, version, count
    shard.write(reinterpret_cast<const char*>(header), sizeof header);
    shard.write(reinterpret_cast<const char*>(out.tokens.data()), static_cast<std::streamsize>(out.tokens.size() * 2));
  }
  return {dir, static_cast<int64_t>(steps.size()) * T + 1};
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
