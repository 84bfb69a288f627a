// `pipeline export CHECKPOINT --out DIR`: a trained model as a Hugging Face GPT-2 directory that
// transformers loads as it is (model/hf/hf_gpt2.h: weights and config; datasets/tokenizer/hf_tokenizer.h:
// tokenizer). Argument parsing and reporting only.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "cli.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/hf/hf_gpt2.h"
#include "runner/run_setup.h"

namespace pipeline::cli {
namespace {

namespace fs = std::filesystem;

int export_main(const std::vector<std::string>& args) {
  fs::path ckpt, out;
  model::HfDtype dtype = model::HfDtype::f32;
  bool tokenizer = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& { return option_value(args, i, "export"); };
    if (a == "--out") {
      out = value();
    } else if (a == "--checkpoint" || !a.starts_with("-")) {  // (--checkpoint: as `pipeline generate` takes it)
      const std::string path = a == "--checkpoint" ? value() : a;
      if (!ckpt.empty()) throw std::invalid_argument("one CHECKPOINT expected, got a second: " + path);
      ckpt = path;
    } else if (a == "--dtype") {
      dtype = model::parse_hf_dtype(value());
    } else if (a == "--no-tokenizer") {
      tokenizer = false;
    } else {
      throw std::invalid_argument("unknown option " + a + " (see pipeline export --help)");
    }
  }
  if (ckpt.empty()) throw std::invalid_argument("no CHECKPOINT given (see pipeline export --help)");
  if (out.empty()) throw std::invalid_argument("--out DIR is required (see pipeline export --help)");
  if (fs::exists(out) && !fs::is_directory(out)) throw std::invalid_argument(out.string() + ": exists and is not a directory");

  const auto t0 = std::chrono::steady_clock::now();
  const fs::path file = stages::checkpoint_file(ckpt);
  auto state = model::read_checkpoint(file.string());
  const model::GPTConfig cfg = model::checkpoint_model_config(state.metadata, file.string());
  const auto t1 = std::chrono::steady_clock::now();
  const uint64_t bytes = model::write_hf_model(out, cfg, state.model, dtype);
  if (tokenizer) model::write_hf_tokenizer(out, cfg.block_size);
  const auto t2 = std::chrono::steady_clock::now();
  std::fprintf(stderr,
               "export: %s (step %lld, %lld parameters) -> %s\n"
               "  model.safetensors %.1f MB; read %.2f s, written %.2f s\n",
               file.c_str(), static_cast<long long>(state.step), static_cast<long long>(cfg.num_parameters()),
               out.c_str(), static_cast<double>(bytes) / 1e6, std::chrono::duration<double>(t1 - t0).count(),
               std::chrono::duration<double>(t2 - t1).count());
  return 0;
}

// Described (summary, usage) in tools/torch_commands.cpp.
PIPELINE_COMMAND_IMPL(export, &export_main);

}  // namespace
}  // namespace pipeline::cli
