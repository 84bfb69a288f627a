// The model a file on disk holds, loaded for inference (dropout off, eval mode): a training
// checkpoint (.ckpt), or a Hugging Face GPT-2 directory (config.json + model.safetensors, as
// `pipeline export`, transformers' save_pretrained or the Hub write them). For the commands that
// read a model without training it: `pipeline generate` and `pipeline eval`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "model/net/gpt2.h"

namespace pipeline::model {

struct InferenceModel {
  GPT model{nullptr};   // on the CPU
  int64_t step = -1;    // the checkpoint's training step (-1: a Hugging Face directory)
  std::string source;   // what was read: the .ckpt file or the directory
};

/// A directory with config.json is read as a Hugging Face model, anything else as a checkpoint
/// file. Throws naming the path and what is wrong with it.
InferenceModel load_inference_model(const std::filesystem::path& path);

/// Whether `dir` holds a Hugging Face model (a directory with config.json).
bool is_hf_model_dir(const std::filesystem::path& dir);

}  // namespace pipeline::model
