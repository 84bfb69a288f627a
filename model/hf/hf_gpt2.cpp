// Hugging Face GPT-2 directories: config.json written (read: hf_config.cpp), weights both ways (see hf_gpt2.h).
#include "model/hf/hf_gpt2.h"

#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "base/atomic_file.h"
#include "datasets/tokenizer/hf_tokenizer.h"
#include "datasets/weights/safetensors.h"
#include "base/json.h"

namespace pipeline::model {

namespace fs = std::filesystem;
using datasets::SafetensorsDtype;

namespace {

constexpr const char* kPrefix = "transformer.";

// ---- the name and layout mapping -------------------------------------------------------------

// Our parameter name -> the Hub's name (without the prefix), and whether the weight is a Conv1D
// (stored transposed).
struct HfName {
  std::string name;
  bool conv1d = false;
};

HfName hf_name_of(const std::string& ours) {
  const bool conv1d = ours.ends_with(".weight") && (ours.find(".c_attn.") != std::string::npos ||
                                                    ours.find(".c_proj.") != std::string::npos ||
                                                    ours.find(".c_fc.") != std::string::npos);
  return {ours, conv1d};  // the names agree: model/net/gpt2.h follows GPT-2's own
}

// The Hub's attention-mask buffers: not parameters, recomputed by every implementation.
bool is_mask_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// Our parameters of a model of shape cfg, names and shapes as GPT(cfg)->named_parameters() has
// them (load_parameters checks that against the model itself), without building one.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const GPTConfig& cfg) {
  const int64_t C = cfg.n_embd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"wte.weight", {cfg.padded_vocab_size, C}},
                                                                   {"wpe.weight", {cfg.block_size, C}}};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {C}}, {"ln_1.bias", {C}},
             {"attn.c_attn.weight", {3 * C, C}}, {"attn.c_attn.bias", {3 * C}},
             {"attn.c_proj.weight", {C, C}}, {"attn.c_proj.bias", {C}},
             {"ln_2.weight", {C}}, {"ln_2.bias", {C}},
             {"mlp.c_fc.weight", {4 * C, C}}, {"mlp.c_fc.bias", {4 * C}},
             {"mlp.c_proj.weight", {C, 4 * C}}, {"mlp.c_proj.bias", {C}}})
      out.emplace_back(h + name, shape);
  }
  out.push_back({"ln_f.weight", {C}});
  out.push_back({"ln_f.bias", {C}});
  return out;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

torch::ScalarType torch_type(SafetensorsDtype d, const std::string& file, const std::string& tensor) {
  switch (d) {
    case SafetensorsDtype::F32: return torch::kFloat;
    case SafetensorsDtype::F16: return torch::kHalf;
    case SafetensorsDtype::BF16: return torch::kBFloat16;
    case SafetensorsDtype::F64: return torch::kDouble;
    default:
      throw std::runtime_error(file + ": tensor '" + tensor + "' has dtype " + datasets::safetensors_dtype_name(d) +
                               ", expected a floating type (F32, F16, BF16 or F64)");
  }
}

// The weight files (hf_config.h), and their tensors read as fp32 tensors.
struct WeightFiles : HfWeightFiles {
  using HfWeightFiles::HfWeightFiles;

  torch::Tensor load(const std::string& name) const {
    const auto& [reader, t] = tensors.at(name);
    std::vector<int64_t> shape(t->shape.begin(), t->shape.end());
    auto out = torch::empty(shape, torch::TensorOptions().dtype(torch_type(t->dtype, reader->path().string(), name)));
    reader->read(*t, out.data_ptr());
    return out.to(torch::kFloat);
  }
};

}  // namespace

HfDtype parse_hf_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return HfDtype::f32;
  if (name == "fp16" || name == "float16") return HfDtype::f16;
  if (name == "bf16" || name == "bfloat16") return HfDtype::bf16;
  throw std::invalid_argument("unknown dtype '" + name + "' (expected fp32, fp16 or bf16)");
}

std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(const GPTConfig& cfg) {
  auto out = parameter_shapes(cfg);
  for (auto& [name, shape] : out) {
    const HfName hf = hf_name_of(name);
    if (name == "wte.weight") shape[0] = cfg.vocab_size;
    if (hf.conv1d) std::swap(shape[0], shape[1]);
    name = kPrefix + hf.name;
  }
  return out;
}

std::string hf_config_json(const GPTConfig& cfg, HfDtype dtype) {
  // The keys transformers' GPT2Config writes, in its (sorted) order; dropout is the model's own.
  const char* dtype_name = dtype == HfDtype::f32 ? "float32" : dtype == HfDtype::f16 ? "float16" : "bfloat16";
  std::ostringstream o;
  o.precision(17);
  o << "{\n"
    << "  \"activation_function\": \"gelu_new\",\n"
    << "  \"add_cross_attention\": false,\n"
    << "  \"architectures\": [\n    \"GPT2LMHeadModel\"\n  ],\n"
    << "  \"attn_pdrop\": " << cfg.dropout << ",\n"
    << "  \"bos_token_id\": 50256,\n"
    << "  \"dtype\": \"" << dtype_name << "\",\n"
    << "  \"embd_pdrop\": " << cfg.dropout << ",\n"
    << "  \"eos_token_id\": 50256,\n"
    << "  \"initializer_range\": 0.02,\n"
    << "  \"layer_norm_epsilon\": 1e-05,\n"
    << "  \"model_type\": \"gpt2\",\n"
    << "  \"n_ctx\": " << cfg.block_size << ",\n"
    << "  \"n_embd\": " << cfg.n_embd << ",\n"
    << "  \"n_head\": " << cfg.n_head << ",\n"
    << "  \"n_inner\": null,\n"
    << "  \"n_layer\": " << cfg.n_layer << ",\n"
    << "  \"n_positions\": " << cfg.block_size << ",\n"
    << "  \"reorder_and_upcast_attn\": false,\n"
    << "  \"resid_pdrop\": " << cfg.dropout << ",\n"
    << "  \"scale_attn_by_inverse_layer_idx\": false,\n"
    << "  \"scale_attn_weights\": true,\n"
    << "  \"tie_word_embeddings\": true,\n"
    << "  \"torch_dtype\": \"" << dtype_name << "\",\n"
    << "  \"use_cache\": true,\n"
    << "  \"vocab_size\": " << cfg.vocab_size << "\n"
    << "}\n";
  return o.str();
}

std::string hf_generation_config_json() {
  return "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 50256,\n  \"eos_token_id\": 50256\n}\n";
}

uint64_t write_hf_model(const fs::path& dir, const GPTConfig& cfg, const NamedTensors& params, HfDtype dtype) {
  torch::NoGradGuard no_grad;
  fs::create_directories(dir);
  const torch::ScalarType st = dtype == HfDtype::f32 ? torch::kFloat : dtype == HfDtype::f16 ? torch::kHalf : torch::kBFloat16;
  const SafetensorsDtype sd = dtype == HfDtype::f32 ? SafetensorsDtype::F32
                              : dtype == HfDtype::f16 ? SafetensorsDtype::F16
                                                      : SafetensorsDtype::BF16;
  // Our tensors in their layout, computed one at a time as the writer asks for them, so at most
  // one converted tensor exists besides the model.
  std::map<std::string, std::function<torch::Tensor()>> make;
  std::vector<datasets::SafetensorsWriter::Entry> entries;
  std::set<std::string> have;
  auto add = [&](const std::string& hf, std::vector<int64_t> shape, std::function<torch::Tensor()> f) {
    entries.push_back({kPrefix + hf, sd, std::vector<uint64_t>(shape.begin(), shape.end())});
    make[kPrefix + hf] = std::move(f);
  };
  for (const auto& [name, p] : params) {
    have.insert(name);
    const HfName hf = hf_name_of(name);
    torch::Tensor t = p;
    if (name == "wte.weight") {
      add(hf.name, {cfg.vocab_size, cfg.n_embd}, [t, &cfg] { return t.narrow(0, 0, cfg.vocab_size); });
    } else if (hf.conv1d) {
      add(hf.name, {t.size(1), t.size(0)}, [t] { return t.t(); });
    } else {
      add(hf.name, t.sizes().vec(), [t] { return t; });
    }
  }
  // A model without biases is the same function as one with zero biases, which is what GPT-2 has.
  for (const auto& [name, shape] : parameter_shapes(cfg))
    if (name.ends_with(".bias") && !have.count(name)) add(name, shape, [shape] { return torch::zeros(shape); });
  datasets::SafetensorsWriter w(dir / "model.safetensors", entries, {{"format", "pt"}});
  for (const auto& t : w.order()) {
    auto data = make.at(t.name)().to(torch::kCPU).to(st).contiguous();
    w.write(t.name, data.data_ptr(), static_cast<size_t>(data.numel()) * data.element_size());
  }
  w.finish();
  write_file_atomic(dir / "config.json", hf_config_json(cfg, dtype));
  write_file_atomic(dir / "generation_config.json", hf_generation_config_json());
  return fs::file_size(dir / "model.safetensors");
}

void write_hf_tokenizer(const fs::path& dir, int64_t model_max_length) {
  fs::create_directories(dir);
  const auto files = datasets::hf_gpt2_tokenizer_files(model_max_length);
  write_file_atomic(dir / "vocab.json", files.vocab_json);
  write_file_atomic(dir / "merges.txt", files.merges_txt);
  write_file_atomic(dir / "tokenizer.json", files.tokenizer_json);
  write_file_atomic(dir / "tokenizer_config.json", files.tokenizer_config_json);
}

NamedTensors read_hf_weights(const fs::path& dir, const GPTConfig& cfg) {
  const GPTConfig given = read_hf_config(dir);
  if (given.n_layer != cfg.n_layer || given.n_head != cfg.n_head || given.n_embd != cfg.n_embd)
    throw std::runtime_error((dir / "config.json").string() + ": the model has " + std::to_string(given.n_layer) +
                             " layers, " + std::to_string(given.n_head) + " heads, width " + std::to_string(given.n_embd) +
                             "; expected " + std::to_string(cfg.n_layer) + ", " + std::to_string(cfg.n_head) + ", " +
                             std::to_string(cfg.n_embd));
  if (cfg.block_size > given.block_size || cfg.vocab_size != given.vocab_size)
    throw std::runtime_error((dir / "config.json").string() + ": n_positions " + std::to_string(given.block_size) +
                             " and vocab_size " + std::to_string(given.vocab_size) + " cannot hold block_size " +
                             std::to_string(cfg.block_size) + " and vocab_size " + std::to_string(cfg.vocab_size));
  WeightFiles files(dir);
  // Their names without the prefix -> full name; both layouts at once would be ambiguous.
  std::unordered_map<std::string, std::string> by_short;
  std::optional<std::string> lm_head;
  for (const auto& [name, _] : files.tensors) {
    std::string s = name.starts_with(kPrefix) ? name.substr(std::string(kPrefix).size()) : name;
    if (s == "lm_head.weight" || name == "lm_head.weight") {
      lm_head = name;
      continue;
    }
    if (!by_short.emplace(s, name).second)
      throw std::runtime_error(files.file_of(name) + ": tensor '" + name + "' and '" + by_short[s] +
                               "' are the same parameter with and without the 'transformer.' prefix");
  }
  NamedTensors out;
  std::set<std::string> used;
  torch::Tensor wte;
  for (const auto& [ours, ours_shape] : parameter_shapes(cfg)) {
    const HfName theirs = hf_name_of(ours);
    auto it = by_short.find(theirs.name);
    if (it == by_short.end())
      throw std::runtime_error(dir.string() + ": tensor '" + std::string(kPrefix) + theirs.name + "' (or '" + theirs.name +
                               "') is missing from the safetensors file(s)");
    used.insert(it->second);
    torch::Tensor t = files.load(it->second);
    std::vector<int64_t> expect = ours_shape;
    if (ours == "wte.weight") expect[0] = cfg.vocab_size;
    if (ours == "wpe.weight") expect[0] = given.block_size;
    if (theirs.conv1d) std::swap(expect[0], expect[1]);
    if (t.sizes() != at::IntArrayRef(expect))
      throw std::runtime_error(files.file_of(it->second) + ": tensor '" + it->second + "' has shape " + shape_str(t.sizes()) +
                               ", expected " + shape_str(expect) + " for this config");
    if (theirs.conv1d) t = t.t().contiguous();
    if (ours == "wte.weight") {
      wte = t;
      t = torch::cat({t, torch::zeros({cfg.padded_vocab_size - cfg.vocab_size, cfg.n_embd})});  // (Vp, C)
    }
    if (ours == "wpe.weight") t = t.narrow(0, 0, cfg.block_size).contiguous();  // (T, C)
    out.emplace_back(ours, std::move(t));
  }
  if (lm_head) {
    torch::Tensor head = files.load(*lm_head);
    if (!head.equal(wte))
      throw std::runtime_error(files.file_of(*lm_head) + ": tensor '" + *lm_head +
                               "' differs from the token embedding; this model ties its output head to wte");
  }
  for (const auto& [name, _] : files.tensors) {
    if (used.count(name) || (lm_head && name == *lm_head) || is_mask_buffer(name)) continue;
    throw std::runtime_error(files.file_of(name) + ": tensor '" + name + "' is not part of a GPT-2 of this shape (" +
                             std::to_string(cfg.n_layer) + " layers)");
  }
  return out;
}

void load_hf_weights(GPT& model, const fs::path& dir) { load_parameters(model, read_hf_weights(dir, model->config())); }

}  // namespace pipeline::model
