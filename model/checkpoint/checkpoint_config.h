// The model shape recorded in a training checkpoint's metadata (the "model" object that the
// train stage writes with GPTConfig::to_json), read back by `pipeline generate` and `pipeline
// export`, which rebuild the model a checkpoint holds without the run's config, and by a resumed
// run (and `pipeline check --resume`), which must continue the same model. No torch.
#pragma once

#include <string>

#include "model/net/gpt_config.h"

namespace pipeline::model {

/// Parses the checkpoint metadata JSON and returns its model shape (dropout 0: for inference and
/// export). Throws std::runtime_error naming `source` (the checkpoint) and the missing key.
GPTConfig checkpoint_model_config(const std::string& metadata, const std::string& source);

}  // namespace pipeline::model
