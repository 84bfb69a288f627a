// model/ on the CPU: config and parameter counts, the forward pass's properties, AdamW,
// clipping, the LR schedule, checkpoints, sampling, and parity with PyTorch
// (tests/data/gpt2_tiny_reference.bin, written by tools/gpt2_reference.py).
#include "model/net/autocast.h"
#include "model/checkpoint/checkpoint.h"
#include "model/device/device_event.h"
#include "model/eval/generate.h"
#include "model/net/gpt2.h"
#include "model/net/optim.h"
#include "model/device/reuse_pool.h"
#include "model/net/schedule.h"
#include "model/net/sdpa_choice.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <unistd.h>

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace m = pipeline::model;
namespace fs = std::filesystem;

namespace {

using test_util::contains;
using test_util::error_of;

// One intra-op thread: the models here are tiny, so OpenMP barriers cost more than they save,
// all the more on a shared 2-core machine.
void use_one_thread() { at::set_num_threads(1); }

// max|a - b| / max|b|: relative to the tensor's scale, so near-zero elements do not blow it up.
double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  auto af = a.to(torch::kDouble), bf = b.to(torch::kDouble);
  const double denom = bf.abs().max().item<double>();
  return (af - bf).abs().max().item<double>() / (denom > 0 ? denom : 1.0);
}

m::GPTConfig tiny(int64_t vocab = 50257) { return m::GPTConfig::preset("tiny").with_vocab(vocab); }

// The names of every node of t's autograd graph, one string ("AddBackward0 CppNode<...> ...").
std::string graph_node_names(const torch::Tensor& t) {
  std::string names;
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    auto* n = todo.back();
    todo.pop_back();
    if (!n || !seen.insert(n).second) continue;
    names += n->name() + " ";
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return names;
}

fs::path temp_dir() {
  auto dir = fs::temp_directory_path() / ("pipeline_test_model_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// Not fs::remove_all: the torch wheel's libtorch.so exports an older std::filesystem that the
// dynamic linker may pick, and its remove_all crashes; plain unlink/rmdir are safe.
void remove_tree(const fs::path& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path().string());
  for (const auto& f : files) ::unlink(f.c_str());
  ::rmdir(dir.c_str());
}

// One training step in fp32 on (x, y); returns the loss before the step.
float train_step(m::GPT& model, m::AdamW& opt, const torch::Tensor& x, const torch::Tensor& y,
                 double clip = 1.0) {
  opt.zero_grad();
  auto loss = model->loss(model(x), y);
  loss.backward();
  m::clip_grad_norm(model->parameters(), clip);
  opt.step();
  return loss.item<float>();
}

// ---- tools/gpt2_reference.py's file --------------------------------------------------------

struct Reference {
  std::map<std::string, torch::Tensor> t;
  const torch::Tensor& at(const std::string& name) const {
    auto it = t.find(name);
    if (it == t.end()) throw std::runtime_error("reference file lacks '" + name + "'");
    return it->second;
  }
};

Reference read_reference(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string() + " (run tools/gpt2_reference.py)");
  auto read = [&](void* dst, size_t n) {
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in) throw std::runtime_error(path.string() + ": truncated");
  };
  char magic[8];
  read(magic, 8);
  if (std::string(magic, 8) != std::string("GPT2REF\0", 8)) throw std::runtime_error(path.string() + ": bad magic");
  uint32_t version = 0, count = 0;
  read(&version, 4);
  read(&count, 4);
  if (version != 1) throw std::runtime_error(path.string() + ": version " + std::to_string(version) + ", expected 1");
  Reference ref;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0, code = 0, ndim = 0;
    read(&len, 4);
    std::string name(len, '\0');
    read(name.data(), len);
    read(&code, 4);
    read(&ndim, 4);
    std::vector<int64_t> dims(ndim);
    for (auto& d : dims) read(&d, 8);
    const auto type = code == 0 ? torch::kFloat : code == 1 ? torch::kLong : torch::kDouble;
    auto t = torch::empty(dims, type);
    read(t.data_ptr(), t.numel() * t.element_size());
    ref.t[name] = t;
  }
  return ref;
}

}  // namespace

TEST_CASE("presets and parameter counts") {
  auto gpt2 = m::GPTConfig::preset("gpt2");
  CHECK(gpt2.vocab_size == 50257);
  CHECK(gpt2.padded_vocab_size == 50304);
  CHECK(gpt2.num_parameters() == 124'475'904);
  auto unpadded = gpt2;
  unpadded.padded_vocab_size = 50257;
  CHECK(unpadded.num_parameters() == 124'439'808);
  // The released checkpoints' sizes (vocabulary 50257, head tied).
  auto count_unpadded = [](const char* name) {
    auto c = m::GPTConfig::preset(name);
    c.padded_vocab_size = c.vocab_size;
    return c.num_parameters();
  };
  CHECK(count_unpadded("gpt2-medium") == 354'823'168);
  CHECK(count_unpadded("gpt2-large") == 774'030'080);
  CHECK(count_unpadded("gpt2-xl") == 1'557'611'200);
  CHECK(gpt2.flops_per_token(1024) == doctest::Approx(6.0 * 124'475'904 + 12.0 * 12 * 768 * 1024));  // PaLM

  // The analytic count is the module's count (the tied head counted once).
  for (const char* name : {"tiny", "small-cpu", "gpt2"}) {
    CAPTURE(name);
    auto cfg = m::GPTConfig::preset(name);
    m::GPT model(cfg, 0);
    CHECK(model->num_parameters() == cfg.num_parameters());
    int64_t listed = 0;
    for (const auto& p : model->parameters()) listed += p.numel();
    CHECK(listed == cfg.num_parameters());  // no second copy of wte registered as a head
  }
  auto no_bias = tiny();
  no_bias.bias = false;
  CHECK(m::GPT(no_bias, 0)->num_parameters() == no_bias.num_parameters());
}

TEST_CASE("config errors name the values") {
  auto err = error_of([] { m::GPTConfig::preset("gpt3"); });
  CHECK(err.find("'gpt3'") != std::string::npos);
  CHECK(err.find("gpt2-medium") != std::string::npos);
  CHECK(err.find("tiny") != std::string::npos);
  auto cfg = tiny();
  cfg.n_head = 3;
  err = error_of([&] { cfg.validate(); });
  CHECK(err.find("n_embd=64") != std::string::npos);
  CHECK(err.find("n_head=3") != std::string::npos);
  CHECK_THROWS_AS((void)m::GPT(cfg), std::invalid_argument);
  CHECK(m::GPTConfig::pad_vocab(50257) == 50304);
  CHECK(m::GPTConfig::pad_vocab(128) == 128);
}

TEST_CASE("forward shapes, initial loss, tied head") {
  use_one_thread();
  auto cfg = tiny();
  m::GPT model(cfg, 1);
  auto x = torch::randint(cfg.vocab_size, {3, 17}, torch::kLong);
  auto logits = model(x);
  CHECK(logits.sizes() == torch::IntArrayRef({3, 17, 50304}));
  // Targets independent of the inputs: with a tied head, predicting the input token itself
  // is favoured at init, so loss(logits, x) would sit well below ln(V).
  auto y = torch::randint(cfg.vocab_size, {3, 17}, torch::kLong);
  auto loss = model->loss(logits, y);
  CHECK(loss.dim() == 0);
  CHECK(std::abs(loss.item<double>() - std::log(50257.0)) < 0.1);
  // The head is wte itself.
  CHECK(model->lm_head_weight().data_ptr() == model->wte->weight.data_ptr());
  CHECK(model->lm_head_weight().is_same(model->wte->weight));
  CHECK_THROWS(model(torch::zeros({1, cfg.block_size + 1}, torch::kLong)));
  CHECK_THROWS(model(torch::zeros({4}, torch::kLong)));
}

// The sliced form the loss had before (and which PyTorch users write): real columns, widened to
// fp32, then cross_entropy. The fused loss must match it in value and in gradients.
static torch::Tensor sliced_loss(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab) {
  auto real = logits.narrow(-1, 0, vocab).reshape({-1, vocab});
  return torch::nn::functional::cross_entropy(real.to(torch::kFloat), targets.reshape({-1}));
}

TEST_CASE("the fused loss equals the sliced fp32 cross-entropy: values and gradients, any chunking") {
  use_one_thread();
  auto gen = at::detail::createCPUGenerator(11);
  const int64_t N = 37, Vp = 64, V = 50;
  auto base = torch::randn({N, Vp}, gen) * 3.0;             // (N, Vp)
  auto targets = torch::randint(V, {N}, gen, torch::kLong);  // (N)
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    CAPTURE(dtype);
    auto ref_in = base.to(dtype).detach().requires_grad_(true);
    auto ref = sliced_loss(ref_in, targets, V);
    ref.backward();
    for (const int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{0}, N, int64_t{100}}) {
      CAPTURE(chunk);
      auto in = base.to(dtype).detach().requires_grad_(true);
      auto loss = m::cross_entropy_real_vocab(in, targets, V, chunk);
      CHECK((loss.scalar_type() == torch::kFloat));
      CHECK(loss.dim() == 0);
      CHECK(std::abs(loss.item<double>() - ref.item<double>()) < 1e-5 * ref.item<double>());
      (loss * 3.0).backward();  // a non-unit incoming gradient is applied too
      REQUIRE(in.grad().defined());
      CHECK((in.grad().scalar_type() == dtype));
      CHECK(rel_err(in.grad(), ref_in.grad() * 3.0) < (dtype == torch::kFloat ? 1e-5 : 1e-2));
      CHECK(torch::equal(in.grad().narrow(1, V, Vp - V), torch::zeros({N, Vp - V}, in.grad().options())));
      torch::NoGradGuard no_grad;  // the forward-only path (eval) gives the same value
      CHECK(std::abs(m::cross_entropy_real_vocab(in, targets, V, chunk).item<double>() - loss.item<double>()) < 1e-6);
    }
  }
  // The gradient buffer is used up by backward: a second pass is an error, not a wrong answer.
  auto in = base.detach().requires_grad_(true);
  auto loss = m::cross_entropy_real_vocab(in, targets, V, 8);
  loss.backward(/*gradient=*/{}, /*retain_graph=*/true);
  CHECK(contains(error_of([&] { loss.backward(); }), "backward ran twice"));
  CHECK(contains(error_of([&] { m::cross_entropy_real_vocab(in, targets.narrow(0, 0, 5), V); }), "expected logits (N, Vp)"));
}

TEST_CASE("targets outside the vocabulary are ignored as PyTorch's ignore_index: no loss, no gradient, not counted") {
  use_one_thread();
  auto gen = at::detail::createCPUGenerator(12);
  const int64_t N = 23, Vp = 64, V = 50;
  auto base = torch::randn({N, Vp}, gen) * 3.0;             // (N, Vp)
  auto targets = torch::randint(V, {N}, gen, torch::kLong);  // (N)
  // -100 (PyTorch's ignore_index), a padded column's id, one past the padding, and a huge id.
  const std::vector<int64_t> bad_rows = {0, 5, 6, 22}, bad_ids = {-100, V + 3, Vp, int64_t{1} << 40};
  for (size_t i = 0; i < bad_rows.size(); ++i) targets[bad_rows[i]] = bad_ids[i];
  auto pytorch_targets = targets.clone();
  for (auto r : bad_rows) pytorch_targets[r] = -100;
  auto ref_in = base.detach().requires_grad_(true);
  auto ref = torch::nn::functional::cross_entropy(ref_in.narrow(1, 0, V), pytorch_targets,
                                                  torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  ref.backward();
  for (const int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{0}}) {
    CAPTURE(chunk);
    auto in = base.detach().requires_grad_(true);
    auto loss = m::cross_entropy_real_vocab(in, targets, V, chunk);
    CHECK(std::abs(loss.item<double>() - ref.item<double>()) < 1e-6 * ref.item<double>());
    (loss * 2.0).backward();
    CHECK(rel_err(in.grad().narrow(1, 0, V), ref_in.grad().narrow(1, 0, V) * 2.0) < 1e-5);
    for (auto r : bad_rows) CHECK(torch::count_nonzero(in.grad()[r]).item<int64_t>() == 0);
    torch::NoGradGuard no_grad;
    CHECK(std::abs(m::cross_entropy_real_vocab(in, targets, V, chunk).item<double>() - loss.item<double>()) < 1e-6);
  }
  // Every row ignored: 0/0, NaN, as PyTorch's mean over no targets; and no gradient at all.
  auto in = base.detach().requires_grad_(true);
  auto none = m::cross_entropy_real_vocab(in, torch::full({N}, int64_t{-100}), V);
  CHECK(std::isnan(none.item<float>()));
  none.backward();
  CHECK(torch::count_nonzero(in.grad()).item<int64_t>() == 0);
}

TEST_CASE("a NaN or +inf logit makes the loss NaN and its row's gradient NaN, the other rows finite") {
  use_one_thread();
  auto gen = at::detail::createCPUGenerator(13);
  const int64_t N = 9, Vp = 64, V = 50;
  auto targets = torch::randint(V, {N}, gen, torch::kLong);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const int64_t column : {int64_t{0}, int64_t{17}, V - 1}) {  // the target's column or another
     for (const int64_t chunk : {int64_t{3}, int64_t{0}}) {  // chunked ATen ops, and the CPU kernel (fp32)
      CAPTURE(dtype);
      CAPTURE(column);
      CAPTURE(chunk);
      auto base = torch::randn({N, Vp}, gen);
      CAPTURE(bad);
      base[4][column] = bad;
      auto in = base.to(dtype).detach().requires_grad_(true);
      auto loss = m::cross_entropy_real_vocab(in, targets, V, chunk);
      CHECK(std::isnan(loss.item<float>()));
      loss.backward();
      auto g = in.grad().to(torch::kFloat);
      CHECK(torch::isnan(g[4].narrow(0, 0, V)).all().item<bool>());  // the whole row, not a finite step
      CHECK(torch::isfinite(g.narrow(0, 0, 4)).all().item<bool>());
      CHECK(torch::isfinite(g.narrow(0, 5, N - 5)).all().item<bool>());
     }
    }
  }
}

TEST_CASE("a -inf logit takes no probability: the loss of the other columns, a zero gradient there") {
  use_one_thread();
  auto gen = at::detail::createCPUGenerator(15);
  const int64_t N = 5, Vp = 64, V = 50;
  auto targets = torch::randint(V, {N}, gen, torch::kLong);
  auto base = torch::randn({N, Vp}, gen);
  const int64_t column = (targets[2].item<int64_t>() + 1) % V;  // not row 2's target
  base[2][column] = -std::numeric_limits<float>::infinity();
  for (const int64_t chunk : {int64_t{3}, int64_t{0}}) {  // chunked ATen ops, and the CPU kernel
    CAPTURE(chunk);
    auto in = base.detach().requires_grad_(true);
    auto loss = m::cross_entropy_real_vocab(in, targets, V, chunk);
    auto ref = sliced_loss(base, targets, V);
    CHECK(std::isfinite(loss.item<float>()));
    CHECK(std::abs(loss.item<double>() - ref.item<double>()) < 1e-6 * ref.item<double>());
    loss.backward();
    CHECK(in.grad()[2][column].item<float>() == 0.0f);
    CHECK(torch::isfinite(in.grad()).all().item<bool>());
  }
}

TEST_CASE("the CPU loss kernel gives the same loss and gradient whatever the thread count") {
  if (!m::cross_entropy_path(torch::kCPU, torch::kFloat, 0).fused) return;  // a CPU without AVX2 and FMA
  auto gen = at::detail::createCPUGenerator(14);
  const int64_t N = 301, Vp = 1000, V = 997;
  auto base = torch::randn({N, Vp}, gen) * 4.0;
  auto targets = torch::randint(V, {N}, gen, torch::kLong);
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    auto in = base.detach().requires_grad_(true);
    auto loss = m::cross_entropy_real_vocab(in, targets, V);
    loss.backward();
    return std::make_pair(loss.item<float>(), in.grad().clone());
  };
  const int before = at::get_num_threads();
  const auto one = run(1), two = run(2), three = run(3);
  at::set_num_threads(before);
  CHECK(one.first == two.first);
  CHECK(one.first == three.first);
  CHECK(torch::equal(one.second, two.second));
  CHECK(torch::equal(one.second, three.second));
  CHECK(std::abs(one.first - sliced_loss(base, targets, V).item<float>()) < 1e-5f * one.first);
}

TEST_CASE("GPT::loss through the model: the gradients of the sliced loss, padded rows of wte untouched") {
  use_one_thread();
  auto cfg = tiny(250);  // padded to 256
  REQUIRE(cfg.padded_vocab_size == 256);
  m::GPT fused(cfg, 4), sliced(cfg, 4);
  auto gen = at::detail::createCPUGenerator(2);
  auto x = torch::randint(250, {3, 16}, gen, torch::kLong), y = torch::randint(250, {3, 16}, gen, torch::kLong);
  auto a = fused->loss(fused(x), y);
  auto b = sliced_loss(sliced(x), y, cfg.vocab_size);
  a.backward();
  b.backward();
  CHECK(std::abs(a.item<double>() - b.item<double>()) < 1e-6 * b.item<double>());
  auto pa = fused->named_parameters(), pb = sliced->named_parameters();
  for (const auto& item : pa) {
    CAPTURE(item.key());
    CHECK(rel_err(item.value().grad(), pb[item.key()].grad()) < 1e-5);
  }
  // The padded rows of the tied embedding get no gradient from the loss.
  CHECK(torch::count_nonzero(fused->wte->weight.grad().narrow(0, 250, 6)).item<int64_t>() == 0);
}

TEST_CASE("causality: a later token does not change earlier logits") {
  use_one_thread();
  auto cfg = tiny(256);
  m::GPT model(cfg, 2);
  model->eval();
  torch::NoGradGuard no_grad;
  auto x = torch::randint(cfg.vocab_size, {2, 32}, torch::kLong);
  const int64_t t = 12;
  auto x2 = x.clone();
  x2.index_put_({torch::indexing::Slice(), t + 1}, (x.index({torch::indexing::Slice(), t + 1}) + 7) % cfg.vocab_size);
  auto a = model(x), b = model(x2);
  using torch::indexing::Slice;
  CHECK(torch::allclose(a.index({Slice(), Slice(0, t + 1)}), b.index({Slice(), Slice(0, t + 1)}), 1e-6, 1e-6));
  CHECK_FALSE(torch::allclose(a.index({Slice(), t + 1}), b.index({Slice(), t + 1})));
}

TEST_CASE("bf16 autocast forward is close to fp32, and the guard restores state") {
  use_one_thread();
  auto cfg = tiny(512);
  m::GPT model(cfg, 3);
  torch::NoGradGuard no_grad;
  auto x = torch::randint(cfg.vocab_size, {2, 64}, torch::kLong);
  auto ref = model(x);
  const bool before = at::autocast::is_autocast_enabled(torch::kCPU);
  const auto dtype_before = at::autocast::get_autocast_dtype(torch::kCPU);
  torch::Tensor low;
  {
    m::AutocastGuard autocast(torch::kCPU);
    CHECK(at::autocast::is_autocast_enabled(torch::kCPU));
    low = model(x);
    CHECK((low.scalar_type() == torch::kBFloat16));
  }
  CHECK(at::autocast::is_autocast_enabled(torch::kCPU) == before);
  CHECK((at::autocast::get_autocast_dtype(torch::kCPU) == dtype_before));
  CHECK(rel_err(low, ref) < 2e-2);
}

TEST_CASE("same seed gives bitwise identical weights and losses") {
  use_one_thread();
  auto cfg = tiny(256);
  auto run = [&](uint64_t seed) {
    m::GPT model(cfg, seed);
    auto weights = model->parameters();
    std::vector<torch::Tensor> w0;
    for (auto& p : weights) w0.push_back(p.detach().clone());
    m::AdamW opt(model->named_parameters());
    auto gen = at::detail::createCPUGenerator(99);
    auto x = torch::randint(cfg.vocab_size, {2, 32}, gen, torch::kLong);
    auto y = torch::randint(cfg.vocab_size, {2, 32}, gen, torch::kLong);
    std::vector<float> losses;
    for (int i = 0; i < 3; ++i) losses.push_back(train_step(model, opt, x, y));
    return std::make_pair(w0, losses);
  };
  auto [w1, l1] = run(7);
  auto [w2, l2] = run(7);
  auto [w3, l3] = run(8);
  REQUIRE(w1.size() == w2.size());
  for (size_t i = 0; i < w1.size(); ++i) CHECK(torch::equal(w1[i], w2[i]));
  CHECK(l1 == l2);
  CHECK_FALSE(torch::equal(w1[0], w3[0]));
}

TEST_CASE("building a model draws nothing from the global generator (dropout's masks do not depend on who built what)") {
  use_one_thread();
  torch::manual_seed(5);
  auto gen = at::globalContext().defaultGenerator(torch::kCPU);
  const auto before = gen.get_state();
  m::GPT model(tiny(256), 3);
  CHECK(torch::equal(gen.get_state(), before));
  auto again = torch::rand({4});  // and the stream goes on from where it was
  torch::manual_seed(5);
  CHECK(torch::equal(again, torch::rand({4})));
}

TEST_CASE("recompute mlp and block: the losses and gradients of none, to 1e-6 (fp32, small-cpu), with dropout too") {
  use_one_thread();
  for (const double dropout : {0.0, 0.1}) {
    CAPTURE(dropout);
    auto cfg = m::GPTConfig::preset("small-cpu");
    cfg.dropout = dropout;
    auto gen = at::detail::createCPUGenerator(21);
    auto x = torch::randint(cfg.vocab_size, {2, 64}, gen, torch::kLong);
    auto y = torch::randint(cfg.vocab_size, {2, 64}, gen, torch::kLong);
    y[0][3] = -100;  // an ignored target on the way
    std::map<std::string, torch::Tensor> reference;
    double reference_loss = 0;
    for (const auto mode : {m::Recompute::none, m::Recompute::mlp, m::Recompute::block}) {
      CAPTURE(m::recompute_name(mode));
      m::GPT model(cfg, 9);
      model->train();
      model->set_recompute(mode);
      torch::manual_seed(77);  // the same dropout masks in every mode
      auto loss = model->loss(model(x), y);
      // The mode is in force: its autograd functions are in the graph (and only its).
      const auto nodes = graph_node_names(loss);
      CHECK(contains(nodes, "LayerNormLinear") == (mode == m::Recompute::mlp));
      CHECK(contains(nodes, "GeluLinear") == (mode == m::Recompute::mlp));
      CHECK(contains(nodes, "Checkpoint") == (mode == m::Recompute::block));
      loss.backward();
      if (mode == m::Recompute::none) {
        reference_loss = loss.item<double>();
        for (const auto& p : model->named_parameters()) reference[p.key()] = p.value().grad().clone();
        continue;
      }
      CHECK(std::abs(loss.item<double>() - reference_loss) <= 1e-6);
      for (const auto& p : model->named_parameters()) {
        CAPTURE(p.key());
        REQUIRE(p.value().grad().defined());
        CHECK(rel_err(p.value().grad(), reference[p.key()]) <= 1e-6);
      }
    }
  }
  CHECK(m::parse_recompute("mlp") == m::Recompute::mlp);
  CHECK(contains(error_of([] { m::parse_recompute("all"); }), "\"none\", \"mlp\" or \"block\", got \"all\""));
}

TEST_CASE("bench_model's SDPA choice: the kernel named is the one taken, the same losses, the switches put back") {
  use_one_thread();
  m::GPT model(tiny(256), 3);
  auto gen = at::detail::createCPUGenerator(4);
  auto x = torch::randint(256, {2, 32}, gen, torch::kLong), y = torch::randint(256, {2, 32}, gen, torch::kLong);
  const auto before = model->attention_backend(32, torch::kFloat, torch::kCPU);
  double math_loss = 0;
  {
    m::SdpaChoice only("math");
    CHECK(model->attention_backend(32, torch::kFloat, torch::kCPU) == "math");
    math_loss = model->loss(model(x), y).item<double>();
  }
  CHECK(model->attention_backend(32, torch::kFloat, torch::kCPU) == before);  // put back
  {
    m::SdpaChoice only("flash");  // the CPU's flash kernel
    const auto name = model->attention_backend(32, torch::kFloat, torch::kCPU);
    CHECK(name == "flash_attention");
    CHECK(std::abs(model->loss(model(x), y).item<double>() - math_loss) < 1e-5 * math_loss);
  }
  {
    m::SdpaChoice same("auto");  // changes nothing
    CHECK(model->attention_backend(32, torch::kFloat, torch::kCPU) == before);
  }
  CHECK(contains(error_of([] { m::SdpaChoice bad("fast"); }), "auto, flash, cudnn, efficient or math, got \"fast\""));
}

TEST_CASE("GPT-2 initialisation statistics") {
  auto cfg = m::GPTConfig::preset("small-cpu");
  m::GPT model(cfg, 5);
  auto params = model->named_parameters();
  CHECK(params["wte.weight"].std().item<double>() == doctest::Approx(0.02).epsilon(0.02));
  CHECK(params["h.0.attn.c_proj.weight"].std().item<double>() ==
        doctest::Approx(0.02 / std::sqrt(2.0 * cfg.n_layer)).epsilon(0.05));
  CHECK(params["h.1.mlp.c_proj.weight"].std().item<double>() ==
        doctest::Approx(0.02 / std::sqrt(2.0 * cfg.n_layer)).epsilon(0.05));
  CHECK(params["h.0.attn.c_attn.bias"].abs().max().item<double>() == 0.0);
  CHECK(torch::equal(params["ln_f.weight"], torch::ones({cfg.n_embd})));
}

TEST_CASE("overfitting one batch of tiny drives the loss below 0.1") {
  use_one_thread();
  auto cfg = tiny();  // the preset as is, GPT-2 vocabulary
  m::GPT model(cfg, 11);
  m::AdamW opt(model->named_parameters(), m::AdamWOptions{.lr = 3e-3, .weight_decay = 0.0});
  auto gen = at::detail::createCPUGenerator(3);
  auto x = torch::randint(cfg.vocab_size, {2, 16}, gen, torch::kLong);
  auto y = torch::randint(cfg.vocab_size, {2, 16}, gen, torch::kLong);
  float first = 0, last = 0;
  int steps = 0;
  for (; steps < 400 && !(steps > 0 && last < 0.05f); ++steps) {
    last = train_step(model, opt, x, y);
    if (steps == 0) first = last;
  }
  MESSAGE("overfit: " << first << " -> " << last << " in " << steps << " steps");
  CHECK(std::abs(first - std::log(50257.0)) < 0.1);
  CHECK(last < 0.1f);
}

TEST_CASE("AdamW: decay groups, fused equals plain, state round trip") {
  use_one_thread();
  auto cfg = tiny(128);
  m::GPT model(cfg, 4);
  m::AdamW opt(model->named_parameters());
  const auto& decay = opt.decay_names();
  const auto& no_decay = opt.no_decay_names();
  CHECK(std::find(decay.begin(), decay.end(), "wte.weight") != decay.end());
  CHECK(std::find(decay.begin(), decay.end(), "wpe.weight") != decay.end());
  CHECK(std::find(decay.begin(), decay.end(), "h.1.mlp.c_fc.weight") != decay.end());
  CHECK(std::find(no_decay.begin(), no_decay.end(), "h.1.mlp.c_fc.bias") != no_decay.end());
  CHECK(std::find(no_decay.begin(), no_decay.end(), "ln_f.weight") != no_decay.end());
  CHECK(static_cast<int64_t>(decay.size()) == 2 + 4 * cfg.n_layer);
  CHECK(decay.size() + no_decay.size() == model->parameters().size());

  // The fused CPU kernel and the plain tensor-op version agree: exactly enough after one step,
  // and in the losses after that (AdamW amplifies rounding noise in gradients that are zero in
  // exact arithmetic, such as the key bias's, so weights are not compared after many steps).
  m::GPT a(cfg, 4), b(cfg, 4);
  m::AdamW fa(a->named_parameters(), m::AdamWOptions{.lr = 1e-2, .fused = true});
  m::AdamW fb(b->named_parameters(), m::AdamWOptions{.lr = 1e-2, .fused = false});
  auto x = torch::randint(cfg.vocab_size, {2, 16}, torch::kLong);
  CHECK(train_step(a, fa, x, x) == train_step(b, fb, x, x));
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(rel_err(pa[i], pb[i]) < 1e-6);
  for (int i = 1; i < 4; ++i) {
    fa.set_lr(1e-2 / (i + 1));
    fb.set_lr(1e-2 / (i + 1));
    CHECK(train_step(a, fa, x, x) == doctest::Approx(train_step(b, fb, x, x)).epsilon(1e-5));
  }

  // State out and back in reproduces the next step exactly.
  m::GPT c(cfg, 4);
  m::load_parameters(c, [&] {
    m::NamedTensors n;
    for (const auto& item : a->named_parameters()) n.emplace_back(item.key(), item.value().detach().clone());
    return n;
  }());
  m::AdamW fc(c->named_parameters(), m::AdamWOptions{.lr = 0.5});
  m::NamedTensors saved;
  for (const auto& [k, v] : fa.state()) saved.emplace_back(k, v.clone());
  fc.load_state(saved);
  CHECK(fc.lr() == doctest::Approx(fa.lr()));
  CHECK(train_step(a, fa, x, x) == train_step(c, fc, x, x));
  for (size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], c->parameters()[i]));
  CHECK_THROWS_AS(fc.load_state({}), std::invalid_argument);
}

TEST_CASE("clip_grad_norm returns the norm and scales the gradients") {
  auto p1 = torch::zeros({2}, torch::requires_grad());
  auto p2 = torch::zeros({1}, torch::requires_grad());
  auto p3 = torch::zeros({1}, torch::requires_grad());  // no grad: skipped
  p1.mutable_grad() = torch::tensor({3.0f, 0.0f});
  p2.mutable_grad() = torch::tensor({4.0f});
  auto norm = m::clip_grad_norm({p1, p2, p3}, 1.0);
  CHECK(norm.dim() == 0);
  CHECK(norm.item<float>() == doctest::Approx(5.0));
  CHECK(p1.grad()[0].item<float>() == doctest::Approx(0.6).epsilon(1e-5));
  CHECK(p2.grad()[0].item<float>() == doctest::Approx(0.8).epsilon(1e-5));
  // Under the limit: unchanged.
  norm = m::clip_grad_norm({p1, p2}, 10.0);
  CHECK(norm.item<float>() == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(p2.grad()[0].item<float>() == doctest::Approx(0.8).epsilon(1e-5));
}

TEST_CASE("warmup + cosine schedule") {
  m::LrSchedule s{.lr_max = 1.0, .lr_min = 0.1, .warmup_steps = 10, .total_steps = 110};
  CHECK(s.at(0) == doctest::Approx(0.1));
  CHECK(s.at(4) == doctest::Approx(0.5));
  CHECK(s.at(9) == doctest::Approx(1.0));
  CHECK(s.at(10) == doctest::Approx(1.0));
  CHECK(s.at(60) == doctest::Approx(0.55));  // half way through the decay
  CHECK(s.at(110) == doctest::Approx(0.1));
  CHECK(s.at(1000) == doctest::Approx(0.1));
  for (int64_t i = 10; i < 110; ++i) CHECK(s.at(i + 1) <= s.at(i));
  m::LrSchedule no_warmup{.lr_max = 2.0, .lr_min = 0.0, .warmup_steps = 0, .total_steps = 4};
  CHECK(no_warmup.at(0) == doctest::Approx(2.0));
  CHECK(no_warmup.at(2) == doctest::Approx(1.0));
}

TEST_CASE("checkpoint round trip and corrupt files") {
  use_one_thread();
  CHECK(m::crc32("123456789", 9) == 0xCBF43926u);
  CHECK(m::crc32("56789", 5, m::crc32("1234", 4)) == 0xCBF43926u);

  auto dir = temp_dir();
  const auto path = (dir / "ckpt.bin").string();
  auto cfg = tiny(128);
  m::GPT model(cfg, 21);
  m::AdamW opt(model->named_parameters(), m::AdamWOptions{.lr = 1e-3});
  auto x = torch::randint(cfg.vocab_size, {2, 16}, torch::kLong);
  train_step(model, opt, x, x);
  opt.set_lr(7e-4);
  const std::string meta = R"({"config":)" + cfg.to_json() + R"(,"data_position":1234})";
  torch::manual_seed(77);
  m::save_checkpoint(path, model, &opt, 1, meta);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  const auto expected_rand = torch::rand({4});

  // The snapshot is a copy: training on does not change what was captured.
  auto snap = m::snapshot(model, &opt, 1, meta);
  train_step(model, opt, x, x);
  m::write_checkpoint((dir / "snap.bin").string(), snap);

  auto loaded = m::read_checkpoint(path);
  CHECK(loaded.step == 1);
  CHECK(loaded.metadata == meta);
  m::GPT fresh(cfg, 99);
  m::AdamW fresh_opt(fresh->named_parameters());
  m::restore(loaded, fresh, &fresh_opt);
  CHECK(fresh_opt.lr() == doctest::Approx(7e-4));
  CHECK(torch::equal(torch::rand({4}), expected_rand));  // RNG state restored

  auto from_snap = m::read_checkpoint((dir / "snap.bin").string());
  m::GPT other(cfg, 98);
  m::AdamW other_opt(other->named_parameters());
  m::restore(from_snap, other, &other_opt, /*restore_rng=*/false);
  auto pf = fresh->parameters(), po = other->parameters();
  for (size_t i = 0; i < pf.size(); ++i) CHECK(torch::equal(pf[i], po[i]));
  // Both resume identically.
  CHECK(train_step(fresh, fresh_opt, x, x) == train_step(other, other_opt, x, x));

  // Bad magic.
  const auto bad = (dir / "bad.bin").string();
  {
    std::ofstream f(bad, std::ios::binary);
    f << std::string(200, 'x');
  }
  auto err = error_of([&] { m::read_checkpoint(bad); });
  CHECK(err.find("bad magic 'xxxxxxxx'") != std::string::npos);
  CHECK(err.find(bad) != std::string::npos);
  // Truncated.
  const auto size = fs::file_size(path);
  fs::copy_file(path, dir / "trunc.bin");
  fs::resize_file(dir / "trunc.bin", size - 100);
  err = error_of([&] { m::read_checkpoint((dir / "trunc.bin").string()); });
  CHECK(err.find("truncated") != std::string::npos);
  fs::resize_file(dir / "trunc.bin", 10);
  err = error_of([&] { m::read_checkpoint((dir / "trunc.bin").string()); });
  CHECK(err.find("shorter than the 64-byte header") != std::string::npos);
  // One flipped byte in the tensor data.
  fs::copy_file(path, dir / "flip.bin");
  {
    std::fstream f(dir / "flip.bin", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(size - 50));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size - 50));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  err = error_of([&] { m::read_checkpoint((dir / "flip.bin").string()); });
  CHECK(err.find("CRC-32") != std::string::npos);
  // A newer version.
  fs::copy_file(path, dir / "v2.bin");
  {
    std::fstream f(dir / "v2.bin", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(8);
    const uint32_t v = 2;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  err = error_of([&] { m::read_checkpoint((dir / "v2.bin").string()); });
  CHECK(err.find("version 2") != std::string::npos);
  // Weights for another architecture.
  m::GPT wider(tiny(256), 1);
  err = error_of([&] { m::restore(loaded, wider, nullptr); });
  CHECK(err.find("wte.weight") != std::string::npos);
  remove_tree(dir);
}

TEST_CASE("sampling") {
  use_one_thread();
  auto cfg = tiny(100);
  m::GPT model(cfg, 8);
  std::vector<int64_t> prompt{1, 2, 3};
  auto a = m::sample(model, prompt, {.n_tokens = 80, .temperature = 1.0, .top_k = 10, .seed = 5});
  auto b = m::sample(model, prompt, {.n_tokens = 80, .temperature = 1.0, .top_k = 10, .seed = 5});
  CHECK(a.size() == 83);  // past block_size (64): the context is cropped
  CHECK(a == b);
  CHECK(std::vector<int64_t>(a.begin(), a.begin() + 3) == prompt);
  for (int64_t id : a) CHECK((id >= 0 && id < cfg.vocab_size));
  CHECK(model->is_training());
  auto g1 = m::sample(model, prompt, {.n_tokens = 5, .temperature = 0.0});
  auto g2 = m::sample(model, prompt, {.n_tokens = 5, .temperature = 0.0, .seed = 6});
  CHECK(g1 == g2);
  CHECK_THROWS_AS(m::sample(model, {100}), std::invalid_argument);
}

TEST_CASE("parity with the PyTorch reference (tools/gpt2_reference.py)") {
  use_one_thread();
  const auto ref = read_reference(fs::path(PIPELINE_SOURCE_DIR) / "tests/data/gpt2_tiny_reference.bin");
  const auto c = ref.at("config");
  auto cfg = m::GPTConfig::preset("tiny").with_vocab(c[4].item<int64_t>());
  REQUIRE(cfg.n_layer == c[0].item<int64_t>());
  REQUIRE(cfg.n_head == c[1].item<int64_t>());
  REQUIRE(cfg.n_embd == c[2].item<int64_t>());
  REQUIRE(cfg.block_size == c[3].item<int64_t>());
  REQUIRE(cfg.padded_vocab_size == c[5].item<int64_t>());

  m::GPT model(cfg, 0);
  m::NamedTensors weights;
  for (const auto& [name, t] : ref.t) {
    if (name.rfind("param/", 0) == 0) weights.emplace_back(name.substr(6), t);
  }
  m::load_parameters(model, weights);

  const auto& x = ref.at("idx");
  const auto& y = ref.at("targets");
  auto logits = model(x);
  auto loss = model->loss(logits, y);
  loss.backward();
  CHECK(rel_err(logits, ref.at("logits")) < 1e-5);
  CHECK(rel_err(loss, ref.at("loss")) < 1e-5);
  double worst_grad = 0.0;
  for (const auto& item : model->named_parameters()) {
    CAPTURE(item.key());
    const double e = rel_err(item.value().grad(), ref.at("grad/" + item.key()));
    worst_grad = std::max(worst_grad, e);
    CHECK(e < 1e-5);
  }
  MESSAGE("parity: logits " << rel_err(logits, ref.at("logits")) << ", loss " << rel_err(loss, ref.at("loss"))
                            << ", worst gradient " << worst_grad);

  const auto h = ref.at("adamw");
  m::AdamW opt(model->named_parameters(),
               m::AdamWOptions{.lr = h[0].item<double>(), .beta1 = h[1].item<double>(),
                               .beta2 = h[2].item<double>(), .eps = h[3].item<double>(),
                               .weight_decay = h[4].item<double>()});
  const auto losses = ref.at("losses");
  double worst_loss = 0.0;
  for (int64_t i = 0; i < losses.numel(); ++i) {
    CAPTURE(i);
    const float got = train_step(model, opt, x, y, h[5].item<double>());
    worst_loss = std::max(worst_loss, static_cast<double>(std::abs(got - losses[i].item<float>())));
    CHECK(std::abs(got - losses[i].item<float>()) < 1e-4);
  }
  MESSAGE("parity: worst AdamW-step loss difference " << worst_loss << " over " << losses.numel() << " steps");
}

TEST_CASE("per-step objects are reused only once no one else holds them") {
  int made = 0;
  m::ReusePool<int> pool([&] { return std::make_shared<int>(made++); });
  auto a = pool.take(), b = pool.take();
  CHECK(a != b);  // a is held: b is another
  CHECK(pool.size() == 2);
  a.reset();
  auto c = pool.take();
  CHECK(*c == 0);  // a's object, back
  CHECK(pool.size() == 2);
  auto d = pool.take();  // b and c held: a new one
  CHECK(*d == 2);
  CHECK(pool.size() == 3);

  int tensors = 0;
  m::TensorReusePool pinned([&] {
    ++tensors;
    return torch::zeros({2});
  });
  auto t = pinned.take();
  auto view = t[0];  // a view keeps the storage: not free
  t = torch::Tensor();
  auto u = pinned.take();
  CHECK(tensors == 2);
  view = torch::Tensor();
  u = torch::Tensor();
  pinned.take();
  CHECK(tensors == 2);  // both free again: no third
  CHECK(pinned.size() == 2);
}

TEST_CASE("host callbacks are counted, and one that throws is reported by the wait, not fatal") {
  m::HostCallbacks callbacks;
  const c10::Stream cpu = m::current_stream(torch::kCPU);
  int ran = 0;
  callbacks.after(cpu, [&] { ++ran; });  // a CPU stream: runs now
  CHECK(ran == 1);
  CHECK(callbacks.pending() == 0);
  callbacks.after(cpu, [] { throw std::runtime_error("pool gone"); });
  CHECK(contains(error_of([&] { callbacks.wait_all(); }), "a host callback failed: pool gone"));
  CHECK_NOTHROW(callbacks.wait_all());  // reported once
  // What a callback captured is released before the count says it ran.
  auto held = std::make_shared<int>(1);
  std::weak_ptr<int> watch = held;
  callbacks.after(cpu, [h = std::move(held)] { (void)h; });
  callbacks.wait_all();
  CHECK(watch.expired());
  CHECK_NOTHROW(m::use_device(torch::kCPU));  // nothing to make current on the CPU
}
