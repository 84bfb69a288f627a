// GPTConfig: presets, validation and sizes (see gpt_config.h).
#include "model/net/gpt_config.h"

#include <sstream>
#include <stdexcept>

namespace pipeline::model {

namespace {

struct PresetEntry {
  const char* name;
  int64_t n_layer, n_head, n_embd, block_size;
};

// GPT-2 sizes from the paper / the released checkpoints; the CPU ones are ours.
constexpr PresetEntry kPresets[] = {
    {"gpt2", 12, 12, 768, 1024},
    {"gpt2-medium", 24, 16, 1024, 1024},
    {"gpt2-large", 36, 20, 1280, 1024},
    {"gpt2-xl", 48, 25, 1600, 1024},
    {"tiny", 2, 2, 64, 64},
    {"small-cpu", 4, 4, 128, 128},
};

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("GPTConfig: " + message);
}

}  // namespace

GPTConfig GPTConfig::preset(std::string_view name) {
  for (const auto& p : kPresets) {
    if (name == p.name) {
      GPTConfig cfg;
      cfg.n_layer = p.n_layer;
      cfg.n_head = p.n_head;
      cfg.n_embd = p.n_embd;
      cfg.block_size = p.block_size;
      cfg.with_vocab(50257);
      return cfg;
    }
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown model preset '" + std::string(name) + "' (known presets: " +
                              known + ")");
}

std::vector<std::string> GPTConfig::preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

int64_t GPTConfig::pad_vocab(int64_t vocab_size, int64_t multiple) {
  require(multiple > 0, "pad multiple must be > 0, got " + std::to_string(multiple));
  return (vocab_size + multiple - 1) / multiple * multiple;
}

GPTConfig& GPTConfig::with_vocab(int64_t vocab) {
  vocab_size = vocab;
  padded_vocab_size = pad_vocab(vocab);
  return *this;
}

void GPTConfig::validate() const {
  require(n_layer > 0, "n_layer must be > 0, got " + std::to_string(n_layer));
  require(n_head > 0, "n_head must be > 0, got " + std::to_string(n_head));
  require(n_embd > 0, "n_embd must be > 0, got " + std::to_string(n_embd));
  require(n_embd % n_head == 0, "n_embd must be divisible by n_head, got n_embd=" +
                                    std::to_string(n_embd) + " n_head=" + std::to_string(n_head));
  require(block_size > 0, "block_size must be > 0, got " + std::to_string(block_size));
  require(vocab_size > 0, "vocab_size must be > 0, got " + std::to_string(vocab_size));
  require(padded_vocab_size >= vocab_size,
          "padded_vocab_size must be >= vocab_size, got padded_vocab_size=" +
              std::to_string(padded_vocab_size) + " vocab_size=" + std::to_string(vocab_size));
  require(dropout >= 0.0 && dropout < 1.0,
          "dropout must be in [0, 1), got " + std::to_string(dropout));
}

int64_t GPTConfig::num_parameters() const {
  const int64_t C = n_embd, b = bias ? 1 : 0;
  const int64_t ln = C + b * C;
  const int64_t attn = (C * 3 * C + b * 3 * C) + (C * C + b * C);
  const int64_t mlp = (C * 4 * C + b * 4 * C) + (4 * C * C + b * C);
  const int64_t block = 2 * ln + attn + mlp;
  return padded_vocab_size * C + block_size * C + n_layer * block + ln;
}

double GPTConfig::flops_per_token(int64_t T) const {
  return 6.0 * static_cast<double>(num_parameters()) +
         12.0 * static_cast<double>(n_layer) * static_cast<double>(n_embd) * static_cast<double>(T);
}

std::string GPTConfig::to_json() const {
  std::ostringstream os;
  os << "{\"n_layer\":" << n_layer << ",\"n_head\":" << n_head << ",\"n_embd\":" << n_embd
     << ",\"block_size\":" << block_size << ",\"vocab_size\":" << vocab_size
     << ",\"padded_vocab_size\":" << padded_vocab_size << ",\"dropout\":" << dropout
     << ",\"bias\":" << (bias ? "true" : "false") << "}";
  return os.str();
}

}  // namespace pipeline::model
