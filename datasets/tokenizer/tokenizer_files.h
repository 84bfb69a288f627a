// Reading a vocabulary in GPT-2's release format: encoder.json (token -> id, tokens written in
// GPT-2's byte-to-unicode alphabet) and vocab.bpe (a "#version" line, then one merge "A B" per
// line in rank order). The result is checked and ready for tokenizer_table.h to lay out.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline::datasets {

/// The tokens of a vocabulary by id, as raw bytes.
struct VocabTokens {
  std::string pool;                   // token bytes, back to back
  std::vector<uint32_t> offsets;      // id -> [offsets[id], offsets[id + 1]) in pool; size() - 1 tokens
  std::vector<uint32_t> special_ids;  // tokens that encode only as specials ("<|endoftext|>")

  size_t size() const { return offsets.size() - 1; }
  std::string_view bytes_of(uint32_t id) const { return std::string_view(pool).substr(offsets[id], offsets[id + 1] - offsets[id]); }
};

/// Parses and checks the two files' contents: ids are exactly 0..n-1, every byte has a token,
/// merge i makes token 256 + i. Throws std::runtime_error naming the file (`encoder_name`,
/// `bpe_name`) and the byte offset or line that is wrong.
VocabTokens vocab_tokens_parse(std::string_view encoder_json, std::string_view vocab_bpe,
                               std::string_view encoder_name, std::string_view bpe_name);

/// The same from files; also throws when one cannot be read.
VocabTokens vocab_tokens_load(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe);

}  // namespace pipeline::datasets
