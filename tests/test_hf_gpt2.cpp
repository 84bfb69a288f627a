// Hugging Face GPT-2 directories (model/hf/hf_gpt2.h) without Python: what `pipeline export` writes
// reads back bit for bit, and every way such a directory can be wrong for this model (config.json
// or the weights) is an error naming the file and the key or tensor. The comparison with
// transformers itself is tests/test_interop.cpp.
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "datasets/weights/safetensors.h"
#include "model/hf/hf_gpt2.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;
using datasets::SafetensorsDtype;
using test_util::contains;
using test_util::error_of;
using test_util::read_file;
using test_util::TempDir;
using test_util::write_file;

namespace {

using Tensors = std::map<std::string, torch::Tensor>;

model::GPTConfig tiny() {
  auto cfg = model::GPTConfig::preset("tiny");
  cfg.with_vocab(300);
  return cfg;
}

model::NamedTensors params_of(model::GPT& m) {
  model::NamedTensors out;
  for (const auto& p : m->named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

// Every tensor of DIR/model.safetensors (F32 or I64 here).
Tensors load_all(const fs::path& dir) {
  datasets::SafetensorsReader r(dir / "model.safetensors");
  Tensors out;
  for (const auto& t : r.header().tensors) {
    std::vector<int64_t> shape(t.shape.begin(), t.shape.end());
    auto type = t.dtype == SafetensorsDtype::I64 ? torch::kLong : torch::kFloat;
    auto x = torch::empty(shape, torch::TensorOptions().dtype(type));
    r.read(t, x.data_ptr());
    out[t.name] = x;
  }
  return out;
}

// DIR/model.safetensors replaced by `tensors` (float32 -> F32, int64 -> I64).
void save_all(const fs::path& dir, const Tensors& tensors) {
  std::vector<datasets::SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors)
    entries.push_back({name, t.scalar_type() == torch::kLong ? SafetensorsDtype::I64 : SafetensorsDtype::F32,
                       std::vector<uint64_t>(t.sizes().begin(), t.sizes().end())});
  datasets::SafetensorsWriter w(dir / "model.safetensors", entries, {{"format", "pt"}});
  for (const auto& e : w.order()) {
    auto t = tensors.at(e.name).contiguous();
    w.write(e.name, t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  }
  w.finish();
}

// A tiny model exported to DIR; returns its parameters.
model::NamedTensors export_tiny(const fs::path& dir) {
  model::GPT m(tiny(), 11);
  auto params = params_of(m);
  model::write_hf_model(dir, tiny(), params);
  return params;
}

std::string load_error(const fs::path& dir) {
  return error_of([&] { model::read_hf_weights(dir, tiny()); });
}

// config.json with one key's value replaced (the JSON text after `"key": ` up to the comma).
void edit_config(const fs::path& dir, const std::string& key, const std::string& value) {
  std::string text = read_file(dir / "config.json");
  const std::string k = "\"" + key + "\": ";
  const size_t at = text.find(k);
  REQUIRE(at != std::string::npos);
  const size_t from = at + k.size(), to = text.find_first_of(",\n", from);
  text.replace(from, to - from, value);
  write_file(dir / "config.json", text);
}

}  // namespace

TEST_CASE("export then import gives the parameters back bit for bit; fp16 within its rounding") {
  TempDir tmp("hf");
  const auto params = export_tiny(tmp.path / "f32");
  const auto cfg = model::read_hf_config(tmp.path / "f32");
  CHECK(cfg.n_layer == 2);
  CHECK(cfg.vocab_size == 300);
  CHECK(cfg.padded_vocab_size == tiny().padded_vocab_size);
  auto back = model::read_hf_weights(tmp.path / "f32", tiny());
  REQUIRE(back.size() == params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CAPTURE(params[i].first);
    CHECK(back[i].first == params[i].first);
    if (params[i].first == "wte.weight") {  // the padding rows are not exported: they come back as zeros
      CHECK(back[i].second.narrow(0, 0, 300).equal(params[i].second.narrow(0, 0, 300)));
      CHECK(back[i].second.narrow(0, 300, back[i].second.size(0) - 300).abs().max().item<float>() == 0.0f);
    } else {
      CHECK(back[i].second.equal(params[i].second));
    }
  }
  // The file holds their names and the Conv1D layout, and no lm_head (tied).
  const auto theirs = load_all(tmp.path / "f32");
  CHECK(theirs.size() == model::hf_tensor_shapes(tiny()).size());
  CHECK(theirs.count("lm_head.weight") == 0);
  CHECK(theirs.at("transformer.h.0.attn.c_attn.weight").sizes() == at::IntArrayRef({64, 192}));

  model::write_hf_model(tmp.path / "f16", tiny(), params, model::HfDtype::f16);
  CHECK(fs::file_size(tmp.path / "f16" / "model.safetensors") < fs::file_size(tmp.path / "f32" / "model.safetensors"));
  auto half = model::read_hf_weights(tmp.path / "f16", tiny());
  for (size_t i = 0; i < params.size(); ++i)
    CHECK(half[i].second.equal(back[i].second.to(torch::kHalf).to(torch::kFloat)));

  // A shorter context crops the position table.
  auto cropped = tiny();
  cropped.block_size = 16;
  auto short_ctx = model::read_hf_weights(tmp.path / "f32", cropped);
  CHECK(short_ctx[1].first == "wpe.weight");
  CHECK(short_ctx[1].second.equal(params[1].second.narrow(0, 0, 16)));
}

TEST_CASE("an lm_head equal to wte is accepted; one that differs is an error naming it") {
  TempDir tmp("hf");
  export_tiny(tmp.path);
  auto t = load_all(tmp.path);
  t["lm_head.weight"] = t.at("transformer.wte.weight").clone();
  save_all(tmp.path, t);
  CHECK(load_error(tmp.path) == "");
  t["lm_head.weight"][0][0] += 1.0f;
  save_all(tmp.path, t);
  auto e = load_error(tmp.path);
  CHECK(contains(e, "model.safetensors"));
  CHECK(contains(e, "'lm_head.weight' differs from the token embedding"));
}

TEST_CASE("weights that do not fit are errors naming the file and the tensor") {
  TempDir tmp("hf");
  export_tiny(tmp.path);
  const auto good = load_all(tmp.path);
  auto with = [&](const std::function<void(Tensors&)>& change) {
    Tensors t = good;
    change(t);
    save_all(tmp.path, t);
    return load_error(tmp.path);
  };
  SUBCASE("a missing tensor") {
    auto e = with([](Tensors& t) { t.erase("transformer.h.1.mlp.c_fc.bias"); });
    CHECK(contains(e, "'transformer.h.1.mlp.c_fc.bias'"));
    CHECK(contains(e, "is missing"));
  }
  SUBCASE("a Conv1D weight in nn.Linear's layout") {
    auto e = with([](Tensors& t) { t["transformer.h.0.attn.c_attn.weight"] = t["transformer.h.0.attn.c_attn.weight"].t(); });
    CHECK(contains(e, "model.safetensors"));
    CHECK(contains(e, "'transformer.h.0.attn.c_attn.weight' has shape [192, 64], expected [64, 192]"));
  }
  SUBCASE("an integer dtype") {
    auto e = with([](Tensors& t) { t["transformer.ln_f.weight"] = t["transformer.ln_f.weight"].to(torch::kLong); });
    CHECK(contains(e, "model.safetensors"));
    CHECK(contains(e, "'transformer.ln_f.weight' has dtype I64"));
  }
  SUBCASE("a tensor of a deeper model") {
    auto e = with([](Tensors& t) { t["transformer.h.2.ln_1.weight"] = torch::ones({64}); });
    CHECK(contains(e, "'transformer.h.2.ln_1.weight' is not part of a GPT-2 of this shape (2 layers)"));
  }
  SUBCASE("the same parameter with and without the prefix") {
    auto e = with([](Tensors& t) { t["ln_f.bias"] = t["transformer.ln_f.bias"]; });
    CHECK(contains(e, "same parameter"));
  }
  SUBCASE("the Hub's layout (no prefix, attention-mask buffers) is not an error") {
    auto e = with([](Tensors& t) {
      Tensors hub;
      for (auto& [name, x] : t) hub[name.substr(std::string("transformer.").size())] = x;
      hub["h.0.attn.bias"] = torch::ones({1, 1, 64, 64});
      hub["h.0.attn.masked_bias"] = torch::full({}, -1e4);
      t = hub;
    });
    CHECK(e == "");
  }
  SUBCASE("a truncated file") {
    Tensors t = good;
    save_all(tmp.path, t);
    const std::string bytes = read_file(tmp.path / "model.safetensors");
    write_file(tmp.path / "model.safetensors", bytes.substr(0, bytes.size() - 10));
    auto e = load_error(tmp.path);
    CHECK(contains(e, "model.safetensors"));
  }
}

TEST_CASE("a config.json this model cannot compute exactly is an error naming the file and the key") {
  TempDir tmp("hf");
  export_tiny(tmp.path);
  const std::string good = read_file(tmp.path / "config.json");
  auto config_error = [&](const std::string& key, const std::string& value) {
    write_file(tmp.path / "config.json", good);
    edit_config(tmp.path, key, value);
    return error_of([&] { model::read_hf_config(tmp.path); });
  };
  CHECK(error_of([&] { model::read_hf_config(tmp.path); }) == "");
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"model_type", "\"bert\""},
           {"activation_function", "\"relu\""},
           {"layer_norm_epsilon", "1e-06"},
           {"n_inner", "100"},
           {"scale_attn_by_inverse_layer_idx", "true"},
           {"n_embd", "\"wide\""},
           {"n_head", "5"}}) {  // 64 is not a multiple of 5
    CAPTURE(key);
    auto e = config_error(key, value);
    CHECK(contains(e, (tmp.path / "config.json").string()));
    CHECK(contains(e, key));
  }
  // The shape a caller expects must be the file's.
  write_file(tmp.path / "config.json", good);
  auto deeper = tiny();
  deeper.n_layer = 3;
  auto e = error_of([&] { model::read_hf_weights(tmp.path, deeper); });
  CHECK(contains(e, "config.json"));
  CHECK(contains(e, "the model has 2 layers"));

  fs::remove(tmp.path / "config.json");
  e = error_of([&] { model::read_hf_config(tmp.path); });
  CHECK(contains(e, "config.json"));
}
