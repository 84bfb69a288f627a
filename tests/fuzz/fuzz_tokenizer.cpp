// Fuzzes the GPT-2 tokenizer: encoding any bytes gives ids below the vocabulary size, and
// decoding them gives the bytes back. The first byte chooses whether "<|endoftext|>" is special.
#include <cstdint>
#include <string>

#include "datasets/tokenizer/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const auto& tok = pipeline::datasets::Tokenizer::gpt2();
  const bool allow_special = data[0] & 1;
  const auto text = fuzz_util::as_text(data + 1, size - 1);
  const auto ids = tok.encode(text, allow_special);
  for (uint32_t id : ids)
    if (id >= tok.vocab_size()) fuzz_util::broken("id " + std::to_string(id) + " out of range");
  if (tok.decode(ids) != text) fuzz_util::broken("decode(encode(x)) != x");
  return 0;
}
