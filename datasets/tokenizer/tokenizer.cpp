// GPT-2 tokenizer: opening a vocabulary (embedded or from files), encode, decode, and the
// embedded release files.
#include "datasets/tokenizer/tokenizer.h"

#include <zstd.h>

#include <atomic>
#include <span>
#include <stdexcept>

#include "datasets/tokenizer/tokenizer_bpe.h"
#include "datasets/tokenizer/tokenizer_files.h"
#include "datasets/tokenizer/tokenizer_pretokenize.h"
#include "datasets/tokenizer/tokenizer_table.h"

// The release files as they are, generated at build time from datasets/tokenizer/vocab/*.zst
// (datasets/tokenizer/vocab/embed.cmake); the tokenizer itself uses the table (tokenizer_table.h).
namespace pipeline::datasets::embedded {
extern const unsigned char gpt2_encoder_json_zst[];
extern const size_t gpt2_encoder_json_zst_size;
extern const unsigned char gpt2_vocab_bpe_zst[];
extern const size_t gpt2_vocab_bpe_zst_size;
}  // namespace pipeline::datasets::embedded

namespace pipeline::datasets {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

std::string zstd_decompress(const unsigned char* data, size_t size, const char* name) {
  std::string out;
  ZSTD_DStream* ds = ZSTD_createDStream();
  if (ds == nullptr) fail(std::string("zstd: cannot create a decompression stream for ") + name);
  ZSTD_inBuffer in{data, size, 0};
  std::string chunk(ZSTD_DStreamOutSize(), '\0');
  size_t ret = 1;
  while (in.pos < in.size) {
    ZSTD_outBuffer o{chunk.data(), chunk.size(), 0};
    ret = ZSTD_decompressStream(ds, &o, &in);
    if (ZSTD_isError(ret)) {
      ZSTD_freeDStream(ds);
      fail(std::string("embedded ") + name + ": zstd error at byte offset " + std::to_string(in.pos) + ": " +
           ZSTD_getErrorName(ret));
    }
    out.append(chunk.data(), o.pos);
  }
  ZSTD_freeDStream(ds);
  if (ret != 0) fail(std::string("embedded ") + name + ": truncated zstd frame");
  return out;
}

}  // namespace

Gpt2VocabFiles gpt2_vocab_files() {
  return {zstd_decompress(embedded::gpt2_encoder_json_zst, embedded::gpt2_encoder_json_zst_size,
                          "gpt2_encoder.json.zst"),
          zstd_decompress(embedded::gpt2_vocab_bpe_zst, embedded::gpt2_vocab_bpe_zst_size, "gpt2_vocab.bpe.zst")};
}

Tokenizer::Tokenizer(std::shared_ptr<const bpe::Vocab> vocab) : vocab_(std::move(vocab)) {}

Tokenizer Tokenizer::from_table(bpe::Vocab vocab) {
  // Per-thread piece caches tag their entries with this, so no two vocabularies may share it.
  static std::atomic<uint32_t> next_serial{1};
  vocab.serial = next_serial.fetch_add(1);
  return Tokenizer(std::make_shared<const bpe::Vocab>(std::move(vocab)));
}

Tokenizer Tokenizer::from_tokens(const VocabTokens& tokens) {
  std::vector<unsigned char> table = vocab_table_build(tokens);
  bpe::Vocab v = vocab_table_open(table, "vocabulary table");
  v.storage = std::move(table);  // the views stay valid: a moved vector keeps its buffer
  return from_table(std::move(v));
}

const Tokenizer& Tokenizer::gpt2() {
  static const Tokenizer tok = from_table(vocab_table_open(
      std::span(embedded::gpt2_vocab_table, embedded::gpt2_vocab_table_size), "embedded GPT-2 vocabulary table"));
  return tok;
}

Tokenizer Tokenizer::load(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe) {
  return from_tokens(vocab_tokens_load(encoder_json, vocab_bpe));
}

Tokenizer Tokenizer::from_memory(std::string_view encoder_json, std::string_view vocab_bpe,
                                 std::string_view encoder_name, std::string_view bpe_name) {
  return from_tokens(vocab_tokens_parse(encoder_json, vocab_bpe, encoder_name, bpe_name));
}

void Tokenizer::encode_ordinary_append(std::string_view text, std::vector<uint32_t>& out) const {
  const bpe::Vocab& v = *vocab_;
  // About 3.3 bytes per token for English; growing once up front beats repeated doubling.
  if (out.capacity() - out.size() < text.size() / 3) out.reserve(out.size() + text.size() / 3 + 16);
  bpe::PieceCache& cache = bpe::thread_piece_cache();
  Pretokenizer pre(text);
  for (std::string_view piece = pre.next(); !piece.empty(); piece = pre.next()) bpe::encode_piece(v, cache, piece, out);
}

std::vector<uint32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<uint32_t> out;
  encode_ordinary_append(text, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, bool allow_special, std::vector<uint32_t>& out) const {
  const bpe::Vocab& v = *vocab_;
  if (!allow_special || v.specials.size() == 0) {
    encode_ordinary_append(text, out);
    return;
  }
  // The earliest special token wins; text between specials is encoded on its own, as in tiktoken.
  size_t start = 0;
  for (;;) {
    size_t best = std::string_view::npos;
    uint32_t which = bpe::no_id;
    for (size_t i = 0; i < v.specials.size(); ++i) {
      const std::string_view sp = v.bytes_of(v.specials[i]);
      const size_t at = text.find(sp, start);
      if (at < best || (at == best && which != bpe::no_id && sp.size() > v.bytes_of(which).size())) {
        best = at;
        which = v.specials[i];
      }
    }
    if (which == bpe::no_id || best == std::string_view::npos) break;
    encode_ordinary_append(text.substr(start, best - start), out);
    out.push_back(which);
    start = best + v.bytes_of(which).size();
  }
  encode_ordinary_append(text.substr(start), out);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<uint32_t> out;
  encode_append(text, allow_special, out);
  return out;
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  if (id >= vocab_size())
    throw std::invalid_argument("token id " + std::to_string(id) + " is out of range (vocabulary size " +
                                std::to_string(vocab_size()) + ")");
  return vocab_->bytes_of(id);
}

void Tokenizer::decode_append(std::span<const uint32_t> ids, std::string& out) const {
  const bpe::Vocab& v = *vocab_;
  const uint32_t n = static_cast<uint32_t>(vocab_size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= n)
      throw std::invalid_argument("cannot decode token id " + std::to_string(ids[i]) + " at index " +
                                  std::to_string(i) + ": ids must be below the vocabulary size " + std::to_string(n));
    out += v.bytes_of(ids[i]);
  }
}

std::string Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  decode_append(ids, out);
  return out;
}

size_t Tokenizer::vocab_size() const { return vocab_->size(); }

}  // namespace pipeline::datasets
