// `pipeline generate`: loads a checkpoint (or a Hugging Face directory) and prints a continuation of a prompt.
#include <cmath>
#include <iostream>

#include "cli.h"
#include "datasets/tokenizer/tokenizer.h"
#include "model/eval/generate.h"
#include "model/eval/inference_model.h"
#include "runner/run_setup.h"

namespace pipeline::cli {
namespace {

int generate_main(const std::vector<std::string>& args) {
  std::string ckpt, prompt = "\n";
  model::SampleOptions so;
  so.n_tokens = 200;
  so.temperature = 0.8;
  so.top_k = 40;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> const std::string& { return option_value(args, i, "generate"); };
    // A finite number >= 0; `whole`: an integer.
    auto number = [&](const std::string& flag, bool whole) {
      const auto& v = value();
      double d = 0;
      try {
        size_t used = 0;
        d = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        throw std::invalid_argument(flag + ": expected a number, got '" + v + "'");
      }
      if (!std::isfinite(d) || d < 0 || (whole && (d != std::floor(d) || d > 9e15)))
        throw std::invalid_argument(flag + ": expected " + (whole ? "a whole number" : "a number") + " >= 0, got '" + v +
                                    "'");
      return d;
    };
    const auto& a = args[i];
    if (a == "--checkpoint" || !a.starts_with("-")) {  // (bare: as `pipeline export` takes it)
      const std::string path = a == "--checkpoint" ? value() : a;
      if (!ckpt.empty()) throw std::invalid_argument("one checkpoint expected, got a second: " + path);
      ckpt = path;
    } else if (a == "--prompt") {
      prompt = value();
    } else if (a == "--tokens") {
      so.n_tokens = static_cast<int64_t>(number(a, true));
    } else if (a == "--temperature") {
      so.temperature = number(a, false);
    } else if (a == "--top-k") {
      so.top_k = static_cast<int64_t>(number(a, true));
    } else if (a == "--seed") {
      so.seed = static_cast<uint64_t>(number(a, true));
    } else {
      throw std::invalid_argument("unknown argument " + a + " (see pipeline generate --help)");
    }
  }
  if (ckpt.empty()) throw std::invalid_argument("--checkpoint PATH is required (a .ckpt file or a run directory)");
  // A Hugging Face directory as it is, a run directory's newest checkpoint, or a .ckpt file.
  if (!model::is_hf_model_dir(ckpt)) ckpt = stages::checkpoint_file(ckpt).string();
  model::GPT gpt = model::load_inference_model(ckpt).model;
  if (torch::cuda::is_available()) gpt->to(torch::Device(torch::kCUDA, 0));
  const auto& tok = datasets::Tokenizer::gpt2();
  auto ids = tok.encode_ordinary(prompt);
  std::vector<int64_t> p(ids.begin(), ids.end());
  if (p.empty()) p.push_back(datasets::Tokenizer::eot_id);
  auto out = model::sample(gpt, p, so);
  std::vector<uint32_t> gen;
  for (size_t i = p.size(); i < out.size(); ++i) gen.push_back(static_cast<uint32_t>(out[i]));
  std::cout << prompt << tok.decode(gen) << "\n";
  return 0;
}

// Described (summary, usage) in tools/torch_commands.cpp.
PIPELINE_COMMAND_IMPL(generate, &generate_main);

}  // namespace
}  // namespace pipeline::cli
