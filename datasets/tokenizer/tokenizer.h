// GPT-2 byte-level BPE tokenizer with exact tiktoken (`gpt2` encoding) parity.
//
// One loaded vocabulary is immutable and may be shared by any number of threads: encode and
// decode take no locks and keep no shared mutable state.
//
// Example:
//   const auto& tok = pipeline::datasets::Tokenizer::gpt2();
//   std::vector<uint32_t> ids = tok.encode_ordinary("Hello world");   // {15496, 995}
//   std::string text = tok.decode(ids);                               // "Hello world"
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pipeline::datasets {

namespace bpe {
struct Vocab;
}
struct VocabTokens;

class Tokenizer {
 public:
  static constexpr uint32_t eot_id = 50256;  // <|endoftext|>
  static constexpr std::string_view eot_text = "<|endoftext|>";

  /// The GPT-2 vocabulary shipped inside the library (datasets/tokenizer/vocab/), laid out at build time
  /// and used in place (datasets/tokenizer/tokenizer_table.h): the first call takes microseconds and
  /// allocates nothing per token. Later calls return the same object.
  static const Tokenizer& gpt2();

  /// Loads GPT-2 format files: encoder.json (token -> id, tokens in GPT-2's byte-to-unicode
  /// alphabet) and vocab.bpe (a "#version" line, then one merge "A B" per line in rank order).
  /// Throws std::runtime_error naming the file and the byte offset or line that is wrong.
  static Tokenizer load(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe);

  /// Same, from file contents already in memory; `encoder_name` and `bpe_name` label errors.
  /// Either way the files are laid out as the same table as the embedded one.
  static Tokenizer from_memory(std::string_view encoder_json, std::string_view vocab_bpe,
                               std::string_view encoder_name, std::string_view bpe_name);

  /// Token ids of text; special tokens such as "<|endoftext|>" are ordinary text here.
  /// Any byte string is accepted: invalid UTF-8 bytes split like U+FFFD would and encode as
  /// their own byte tokens, so decode(encode_ordinary(x)) == x for every x.
  std::vector<uint32_t> encode_ordinary(std::string_view text) const;
  void encode_ordinary_append(std::string_view text, std::vector<uint32_t>& out) const;

  /// With allow_special, each "<|endoftext|>" becomes eot_id and the text between is encoded
  /// ordinarily; without, this is encode_ordinary (tiktoken would raise instead).
  std::vector<uint32_t> encode(std::string_view text, bool allow_special) const;
  void encode_append(std::string_view text, bool allow_special, std::vector<uint32_t>& out) const;

  /// Bytes of the ids, concatenated. Throws std::invalid_argument naming the first id that is
  /// not below vocab_size() and its index.
  std::string decode(std::span<const uint32_t> ids) const;
  void decode_append(std::span<const uint32_t> ids, std::string& out) const;

  /// Bytes of one token (throws std::invalid_argument when id >= vocab_size()).
  std::string_view token_bytes(uint32_t id) const;

  size_t vocab_size() const;  // 50257 for GPT-2

  /// The lookup tables (datasets/tokenizer/tokenizer_bpe.h); for tests and benchmarks of the internals.
  const bpe::Vocab& internal_vocab() const { return *vocab_; }

 private:
  explicit Tokenizer(std::shared_ptr<const bpe::Vocab> vocab);
  static Tokenizer from_table(bpe::Vocab vocab);  // gives it a serial (tokenizer_bpe.h)
  static Tokenizer from_tokens(const VocabTokens& tokens);
  std::shared_ptr<const bpe::Vocab> vocab_;
};

/// The vocabulary files embedded in the library, decompressed, byte-identical to the GPT-2
/// release files (tests compare them with the reference copies).
struct Gpt2VocabFiles {
  std::string encoder_json;
  std::string vocab_bpe;
};
Gpt2VocabFiles gpt2_vocab_files();

}  // namespace pipeline::datasets
