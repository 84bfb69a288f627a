// Hugging Face tokenizer files for GPT-2 (see hf_tokenizer.h). tokenizer.json follows the
// structure transformers 5 builds when it converts vocab.json + merges.txt (the interop test
// compares the two): a ByteLevel pre-tokenizer without prefix space, a BPE model with no unknown
// token, a ByteLevel decoder, a template post-processor that adds nothing, and <|endoftext|> as
// the one added (special) token.
#include "datasets/tokenizer/hf_tokenizer.h"

#include <string_view>

#include "datasets/tokenizer/tokenizer.h"
#include "base/json.h"

namespace pipeline::datasets {

namespace {

// merges.txt's merges as a JSON array of pairs: [["Ġ","t"],["Ġ","a"],...].
std::string merges_json(std::string_view bpe) {
  std::string out = "[";
  bool first_line = true, first_merge = true;
  while (!bpe.empty()) {
    const size_t nl = bpe.find('\n');
    std::string_view line = bpe.substr(0, nl);
    bpe = nl == std::string_view::npos ? std::string_view() : bpe.substr(nl + 1);
    const bool header = first_line && line.starts_with("#version");
    first_line = false;
    const size_t space = line.find(' ');
    if (header || line.empty() || space == std::string_view::npos) continue;
    out += (first_merge ? "[" : ",[") + json_quote(line.substr(0, space)) + "," + json_quote(line.substr(space + 1)) + "]";
    first_merge = false;
  }
  return out + "]";
}

}  // namespace

HfTokenizerFiles hf_gpt2_tokenizer_files(int64_t model_max_length) {
  const Gpt2VocabFiles files = gpt2_vocab_files();
  HfTokenizerFiles out;
  out.vocab_json = files.encoder_json;
  out.merges_txt = files.vocab_bpe;
  const std::string eot = json_quote(Tokenizer::eot_text);
  out.tokenizer_json =
      "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
      "\"added_tokens\":[{\"id\":" + std::to_string(Tokenizer::eot_id) + ",\"content\":" + eot +
      ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
      "\"normalizer\":null,"
      "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
      "\"post_processor\":{\"type\":\"TemplateProcessing\","
      "\"single\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
      "\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"
      "\"special_tokens\":{}},"
      "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
      "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":\"\","
      "\"end_of_word_suffix\":\"\",\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"
      "\"vocab\":" + files.encoder_json + ",\"merges\":" + merges_json(files.vocab_bpe) + "}}\n";
  out.tokenizer_config_json =
      "{\n  \"add_prefix_space\": false,\n  \"bos_token\": " + eot + ",\n  \"eos_token\": " + eot +
      ",\n  \"errors\": \"replace\",\n  \"model_max_length\": " + std::to_string(model_max_length) +
      ",\n  \"pad_token\": null,\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"unk_token\": " + eot + "\n}\n";
  return out;
}

}  // namespace pipeline::datasets
