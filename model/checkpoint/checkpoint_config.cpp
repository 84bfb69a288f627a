// The model shape of a checkpoint (see checkpoint_config.h).
#include "model/checkpoint/checkpoint_config.h"

#include <stdexcept>

#include "base/json.h"

namespace pipeline::model {

GPTConfig checkpoint_model_config(const std::string& metadata, const std::string& source) {
  JsonValue v;
  try {
    v = json_parse(metadata);
  } catch (const JsonParseError& e) {
    throw std::runtime_error(source + ": checkpoint metadata is not valid JSON at " + e.what());
  }
  const JsonValue* m = v.find("model");
  if (!m) throw std::runtime_error(source + ": checkpoint metadata has no \"model\" shape");
  auto num = [&](const char* k) -> int64_t {
    const JsonValue* f = m->find(k);
    if (!f || f->type != JsonValue::Type::number)
      throw std::runtime_error(source + ": checkpoint model shape lacks \"" + std::string(k) + "\"");
    return static_cast<int64_t>(std::stod(f->text));
  };
  GPTConfig c;
  c.n_layer = num("n_layer");
  c.n_head = num("n_head");
  c.n_embd = num("n_embd");
  c.block_size = num("block_size");
  c.with_vocab(num("vocab_size"));
  if (const JsonValue* b = m->find("bias")) c.bias = b->boolean;
  c.dropout = 0.0;
  c.validate();
  return c;
}

}  // namespace pipeline::model
