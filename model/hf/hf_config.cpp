// See hf_config.h.
#include "model/hf/hf_config.h"

#include <cmath>
#include <fstream>
#include <memory>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "base/json.h"

namespace pipeline::model {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open" + (fs::exists(path) ? "" : " (no such file)"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t config_int(const JsonValue& root, const fs::path& file, const char* key) {
  const JsonValue* v = root.find(key);
  if (!v) throw std::runtime_error(file.string() + ": missing \"" + key + "\"");
  int64_t out = 0;
  size_t used = 0;
  try {
    out = std::stoll(v->text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v->type != JsonValue::Type::number || used != v->text.size() || out <= 0)
    throw std::runtime_error(file.string() + ": \"" + key + "\" must be a positive integer, found " +
                             (v->type == JsonValue::Type::number ? v->text : JsonValue::type_name(v->type)));
  return out;
}

// A key whose value must be one of `allowed` (a string's text, or a literal's) for this model to be exact.
void require_value(const JsonValue& root, const fs::path& file, const char* key,
                   std::initializer_list<const char*> allowed, const std::string& why) {
  const JsonValue* v = root.find(key);
  if (!v || v->type == JsonValue::Type::null) return;  // transformers' default applies
  std::string text = v->type == JsonValue::Type::boolean ? (v->boolean ? "true" : "false") : v->text;
  for (const char* a : allowed)
    if (text == a) return;
  throw std::runtime_error(file.string() + ": \"" + key + "\" is " + text + "; " + why);
}

}  // namespace

GPTConfig read_hf_config(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  JsonValue root;
  try {
    root = json_parse(read_text(file));
  } catch (const JsonParseError& e) {
    throw std::runtime_error(file.string() + ": not valid JSON at " + e.what());
  }
  if (root.type != JsonValue::Type::object) throw std::runtime_error(file.string() + ": expected a JSON object");
  const JsonValue* type = root.find("model_type");
  if (!type || type->text != "gpt2")
    throw std::runtime_error(file.string() + ": \"model_type\" is " + (type ? "\"" + type->text + "\"" : "missing") +
                             "; only GPT-2 (\"gpt2\") models can be loaded");
  require_value(root, file, "activation_function", {"gelu_new", "gelu_pytorch_tanh"},
                "this model uses GELU with the tanh approximation (gelu_new)");
  require_value(root, file, "scale_attn_weights", {"true"}, "this model scales attention by 1/sqrt(head_dim)");
  require_value(root, file, "scale_attn_by_inverse_layer_idx", {"false"}, "this model does not scale by layer");
  require_value(root, file, "tie_word_embeddings", {"true"}, "this model ties the output head to wte");
  require_value(root, file, "add_cross_attention", {"false"}, "this model is decoder-only");
  if (const JsonValue* eps = root.find("layer_norm_epsilon"); eps && eps->type == JsonValue::Type::number &&
                                                              std::fabs(std::stod(eps->text) - 1e-5) > 1e-12)
    throw std::runtime_error(file.string() + ": \"layer_norm_epsilon\" is " + eps->text + "; this model uses 1e-5");
  GPTConfig cfg;
  cfg.n_layer = config_int(root, file, "n_layer");
  cfg.n_head = config_int(root, file, "n_head");
  cfg.n_embd = config_int(root, file, "n_embd");
  cfg.block_size = config_int(root, file, "n_positions");
  cfg.with_vocab(config_int(root, file, "vocab_size"));
  if (const JsonValue* inner = root.find("n_inner"); inner && inner->type != JsonValue::Type::null &&
                                                       inner->text != std::to_string(4 * cfg.n_embd))
    throw std::runtime_error(file.string() + ": \"n_inner\" is " + inner->text + "; this model's MLP is 4 * n_embd = " +
                             std::to_string(4 * cfg.n_embd) + " wide");
  cfg.bias = true;
  try {
    cfg.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
  return cfg;
}

HfWeightFiles::HfWeightFiles(const fs::path& dir) {
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  std::vector<fs::path> files;
  if (fs::exists(single)) {
    files.push_back(single);
  } else if (fs::exists(index)) {
    JsonValue root;
    try {
      root = json_parse(read_text(index));
    } catch (const JsonParseError& e) {
      throw std::runtime_error(index.string() + ": not valid JSON at " + e.what());
    }
    const JsonValue* map = root.find("weight_map");
    if (!map || map->type != JsonValue::Type::object)
      throw std::runtime_error(index.string() + ": no \"weight_map\" object");
    std::set<std::string> names;
    for (const auto& [tensor, file] : map->members) {
      if (file.type != JsonValue::Type::string || file.text.empty() || file.text.find('/') != std::string::npos)
        throw std::runtime_error(index.string() + ": weight_map[\"" + tensor + "\"] is not a file name");
      if (names.insert(file.text).second) files.push_back(dir / file.text);
    }
  } else {
    std::string hint = fs::exists(dir / "pytorch_model.bin")
                           ? " (pytorch_model.bin, a pickle, is not read: re-save it with transformers' "
                             "save_pretrained(dir, safe_serialization=True))"
                           : "";
    throw std::runtime_error(dir.string() + ": no model.safetensors or model.safetensors.index.json" + hint);
  }
  for (const auto& f : files) {
    readers.push_back(std::make_unique<datasets::SafetensorsReader>(f));
    for (const auto& t : readers.back()->header().tensors) {
      if (!tensors.emplace(t.name, std::make_pair(readers.back().get(), &t)).second)
        throw std::runtime_error(f.string() + ": tensor '" + t.name + "' is also in another shard of " + dir.string());
    }
  }
}

}  // namespace pipeline::model
