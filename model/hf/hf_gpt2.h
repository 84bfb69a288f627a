// GPT-2 in Hugging Face transformers' layout (GPT2LMHeadModel): what `pipeline export` writes
// and `[model] init_from` reads.
//
// The mapping between our parameters and theirs:
//   ours (model/net/gpt2.h)             theirs (model.safetensors)            layout
//   wte.weight (Vp, C)              transformer.wte.weight (V, C)          rows >= V are our padding
//   wpe.weight (T, C)               transformer.wpe.weight (n_positions, C)
//   h.i.attn.c_attn.weight (3C, C)  transformer.h.i.attn.c_attn.weight (C, 3C)   Conv1D: transposed
//   h.i.attn.c_proj.weight (C, C)   ... .attn.c_proj.weight (C, C)              transposed
//   h.i.mlp.c_fc.weight (4C, C)     ... .mlp.c_fc.weight (C, 4C)                transposed
//   h.i.mlp.c_proj.weight (C, 4C)   ... .mlp.c_proj.weight (4C, C)              transposed
//   biases, ln_1, ln_2, ln_f        same names, same shapes
//   (tied to wte)                   lm_head.weight: absent (tied), or equal to wte
// q, k, v are split from c_attn's output in that order on both sides, and both use GELU with the
// tanh approximation ("gelu_new") and LayerNorm eps 1e-5, so the two compute the same function.
//
// Reading accepts what transformers and the Hub write: keys with the `transformer.` prefix
// (save_pretrained) or without it (the Hub's openai-community/gpt2), the attention-mask buffers
// `attn.bias` / `attn.masked_bias` present or absent, F32/F16/BF16/F64 tensors, one
// model.safetensors or shards listed in model.safetensors.index.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/net/gpt2.h"
#include "model/hf/hf_config.h"
#include "model/net/optim.h"

namespace pipeline::model {

/// Storage dtype of exported weights.
enum class HfDtype { f32, f16, bf16 };
/// "fp32" | "fp16" | "bf16" (also "float32", "float16", "bfloat16"); throws std::invalid_argument.
HfDtype parse_hf_dtype(const std::string& name);

/// The tensors `write_hf_model` writes for a model of shape `cfg`, in GPT2LMHeadModel's state_dict
/// order: full names (`transformer.` prefix) and shapes in their layout (Conv1D weights (in, out),
/// wte (vocab_size, C), wpe (n_positions, C)). lm_head.weight is not among them: it is tied to wte.
std::vector<std::pair<std::string, std::vector<int64_t>>> hf_tensor_shapes(const GPTConfig& cfg);

/// config.json for a model of this shape (vocab_size = cfg.vocab_size, n_positions = block_size).
std::string hf_config_json(const GPTConfig& cfg, HfDtype dtype = HfDtype::f32);
/// generation_config.json: bos/eos <|endoftext|>.
std::string hf_generation_config_json();

/// Writes DIR/model.safetensors (save_pretrained's key names, `transformer.` prefix, no lm_head:
/// tied), config.json and generation_config.json, each atomically. `params` are ours (names as in
/// model/net/gpt2.h, any device). A model trained without biases is written with zero biases (the
/// same function). Returns the size of model.safetensors in bytes.
uint64_t write_hf_model(const std::filesystem::path& dir, const GPTConfig& cfg, const NamedTensors& params,
                        HfDtype dtype = HfDtype::f32);

/// Writes the GPT-2 tokenizer files (datasets/tokenizer/hf_tokenizer.h) into DIR, each atomically:
/// vocab.json, merges.txt, tokenizer.json, tokenizer_config.json.
void write_hf_tokenizer(const std::filesystem::path& dir, int64_t model_max_length);

/// The weights in DIR as our parameters (fp32, CPU) for a model of shape `cfg`, which must match
/// config.json in layers, heads and width; wte is zero-padded to cfg.padded_vocab_size and wpe
/// cropped to cfg.block_size (fine-tuning at a shorter context). Throws std::runtime_error naming
/// the file and tensor: missing or unexpected tensors, wrong shapes or dtypes, an untied lm_head.
NamedTensors read_hf_weights(const std::filesystem::path& dir, const GPTConfig& cfg);

/// read_hf_weights + load_parameters into `model` (any device).
void load_hf_weights(GPT& model, const std::filesystem::path& dir);

}  // namespace pipeline::model
