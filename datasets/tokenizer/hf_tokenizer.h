// The GPT-2 tokenizer as Hugging Face files, so AutoTokenizer.from_pretrained loads an exported
// model directory as it is: vocab.json and merges.txt (the GPT-2 release files, byte for byte),
// tokenizer.json (the `tokenizers` serialization transformers itself builds from those two), and
// tokenizer_config.json (special tokens, context length).
#pragma once

#include <cstdint>
#include <string>

namespace pipeline::datasets {

struct HfTokenizerFiles {
  std::string vocab_json;             // token -> id (GPT-2's encoder.json)
  std::string merges_txt;             // "#version: 0.2", then one merge "A B" per line (GPT-2's vocab.bpe)
  std::string tokenizer_json;         // byte-level BPE, <|endoftext|> (50256) a special token
  std::string tokenizer_config_json;  // GPT2Tokenizer, bos = eos = unk = <|endoftext|>, model_max_length
};

/// The files for the GPT-2 vocabulary embedded in the library. `model_max_length` is the model's
/// context (n_positions).
HfTokenizerFiles hf_gpt2_tokenizer_files(int64_t model_max_length);

}  // namespace pipeline::datasets
