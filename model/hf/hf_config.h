// A Hugging Face GPT-2 directory read without LibTorch: its config.json into our model shape
// (what `[model] init_from` takes the shape from), and the safetensors files that hold its
// weights, opened with their headers checked. `pipeline check` reads both for init_from; loading
// the weights into a model is model/hf/hf_gpt2.h's.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "datasets/weights/safetensors.h"
#include "model/net/gpt_config.h"

namespace pipeline::model {

/// Every tensor of DIR's safetensors file(s) by name, with the open file that holds it: one
/// model.safetensors, or the shards model.safetensors.index.json lists. Throws std::runtime_error
/// naming the file when there is neither (with a hint for pytorch_model.bin), the index is
/// malformed, a header is (DatasetError), or a tensor is in two shards.
struct HfWeightFiles {
  explicit HfWeightFiles(const std::filesystem::path& dir);
  std::vector<std::unique_ptr<datasets::SafetensorsReader>> readers;
  std::map<std::string, std::pair<const datasets::SafetensorsReader*, const datasets::SafetensorsTensor*>> tensors;
  std::string file_of(const std::string& name) const { return tensors.at(name).first->path().string(); }
};

/// The model shape in DIR/config.json. Throws std::runtime_error naming the file and the key when
/// it is not a GPT-2 this model computes exactly (model_type, activation, LayerNorm epsilon,
/// untied head, inner width, attention scaling).
GPTConfig read_hf_config(const std::filesystem::path& dir);

}  // namespace pipeline::model
