// `pipeline eval MODEL --hellaswag FILE | --val DATASET`: the scores people compare, for any
// checkpoint, run directory or Hugging Face directory: HellaSwag accuracy (model/eval/hellaswag.h)
// and the validation loss over a whole split. Argument parsing and reporting only.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>

#include "base/atomic_file.h"
#include "cli.h"
#include "datasets/eval/hellaswag.h"
#include "datasets/sources/split_tokens.h"
#include "model/net/autocast.h"
#include "model/eval/hellaswag.h"
#include "model/eval/inference_model.h"
#include "runner/run_setup.h"

namespace pipeline::cli {
namespace {

namespace fs = std::filesystem;

struct EvalArgs {
  fs::path model, hellaswag, predictions, val;
  int64_t items = 0;
  std::string split = "val";
  int64_t seq_len = 0, batch_size = 8;
  std::string dtype = "fp32", device = "auto";
  int64_t threads = 0;  // torch intra-op threads on the CPU (0: torch's default)
};

EvalArgs parse(const std::vector<std::string>& args) {
  EvalArgs e;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& { return option_value(args, i, "eval"); };
    if (a == "--hellaswag") {
      e.hellaswag = value();
    } else if (a == "--items") {
      e.items = parse_int(a, value(), 0, int64_t{1} << 40);
    } else if (a == "--predictions") {
      e.predictions = value();
    } else if (a == "--val") {
      e.val = value();
    } else if (a == "--split") {
      e.split = value();
    } else if (a == "--seq-len") {
      e.seq_len = parse_int(a, value(), 1, 1 << 20);
    } else if (a == "--batch-size") {
      e.batch_size = parse_int(a, value(), 1, 1 << 20);
    } else if (a == "--threads") {
      e.threads = parse_int(a, value(), 1, 1024);
    } else if (a == "--dtype") {
      e.dtype = value();
      if (e.dtype != "fp32" && e.dtype != "bf16") throw std::invalid_argument("--dtype: expected fp32 or bf16, got '" + e.dtype + "'");
    } else if (a == "--device") {
      e.device = value();
      if (e.device != "auto" && e.device != "cpu" && e.device != "cuda")
        throw std::invalid_argument("--device: expected auto, cpu or cuda, got '" + e.device + "'");
    } else if (!a.starts_with("-")) {
      if (!e.model.empty()) throw std::invalid_argument("one MODEL expected, got a second: " + a);
      e.model = a;
    } else {
      throw std::invalid_argument("unknown option " + a + " (see pipeline eval --help)");
    }
  }
  if (e.model.empty()) throw std::invalid_argument("no MODEL given (see pipeline eval --help)");
  if (e.hellaswag.empty() && e.val.empty())
    throw std::invalid_argument("nothing to evaluate: give --hellaswag FILE and/or --val DATASET (see pipeline eval --help)");
  if (e.hellaswag.empty() && (e.items || !e.predictions.empty()))
    throw std::invalid_argument("--items and --predictions need --hellaswag FILE");
  return e;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The mean loss over every whole window of T+1 tokens of the split, windows cut as pack cuts them
// (each starts where the last one's inputs ended), B rows at a time. Returns {loss, tokens}.
std::pair<double, int64_t> validation_loss(model::GPT& gpt, const EvalArgs& e, int64_t T, torch::Device device) {
  datasets::SplitTokens split;
  split.open(e.val, e.split);
  const int64_t B = e.batch_size;
  std::vector<uint16_t> buf(static_cast<size_t>(B * T + 1));
  size_t have = 0;  // tokens in buf: a carried first token, then what was read
  double sum = 0;
  int64_t tokens = 0;
  for (;;) {
    have += split.read(std::span<uint16_t>(buf).subspan(have));
    const int64_t rows = (static_cast<int64_t>(have) - 1) / T;
    if (rows < 1) break;
    std::vector<int64_t> ids(buf.begin(), buf.begin() + rows * T + 1);
    auto window = torch::tensor(ids, torch::kLong).to(device);  // (rows*T+1)
    auto x = window.narrow(0, 0, rows * T).view({rows, T});     // (rows, T)
    auto y = window.narrow(0, 1, rows * T).view({rows, T});     // (rows, T)
    sum += gpt->loss(gpt->forward(x), y).item<double>() * static_cast<double>(rows * T);
    tokens += rows * T;
    // The last target is the next window's first input.
    const auto used = static_cast<size_t>(rows * T);
    std::copy(buf.begin() + static_cast<std::ptrdiff_t>(used), buf.begin() + static_cast<std::ptrdiff_t>(have), buf.begin());
    have -= used;
    if (rows < B) break;  // the split ended
  }
  if (tokens == 0)
    throw std::runtime_error(e.val.string() + ": the '" + e.split + "' split has fewer than " + std::to_string(T + 1) +
                             " tokens, not one window of --seq-len " + std::to_string(T));
  return {sum / static_cast<double>(tokens), tokens};
}

int eval_main(const std::vector<std::string>& args) {
  const EvalArgs e = parse(args);
  // Read (and check) the items before the model: a bad file fails at once. So does a predictions
  // path that cannot be written: its file is opened now (a temporary beside it, renamed over it
  // once every item is scored), not after the whole evaluation.
  datasets::HellaSwagSet items;
  if (!e.hellaswag.empty()) items = datasets::load_hellaswag(e.hellaswag, e.items);
  std::optional<AtomicFile> predictions;
  if (!e.predictions.empty()) {
    if (fs::is_directory(e.predictions))
      throw std::invalid_argument("--predictions " + e.predictions.string() + ": a directory; give the file to write");
    try {
      predictions.emplace(e.predictions);
    } catch (const FileWriteError& err) {
      throw std::runtime_error(std::string("--predictions: ") + err.what());
    }
  }

  if (e.threads > 0) at::set_num_threads(static_cast<int>(e.threads));
  const torch::Device device = e.device == "cuda" || (e.device == "auto" && torch::cuda::is_available())
                                   ? torch::Device(torch::kCUDA, 0)
                                   : torch::Device(torch::kCPU);
  if (device.is_cuda() && !torch::cuda::is_available()) throw std::runtime_error("--device cuda: no CUDA device here");
  const auto t0 = std::chrono::steady_clock::now();
  fs::path path = e.model;
  if (!model::is_hf_model_dir(path)) path = stages::checkpoint_file(path);  // a run directory: its newest
  model::InferenceModel m = model::load_inference_model(path);
  m.model->to(device);
  const auto& cfg = m.model->config();
  std::fprintf(stderr, "eval: %s (%s%lld parameters) on %s, %s; loaded in %.2f s\n", m.source.c_str(),
               m.step >= 0 ? ("step " + std::to_string(m.step) + ", ").c_str() : "Hugging Face, ",
               static_cast<long long>(cfg.num_parameters()), device.str().c_str(), e.dtype.c_str(), seconds_since(t0));

  torch::NoGradGuard no_grad;
  model::AutocastGuard autocast(device.type(), e.dtype == "bf16");
  if (!items.items.empty()) {
    const auto t1 = std::chrono::steady_clock::now();
    const model::HellaSwagResult r = model::score_hellaswag(m.model, items);
    std::printf("hellaswag acc_norm %.4f acc %.4f n %lld\n", r.acc_norm(), r.acc(), static_cast<long long>(r.n));
    std::fflush(stdout);
    std::fprintf(stderr, "eval: %lld HellaSwag items of %s in %.2f s\n", static_cast<long long>(r.n),
                 e.hellaswag.c_str(), seconds_since(t1));
    if (predictions) {
      std::string text;
      for (int8_t p : r.predictions) text += std::to_string(p) + "\n";
      predictions->write(text);
      predictions->commit();
    }
  }
  if (!e.val.empty()) {
    const int64_t T = e.seq_len ? e.seq_len : cfg.block_size;
    if (T > cfg.block_size)
      throw std::invalid_argument("--seq-len " + std::to_string(T) + ": longer than the model's context (" +
                                  std::to_string(cfg.block_size) + ")");
    const auto t1 = std::chrono::steady_clock::now();
    const auto [loss, tokens] = validation_loss(m.model, e, T, device);
    std::printf("val loss %.4f tokens %lld\n", loss, static_cast<long long>(tokens));
    std::fflush(stdout);
    std::fprintf(stderr, "eval: the '%s' split of %s, %lld tokens in windows of %lld, in %.2f s\n", e.split.c_str(),
                 e.val.c_str(), static_cast<long long>(tokens), static_cast<long long>(T), seconds_since(t1));
  }
  return 0;
}

// Described (summary, usage) in tools/torch_commands.cpp.
PIPELINE_COMMAND_IMPL(eval, &eval_main);

}  // namespace
}  // namespace pipeline::cli
