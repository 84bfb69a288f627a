// Interoperability with the tools people already use, tested against the real thing (the Python
// packages tools/setup.sh installs into the torch venv; scripts in tests/interop/):
//   - `pipeline export` -> transformers: logits within 1e-4 in fp32, identical greedy generation,
//     AutoTokenizer's ids equal ours, tokenizer.json equal to transformers' own conversion;
//   - transformers -> `[model] init_from`: a random GPT2LMHeadModel in every layout it or the Hub
//     writes gives our model the same logits; the weights survive a training run at lr 0 and an
//     export bit for bit; export -> init_from -> export is byte-identical;
//   - TensorBoard's EventAccumulator reads back every metric with its tag, step and value, and
//     the stage and queue series;
//   - llm.c shards written by a Python script after llm.c's layout train exactly as our own token
//     shards do, resume exactly, and `pipeline prepare --format llmc` output reads back in Python.
//   - a training run from a transformers checkpoint follows PyTorch's trajectory step by step
//     (tools/parity_train.py: losses, grad norms, learning rates, final weights);
//   - HellaSwag: `pipeline eval --hellaswag` on an exported model predicts, item for item, what
//     transformers predicts with the same rule (tests/interop/hellaswag_reference.py).
// Exits 77 (CTest: skipped) when no Python with transformers, safetensors and tensorboard is
// configured (tools/setup.sh installs them; PIPELINE_INTEROP_PYTHON names the interpreter).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "datasets/sources/dataset_reader.h"
#include "datasets/weights/safetensors.h"
#include "datasets/tokenizer/tokenizer.h"
#include "base/json.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/eval/generate.h"
#include "model/hf/hf_gpt2.h"
#include "runner/tensorboard_log.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;
using namespace train_harness;
using test_util::contains;
using test_util::error_of;
using test_util::read_file;
using test_util::write_file;

namespace {

const std::string kPython = PIPELINE_INTEROP_PYTHON;
const fs::path kScripts = fs::path(PIPELINE_SOURCE_DIR) / "tests" / "interop";

const bool kPythonReady = [] {
  if (kPython.empty() ||
      test_util::shell(kPython + " -c 'import transformers, safetensors, tensorboard, numpy'").code != 0) {
    std::fprintf(stderr, "test_interop: no Python with transformers, safetensors and tensorboard (%s); "
                         "tools/setup.sh installs them. Skipped.\n", kPython.empty() ? "none configured" : kPython.c_str());
    std::exit(77);
  }
  at::set_num_threads(1);  // bitwise reproducible runs, and a fair share of 2 cores
  return true;
}();

void python(const std::string& script, const std::string& args) {
  auto r = test_util::shell(kPython + " " + (kScripts / script).string() + " " + args);
  INFO(script << " " << args << "\n" << r.out);
  REQUIRE(r.code == 0);
}

std::string pipeline_cli(const std::string& args) {
  auto r = test_util::shell(std::string(PIPELINE_EXE) + " " + args);
  INFO("pipeline " << args << "\n" << r.out);
  REQUIRE(r.code == 0);
  return r.out;
}

// A tensor of a safetensors file as a torch tensor (F32 or I64).
torch::Tensor load_tensor(const fs::path& file, const std::string& name) {
  datasets::SafetensorsReader r(file);
  const auto* t = r.header().find(name);
  REQUIRE_MESSAGE(t != nullptr, file.string() << " has no tensor " << name);
  std::vector<int64_t> shape(t->shape.begin(), t->shape.end());
  auto type = t->dtype == datasets::SafetensorsDtype::I64 ? torch::kLong : torch::kFloat;
  auto out = torch::empty(shape, torch::TensorOptions().dtype(type));
  REQUIRE(static_cast<uint64_t>(out.numel() * out.element_size()) == t->bytes());
  r.read(*t, out.data_ptr());
  return out;
}

std::vector<uint16_t> read_stream(const fs::path& dir, const std::string& split) {
  datasets::TokenDatasetReader r;
  r.open(dir, split);
  std::vector<uint16_t> all, buf(1 << 14);
  for (size_t n; (n = r.read(buf)) > 0;) all.insert(all.end(), buf.begin(), buf.begin() + static_cast<long>(n));
  return all;
}

void write_u16(const fs::path& path, const std::vector<uint16_t>& v) {
  write_file(path, std::string_view(reinterpret_cast<const char*>(v.data()), 2 * v.size()));
}

std::vector<uint16_t> read_u16(const fs::path& path) {
  const std::string s = read_file(path);
  std::vector<uint16_t> v(s.size() / 2);
  std::memcpy(v.data(), s.data(), 2 * v.size());
  return v;
}

std::string json_ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// A fixed batch from the validation split: ids (B, T) and a prompt.
struct Batch {
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> prompt;
  torch::Tensor tensor() const {
    std::vector<int64_t> flat;
    for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
    return torch::tensor(flat, torch::kLong).view({static_cast<int64_t>(ids.size()), -1});  // (B, T)
  }
};

Batch fixed_batch(int64_t B, int64_t T) {
  auto val = read_stream(kData + "tokens", "val");
  Batch b;
  for (int64_t i = 0; i < B; ++i) b.ids.emplace_back(val.begin() + i * T + 5, val.begin() + (i + 1) * T + 5);
  b.prompt.assign(val.begin() + 1, val.begin() + 9);
  return b;
}

const std::vector<std::string> kTexts = {"Hello world", "ROMEO:\nBut soft, what light through yonder window breaks?",
                                         "  spaces\tand\ttabs  ", "naïve café — 東京 🙂", "a<|endoftext|>b",
                                         "It's 2024; they'll've 123456789 tokens."};

// Input description for hf_reference.py.
void write_input(const fs::path& path, const Batch& b, const std::string& config_json = "{}") {
  std::string ids = "[";
  for (size_t i = 0; i < b.ids.size(); ++i) ids += (i ? "," : "") + json_ints(b.ids[i]);
  ids += "]";
  std::string texts = "[";
  for (size_t i = 0; i < kTexts.size(); ++i) texts += (i ? "," : "") + json_quote(kTexts[i]);
  texts += "]";
  write_file(path, "{\"ids\":" + ids + ",\"prompt\":" + json_ints(b.prompt) + ",\"new_tokens\":20,\"texts\":" + texts +
                       ",\"config\":" + config_json + "}");
}

// Our logits over the real vocabulary for a batch: (B, T, V).
torch::Tensor our_logits(model::GPT& m, const Batch& b) {
  torch::NoGradGuard no_grad;
  m->eval();
  return m->forward(b.tensor()).narrow(2, 0, m->config().vocab_size);
}

// The tiny run's config with its shape taken from a Hugging Face directory.
std::string init_from_config(const fs::path& run_dir, const fs::path& hf_dir) {
  std::string toml = tiny_config(run_dir, kTokenInput, kData + "tokens");
  const std::string preset = "preset = \"tiny\"\n";
  toml.replace(toml.find(preset), preset.size(), "init_from = \"" + hf_dir.string() + "\"\n");
  return toml;
}

const std::vector<std::string> kNoUpdate = {"training.steps=1", "optimizer.lr=0", "optimizer.min_lr=0",
                                            "checkpoint.every=0"};

// A random GPT2LMHeadModel of `config_json` (GPT2Config's keys), written by transformers'
// save_pretrained into root/hf.
void make_hf_model(const fs::path& root, const std::string& config_json) {
  write_input(root / "in.json", fixed_batch(1, 8), config_json);
  python("hf_reference.py", "make-model --layout save_pretrained --out " + (root / "hf").string() + " --input " +
                                (root / "in.json").string());
}

// Every tensor of `a` is in `b` with the same dtype, shape and bytes.
void check_same_tensors(const fs::path& a, const fs::path& b) {
  datasets::SafetensorsReader ra(a), rb(b);
  CHECK(ra.header().tensors.size() == rb.header().tensors.size());
  for (const auto& t : ra.header().tensors) {
    const auto* u = rb.header().find(t.name);
    REQUIRE_MESSAGE(u != nullptr, b.string() << " lacks " << t.name);
    CHECK(u->dtype == t.dtype);
    CHECK(u->shape == t.shape);
    std::string x(t.bytes(), '\0'), y(u->bytes(), '\0');
    ra.read(t, x.data());
    rb.read(*u, y.data());
    const bool same = x == y;
    CHECK_MESSAGE(same, t.name << " differs");
  }
}

}  // namespace

TEST_CASE("export -> transformers: same logits, same greedy tokens, same tokenizer") {
  auto root = temp_dir("export");
  auto run_result = run(tiny_config(root / "run", kTokenInput, kData + "tokens"), root / "run",
                        {"training.steps=30", "optimizer.lr=1e-2", "optimizer.min_lr=1e-3", "checkpoint.every=0"});
  REQUIRE(run_result.last_step == 30);
  auto out = pipeline_cli("export " + (root / "run").string() + " --out " + (root / "hf").string());
  CHECK(contains(out, "model.safetensors"));
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json", "vocab.json", "merges.txt",
                        "tokenizer.json", "tokenizer_config.json"})
    CHECK_MESSAGE(fs::exists(root / "hf" / f), f);
  const auto vocab = datasets::gpt2_vocab_files();
  const bool vocab_same = read_file(root / "hf" / "vocab.json") == vocab.encoder_json;
  const bool merges_same = read_file(root / "hf" / "merges.txt") == vocab.vocab_bpe;
  CHECK(vocab_same);  // the GPT-2 release files, byte for byte
  CHECK(merges_same);

  const Batch b = fixed_batch(2, 32);
  write_input(root / "in.json", b);
  python("hf_reference.py", "check-export --model " + (root / "hf").string() + " --input " + (root / "in.json").string() +
                                " --out " + (root / "hf_out.safetensors").string());

  auto state = model::read_checkpoint(run_result.checkpoint);
  auto cfg = model::checkpoint_model_config(state.metadata, run_result.checkpoint);
  model::GPT ours(cfg);
  model::restore(state, ours, nullptr, false);
  auto theirs = load_tensor(root / "hf_out.safetensors", "logits");
  auto mine = our_logits(ours, b);
  REQUIRE(theirs.sizes() == mine.sizes());
  const double diff = (theirs - mine).abs().max().item<double>();
  MESSAGE("export -> transformers: max |logit difference| = " << diff << " (logits up to "
                                                              << mine.abs().max().item<double>() << ")");
  CHECK(diff <= 1e-4);

  model::SampleOptions greedy;
  greedy.n_tokens = 20;
  greedy.temperature = 0;
  auto generated = model::sample(ours, b.prompt, greedy);
  auto hf_generated = load_tensor(root / "hf_out.safetensors", "generated");
  CHECK(std::vector<int64_t>(hf_generated.data_ptr<int64_t>(), hf_generated.data_ptr<int64_t>() + hf_generated.numel()) ==
        generated);

  const auto& tok = datasets::Tokenizer::gpt2();
  for (size_t i = 0; i < kTexts.size(); ++i) {
    auto ids = tok.encode(kTexts[i], /*allow_special=*/true);
    auto hf = load_tensor(root / "hf_out.safetensors", "tokens_" + std::to_string(i));
    CHECK_MESSAGE(std::vector<int64_t>(hf.data_ptr<int64_t>(), hf.data_ptr<int64_t>() + hf.numel()) ==
                      std::vector<int64_t>(ids.begin(), ids.end()),
                  kTexts[i]);
  }
  fs::remove_all(root);
}

// The line of `out` that starts with `prefix` (the command's result among its timings).
std::string line_starting(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(prefix)) return line;
  return "";
}

TEST_CASE("HellaSwag: pipeline eval predicts what transformers predicts, item for item") {
  // A context of 96 tokens holds the longest ending of the items (87 tokens, as of the whole
  // split) but not 182 of their 804 rows (97 tokens, the last one a target only, as lm-eval
  // keeps max_length + 1): the cut from the left is exercised as well as the scoring.
  auto root = temp_dir("hellaswag");
  auto trained = run(tiny_config(root / "run", kTokenInput, kData + "tokens"), root / "run",
                     {"model.block_size=96", "training.steps=30", "optimizer.lr=1e-2", "optimizer.min_lr=1e-3",
                      "checkpoint.every=0"});
  REQUIRE(trained.last_step == 30);
  pipeline_cli("export " + (root / "run").string() + " --out " + (root / "hf").string());
  const std::string items = std::string(PIPELINE_SOURCE_DIR) + "/tests/data/hellaswag/val_every50.jsonl";

  // pipeline eval on one thread, as the test process and the reference run.
  auto eval = [&](const fs::path& model, const std::string& args) {
    return line_starting(pipeline_cli("eval " + model.string() + " --threads 1 --hellaswag " + items + " " + args),
                         "hellaswag ");
  };
  const std::string ours = eval(root / "hf", "--predictions " + (root / "ours.txt").string());
  // The run directory (its checkpoint) and its export give the same scores.
  const std::string from_run = eval(root / "run", "--predictions " + (root / "run.txt").string());
  const auto r = test_util::shell(kPython + " " + (kScripts / "hellaswag_reference.py").string() + " --model " +
                                  (root / "hf").string() + " --items " + items + " --predictions " +
                                  (root / "theirs.txt").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  MESSAGE("ours:         " << ours << "\ntransformers: " << line_starting(r.out, "hellaswag ") << " ("
                          << line_starting(r.out, "closest") << ")");
  CHECK(contains(ours, " n 201"));
  CHECK(ours == line_starting(r.out, "hellaswag "));
  CHECK(from_run == ours);
  const std::string predictions = read_file(root / "ours.txt");
  CHECK(std::count(predictions.begin(), predictions.end(), '\n') == 201);
  CHECK(predictions == read_file(root / "theirs.txt"));  // every item's prediction, in file order
  CHECK(read_file(root / "run.txt") == predictions);

  // --items N: the first N items, the same predictions as the whole file's first N.
  const std::string first = eval(root / "hf", "--items 10 --predictions " + (root / "ten.txt").string());
  CHECK(contains(first, " n 10"));
  CHECK(read_file(root / "ten.txt") == predictions.substr(0, 20));
  fs::remove_all(root);
}

TEST_CASE("transformers -> init_from: every layout loads with the same logits") {
  auto root = temp_dir("import");
  const Batch b = fixed_batch(2, 32);
  write_input(root / "in.json", b,
              R"({"n_layer":2,"n_head":4,"n_embd":64,"n_positions":128,"vocab_size":50257})");
  for (const std::string layout : {"save_pretrained", "hub", "sharded", "fp16"}) {
    CAPTURE(layout);
    const fs::path dir = root / layout;
    python("hf_reference.py", "make-model --layout " + layout + " --out " + dir.string() + " --input " +
                                  (root / "in.json").string());
    auto cfg = model::read_hf_config(dir);
    CHECK(cfg.n_layer == 2);
    CHECK(cfg.n_head == 4);
    CHECK(cfg.block_size == 128);
    CHECK(cfg.padded_vocab_size == 50304);
    model::GPT ours(cfg);
    model::load_hf_weights(ours, dir);
    auto theirs = load_tensor(dir / "reference.safetensors", "logits");
    const double diff = (theirs - our_logits(ours, b)).abs().max().item<double>();
    MESSAGE(layout << ": max |logit difference| = " << diff);
    CHECK(diff <= 1e-5);
  }
  CHECK(fs::exists(root / "sharded" / "model.safetensors.index.json"));

  // Through a training run: init_from takes the shape from config.json (the preset is not used);
  // a smaller block_size crops the position table; a shape key that disagrees is an error.
  auto cropped = run(init_from_config(root / "crop", root / "save_pretrained"), root / "crop",
                     {"model.block_size=64", "training.steps=2", "checkpoint.every=0"});
  CHECK(cropped.last_step == 2);
  auto bad = error_of([&] {
    run(init_from_config(root / "bad", root / "hub"), root / "bad", {"model.n_head=2"});
  });
  CHECK(contains(bad, "n_head"));
  CHECK(contains(bad, "2 disagrees with"));
  auto preset_ignored = run(init_from_config(root / "p", root / "hub"), root / "p",
                            {"model.preset=gpt2-medium", "training.steps=1", "checkpoint.every=0"});
  CHECK(preset_ignored.last_step == 1);
  auto missing = error_of([&] { run(init_from_config(root / "m", root / "nowhere"), root / "m"); });
  CHECK(contains(missing, "init_from"));
  CHECK(contains(missing, "no Hugging Face model"));
  fs::remove_all(root);
}

TEST_CASE("the training trajectory is PyTorch's, step by step (tools/parity_train.py)") {
  // small-cpu's shape from a transformers checkpoint; 50 steps of 2 micro-batches, warmup then
  // cosine, clipping at 1 (active: a fresh model's gradient norms are above it), fp32 on the CPU.
  // The batches are recorded with their last target, and PyTorch replays them from the same
  // weights the nanoGPT way: every step's loss, grad norm and learning rate, and the final
  // weights, must agree (parity_train.py's fp32 tolerances: 1e-5, 1e-5, 1e-6 and 1e-4).
  auto root = temp_dir("parity");
  make_hf_model(root, R"({"n_layer":4,"n_head":4,"n_embd":128,"n_positions":128,"vocab_size":50257})");
  std::string toml = init_from_config(root / "run", root / "hf");
  const std::string to_h2d = "[stages.h2d]\ntype = \"h2d\"\ninput = \"pack\"\n";
  REQUIRE(toml.find(to_h2d) != std::string::npos);
  toml.replace(toml.find(to_h2d), to_h2d.size(),
               "[stages.rec]\ntype = \"record_batches\"\ninput = \"pack\"\nlast_target = true\n"
               "[stages.h2d]\ntype = \"h2d\"\ninput = \"rec\"\n");
  auto r = run(toml, root / "run",
               {"training.steps=50", "training.grad_accum=2", "training.batch_size=4", "training.seq_len=64",
                "training.grad_clip=1.0", "optimizer.lr=1e-3", "optimizer.min_lr=1e-4", "optimizer.warmup_steps=10",
                "optimizer.weight_decay=0.1", "checkpoint.every=0", "data.order=\"documents\""});
  REQUIRE(r.last_step == 50);
  CHECK(fs::file_size(root / "run" / "batches.u16") == 2 * (50 * 2 * 4 * 64 + 1));
  auto out = test_util::shell(kPython + " " + (fs::path(PIPELINE_SOURCE_DIR) / "tools" / "parity_train.py").string() +
                              " " + (root / "run").string() + " --pipeline " + PIPELINE_EXE + " --json " +
                              (root / "parity.json").string());
  MESSAGE(out.out);
  CHECK(out.code == 0);
  const JsonValue verdict = json_parse(read_file(root / "parity.json"));
  CHECK(verdict.flag("ok"));
  CHECK(verdict.array("steps").size() == 50);
  CHECK(verdict.number("clipped_steps") >= 1);  // the clipping is exercised
  if (verdict.flag("ok")) fs::remove_all(root);
}

TEST_CASE("every preset from gpt2 to gpt2-xl: transformers builds the tensors we write and read") {
  // Shapes only (transformers builds each model on the meta device): gpt2-xl's 6 GB of weights
  // are not needed to check that our config.json describes the model whose tensors we write.
  auto root = temp_dir("presets");
  const std::vector<std::string> presets = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
  std::string dirs;
  for (const auto& p : presets) {
    fs::create_directories(root / p);
    write_file(root / p / "config.json", model::hf_config_json(model::GPTConfig::preset(p)));
    dirs += " " + (root / p).string();
  }
  python("hf_reference.py", "shapes --out " + (root / "shapes.json").string() + dirs);
  const JsonValue all = json_parse(read_file(root / "shapes.json"));
  for (const auto& p : presets) {
    CAPTURE(p);
    const auto want = model::GPTConfig::preset(p);
    const auto cfg = model::read_hf_config(root / p);  // what init_from takes the shape from
    CHECK(cfg.n_layer == want.n_layer);
    CHECK(cfg.n_head == want.n_head);
    CHECK(cfg.n_embd == want.n_embd);
    CHECK(cfg.block_size == want.block_size);
    CHECK(cfg.padded_vocab_size == want.padded_vocab_size);
    const JsonValue* theirs = all.find((root / p).string());
    REQUIRE(theirs != nullptr);
    CHECK(theirs->flag("tied"));  // lm_head is wte, so the file carries no lm_head
    const JsonValue& tensors = *theirs->find("tensors");
    const auto ours = model::hf_tensor_shapes(cfg);
    REQUIRE(tensors.members.size() == ours.size() + 1);  // + lm_head.weight
    CHECK(tensors.members.back().first == "lm_head.weight");
    for (size_t i = 0; i < ours.size(); ++i) {
      const auto& [name, shape] = tensors.members[i];
      CHECK(name == ours[i].first);
      std::vector<int64_t> dims;
      for (const auto& d : shape.items) dims.push_back(std::stoll(d.text));
      CHECK_MESSAGE(dims == ours[i].second, name);
    }
  }
  fs::remove_all(root);
}

TEST_CASE("weights survive init_from -> training at lr 0 -> export bit for bit") {
  auto root = temp_dir("roundtrip");
  make_hf_model(root, R"({"n_layer":2,"n_head":2,"n_embd":64,"n_positions":64,"vocab_size":50257})");

  // transformers' file -> our run -> our export: the same tensors, byte for byte.
  auto first = run(init_from_config(root / "run1", root / "hf"), root / "run1", kNoUpdate);
  REQUIRE(first.last_step == 1);
  pipeline_cli("export " + first.checkpoint + " --out " + (root / "e1").string());
  check_same_tensors(root / "hf" / "model.safetensors", root / "e1" / "model.safetensors");

  // Our export -> init_from -> export: identical files.
  auto second = run(init_from_config(root / "run2", root / "e1"), root / "run2", kNoUpdate);
  pipeline_cli("export " + second.checkpoint + " --out " + (root / "e2").string());
  const bool weights_same = read_file(root / "e1" / "model.safetensors") == read_file(root / "e2" / "model.safetensors");
  CHECK(weights_same);
  CHECK(read_file(root / "e1" / "config.json") == read_file(root / "e2" / "config.json"));
  fs::remove_all(root);
}

TEST_CASE("TensorBoard reads back the run's scalars: tags, steps and values") {
  auto root = temp_dir("tensorboard");
  const std::string input = kTokenInput + "[stages.eval]\ntype = \"eval\"\ninput = \"train\"\ncapacity = 4\n";
  // HellaSwag on 8 items every 2 steps: evaluation lines with and without a validation loss.
  auto r = run(tiny_config(root / "run", input, kData + "tokens"), root / "run",
               {"logging.tensorboard=true", "eval.every=4", "eval.batches=1", "eval.sample_tokens=0",
                "logging.peak_tflops=0.001",  // the CPU has no peak of its own: MFU only when it is set
                "eval.hellaswag=\"" + std::string(PIPELINE_SOURCE_DIR) + "/tests/data/hellaswag/val_every50.jsonl\"",
                "eval.hellaswag_every=2", "eval.hellaswag_items=8"});
  REQUIRE(r.last_step == 8);
  python("tensorboard_scalars.py", "--logdir " + (root / "run").string() + " --out " + (root / "tb.json").string());
  const JsonValue tb = json_parse(read_file(root / "tb.json"));

  // tag -> step -> value, as TensorBoard returned them.
  std::map<std::string, std::map<int64_t, float>> series;
  for (const auto& [tag, points] : tb.members)
    for (const auto& p : points.items) series[tag][std::stoll(p.items[0].text)] = std::stof(p.items[1].text);

  // Every number of every metrics.jsonl line is there, at its step, with its value (as float32).
  std::istringstream lines(read_file(root / "run" / "metrics.jsonl"));
  int checked = 0;
  for (std::string line; std::getline(lines, line);) {
    int64_t step = 0;
    std::vector<std::pair<std::string, double>> scalars;
    REQUIRE(stages::metric_scalars(line, step, scalars));
    for (const auto& [tag, value] : scalars) {
      CAPTURE(tag);
      CAPTURE(step);
      REQUIRE(series[tag].count(step) == 1);
      CHECK(series[tag][step] == static_cast<float>(value));
      ++checked;
    }
  }
  CHECK(checked > 40);
  for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu"})
    CHECK_MESSAGE(series[tag].size() == 8, tag);
  CHECK(series["val/loss"].size() == 2);
  CHECK(series["val/loss"].count(4) == 1);
  CHECK(series["val/loss"].count(8) == 1);
  for (const char* tag : {"hellaswag/acc_norm", "hellaswag/acc", "hellaswag/items"}) {
    CAPTURE(tag);
    CHECK(series[tag].size() == 4);  // steps 2, 4, 6 and 8
    for (int64_t step : {2, 4, 6, 8}) CHECK(series[tag].count(step) == 1);
  }
  CHECK(series["hellaswag/items"][8] == 8.0f);
  CHECK(series["hellaswag/acc_norm"][8] >= 0.0f);
  CHECK(series["hellaswag/acc_norm"][8] <= 1.0f);
  CHECK(series.count("train/hellaswag_acc_norm") == 0);  // a line without val_loss is still an evaluation's

  // The pipeline's own series: every stage's busy share and every queue's occupancy, as shares.
  for (const char* stage : {"read", "pack", "h2d", "train", "log", "eval", "checkpoint"}) {
    const auto& busy = series[std::string("stage_busy/") + stage];
    CHECK_MESSAGE(!busy.empty(), stage);
    for (const auto& [step, v] : busy) {
      CHECK(step >= 1);
      CHECK(step <= 8);
      CHECK(v >= 0.0f);
      CHECK(v <= 1.0f);
    }
  }
  for (const char* queue : {"pack", "train", "log"})
    for (const auto& [step, v] : series[std::string("queue_occupancy/") + queue]) {
      CHECK(v >= 0.0f);
      CHECK(v <= 1.0f);
    }
  CHECK(!series["queue_occupancy/train"].empty());
  fs::remove_all(root);
}

TEST_CASE("llm.c shards from a Python writer train and resume exactly like our token shards") {
  auto root = temp_dir("llmc");
  for (const char* split : {"train", "val"}) {
    write_u16(root / (std::string(split) + ".u16"), read_stream(kData + "tokens", split));
    python("llmc_shards.py", std::string("write --tokens ") + (root / (std::string(split) + ".u16")).string() +
                                 " --out " + (root / "llmc").string() + " --prefix tinyshakespeare --split " + split +
                                 " --shards " + (split == std::string("train") ? "3" : "1"));
  }
  CHECK(fs::exists(root / "llmc" / "tinyshakespeare_train_000002.bin"));
  CHECK(read_stream(root / "llmc", "train") == read_stream(kData + "tokens", "train"));

  // The same token stream, so the same batches and losses in the documents order (the lanes
  // order deals units, which differ between the two formats); eval reads the val shard.
  const std::string input = kTokenInput + "[stages.eval]\ntype = \"eval\"\ninput = \"train\"\ncapacity = 4\n";
  const std::vector<std::string> eval = {"eval.every=4", "eval.batches=2", "eval.sample_tokens=0",
                                         "data.order=\"documents\""};
  auto ours = run(tiny_config(root / "ours", input, kData + "tokens"), root / "ours", eval);
  auto theirs = run(tiny_config(root / "theirs", input, (root / "llmc").string()), root / "theirs", eval);
  REQUIRE(ours.losses.size() == 8);
  CHECK(theirs.losses == ours.losses);
  CHECK(contains(read_file(root / "theirs" / "metrics.jsonl"), "val_loss"));
  fs::create_directories(root / "resume");
  CHECK(error_of([&] { check_exact_resume(root / "resume", kTokenInput, (root / "llmc").string()); }) == "");

  // read_shards cannot read token shards: the error says what the directory holds.
  auto text = error_of([&] { run(tiny_config(root / "t", kTextInput, (root / "llmc").string()), root / "t"); });
  CHECK(contains(text, "tokens"));
  fs::remove_all(root);
}

TEST_CASE("prepare --format llmc writes shards that llm.c's loader reads") {
  auto root = temp_dir("prepare");
  const fs::path text = fs::path(PIPELINE_REFERENCE_DATA_DIR) / "tinyshakespeare.txt";
  if (!fs::exists(text)) {
    MESSAGE("skipped: no " << text.string());
    return;
  }
  // The bundled token dataset was made with these options (datasets/data/tinyshakespeare/README.md).
  pipeline_cli("prepare " + text.string() + " --out " + (root / "shakespeare").string() +
               " --format llmc --split blank-lines --val-fraction 0.1 --seed 1337 --quiet");
  for (const char* split : {"train", "val"}) {
    python("llmc_shards.py", std::string("read --dir ") + (root / "shakespeare").string() + " --split " + split +
                                 " --out " + (root / "back.u16").string());
    CHECK(read_u16(root / "back.u16") == read_stream(kData + "tokens", split));
  }
  fs::remove_all(root);
}
