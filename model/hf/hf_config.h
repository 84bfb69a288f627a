// A Hugging Face GPT-2 config.json read into our model shape: what `[model] init_from` takes the
// shape from. Torch-free (`pipeline check` resolves init_from without loading LibTorch); the
// weights are model/hf/hf_gpt2.h's.
#pragma once

#include <filesystem>

#include "model/net/gpt_config.h"

namespace pipeline::model {

/// The model shape in DIR/config.json. Throws std::runtime_error naming the file and the key when
/// it is not a GPT-2 this model computes exactly (model_type, activation, LayerNorm epsilon,
/// untied head, inner width, attention scaling).
GPTConfig read_hf_config(const std::filesystem::path& dir);

}  // namespace pipeline::model
