// Loading a model for inference (see inference_model.h).
#include "model/eval/inference_model.h"

#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/hf/hf_config.h"
#include "model/hf/hf_gpt2.h"

namespace pipeline::model {

bool is_hf_model_dir(const std::filesystem::path& dir) {
  return std::filesystem::is_directory(dir) && std::filesystem::exists(dir / "config.json");
}

InferenceModel load_inference_model(const std::filesystem::path& path) {
  InferenceModel m;
  m.source = path.string();
  if (is_hf_model_dir(path)) {
    m.model = GPT(read_hf_config(path));
    load_hf_weights(m.model, path);
  } else {
    auto state = read_checkpoint(path.string());
    m.model = GPT(checkpoint_model_config(state.metadata, path.string()));
    restore(state, m.model, nullptr, /*restore_rng=*/false);
    m.step = state.step;
  }
  m.model->eval();
  return m;
}

}  // namespace pipeline::model
