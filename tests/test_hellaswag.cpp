// HellaSwag: reading the official JSONL (datasets/eval/hellaswag.h) with its errors, the rows the model
// reads (cut from the left, the ending whole), and the scoring (model/eval/hellaswag.h) against a plain
// computation from GPT::forward, whatever the batching. The comparison with transformers, item for
// item, is in test_interop.cpp.
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "datasets/eval/hellaswag.h"
#include "datasets/tokenizer/tokenizer.h"
#include "model/eval/hellaswag.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;
using test_util::contains;
using test_util::error_of;
using test_util::write_file;

namespace {

const fs::path kItems = fs::path(PIPELINE_SOURCE_DIR) / "tests" / "data" / "hellaswag" / "val_every50.jsonl";

const char* kGood =
    R"({"ctx": "A man is sitting on a roof. he", "endings": ["is using wrap.", "is ripping tiles off.", "is holding a cube.", "starts pulling up roofing."], "label": 3, "ind": 24})"
    "\n\n"
    R"({"ctx": "Clean and jerk: the lady", "endings": ["a", "b", "c", "d"], "label": "1"})"
    "\n";

std::vector<uint32_t> encode(const std::string& s) { return datasets::Tokenizer::gpt2().encode_ordinary(s); }

// The sum of the ending's cross-entropy, from the model's full logits over one unpadded row (all
// its tokens but the last, which is only a target).
double ending_loss(model::GPT& m, const datasets::HellaSwagRow& row) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> ids(row.tokens.begin(), row.tokens.end() - 1);
  auto x = torch::tensor(ids, torch::kLong).view({1, -1});                                  // (1, L)
  auto logits = m->forward(x)[0].narrow(1, 0, m->config().vocab_size);                     // (L, V)
  auto logp = torch::log_softmax(logits, 1);
  double sum = 0;
  for (size_t t = row.ending_begin; t < row.tokens.size(); ++t)
    sum -= logp[static_cast<int64_t>(t) - 1][row.tokens[t]].item<double>();
  return sum;
}

}  // namespace

TEST_CASE("a HellaSwag file: ctx and ' ' + ending tokenized apart, label as number or digit") {
  test_util::TempDir dir("hellaswag");
  const fs::path f = dir / "good.jsonl";
  write_file(f, kGood);
  const auto set = datasets::load_hellaswag(f);
  REQUIRE(set.items.size() == 2);
  CHECK(set.items[0].line == 1);
  CHECK(set.items[1].line == 3);  // the blank line is skipped, and counted
  CHECK(set.items[0].label == 3);
  CHECK(set.items[1].label == 1);
  CHECK(set.items[0].context == encode("A man is sitting on a roof. he"));
  CHECK(set.items[0].endings[1] == encode(" is ripping tiles off."));
  CHECK(set.items[1].endings[3] == encode(" d"));
  CHECK(datasets::load_hellaswag(f, 1).items.size() == 1);

  // The converted test items: 201, every label in range, every ending non-empty.
  const auto all = datasets::load_hellaswag(kItems);
  CHECK(all.items.size() == 201);
  for (const auto& it : all.items) {
    CHECK(it.label >= 0);
    CHECK(it.label <= 3);
    for (const auto& e : it.endings) CHECK(!e.empty());
  }
}

TEST_CASE("a malformed HellaSwag file is an error naming the file, the line and the field") {
  test_util::TempDir dir("hellaswag");
  const fs::path f = dir / "bad.jsonl";
  const std::string ok = R"({"ctx": "c", "endings": ["a", "b", "c", "d"], "label": 0})";
  auto error_for = [&](const std::string& second_line) {
    write_file(f, ok + "\n" + second_line + "\n");
    return error_of([&] { datasets::load_hellaswag(f); });
  };
  const std::string at = f.string() + ":2: ";
  CHECK(contains(error_for(R"({"ctx": "c", "endings": ["a", "b", "c"], "label": 0})"),
                 at + "field 'endings': expected an array of 4 strings, got an array of 3"));
  CHECK(contains(error_for(R"({"ctx": "c", "endings": ["a", "b", "c", 4], "label": 0})"),
                 at + "field 'endings': element 3 is the number 4"));
  CHECK(contains(error_for(R"({"endings": ["a", "b", "c", "d"], "label": 0})"), at + "field 'ctx': missing"));
  CHECK(contains(error_for(R"({"ctx": "", "endings": ["a", "b", "c", "d"], "label": 0})"), at + "field 'ctx'"));
  CHECK(contains(error_for(R"({"ctx": "c", "endings": ["a", "b", "c", "d"], "label": 4})"),
                 at + "field 'label': expected 0, 1, 2 or 3, got the number 4"));
  CHECK(contains(error_for(R"({"ctx": "c", "endings": ["a", "b", "c", "d"]})"), at + "field 'label': missing"));
  CHECK(contains(error_for(R"({"ctx": "c", "endings": ["a", "b", "c", "d"], "label": 0)"), at + "not JSON: column"));
  CHECK(contains(error_for("[1, 2]"), at + "expected a JSON object, got an array of 2"));
  write_file(f, "\n\n");
  CHECK(contains(error_of([&] { datasets::load_hellaswag(f); }), "holds no HellaSwag items"));
  CHECK(contains(error_of([&] { datasets::load_hellaswag(f.parent_path() / "missing.jsonl"); }),
                 (f.parent_path() / "missing.jsonl").string() + ": cannot open"));
}

TEST_CASE("a row longer than the model's context and its last target loses its first tokens, never the ending's") {
  datasets::HellaSwagItem item;
  item.line = 7;
  item.context = {1, 2, 3, 4, 5, 6};
  item.endings = {std::vector<uint32_t>{10, 11}, {20}, {30, 31, 32, 33}, {40, 41, 42, 43, 44}};
  auto r = datasets::hellaswag_row(item, 0, 64);
  CHECK(r.tokens == std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 10, 11});
  CHECK(r.ending_begin == 6);
  // A context of 6: rows of 7 tokens, the model reading the first 6 (lm-eval's max_length + 1).
  r = datasets::hellaswag_row(item, 2, 6);
  CHECK(r.tokens == std::vector<uint32_t>{4, 5, 6, 30, 31, 32, 33});
  CHECK(r.ending_begin == 3);
  r = datasets::hellaswag_row(item, 3, 6);
  CHECK(r.tokens == std::vector<uint32_t>{5, 6, 40, 41, 42, 43, 44});
  CHECK(r.ending_begin == 2);
  // An ending as long as the context: one token of context before it.
  r = datasets::hellaswag_row(item, 3, 5);
  CHECK(r.tokens == std::vector<uint32_t>{6, 40, 41, 42, 43, 44});
  CHECK(r.ending_begin == 1);
  datasets::HellaSwagSet set;
  set.file = "items.jsonl";
  set.items = {item};
  CHECK(error_of([&] { datasets::check_hellaswag_fits(set, 5); }) == "");
  CHECK(contains(error_of([&] { datasets::check_hellaswag_fits(set, 4); }),
                 "items.jsonl:7: ending 3 has 5 tokens; a model with a context of 4 tokens scores endings of up to 4"));
  CHECK(contains(error_of([&] { datasets::hellaswag_row(item, 3, 4); }), "line 7: ending 3 has 5 tokens"));
}

TEST_CASE("an ending as long as the model's context is scored whole, as the plain computation scores it") {
  at::set_num_threads(1);
  model::GPTConfig cfg = model::GPTConfig::preset("tiny");
  cfg.block_size = 5;
  model::GPT m(cfg, 3);
  m->eval();
  datasets::HellaSwagSet set;
  set.file = "items.jsonl";
  datasets::HellaSwagItem item;
  item.line = 1;
  item.label = 2;
  item.context = {464, 3290, 318, 257, 1332, 13};
  item.endings = {std::vector<uint32_t>{383, 3290, 318, 922, 13}, {317}, {383, 3797}, {262, 886, 286, 340}};
  set.items = {item};
  const auto losses = model::hellaswag_losses(m, set);  // a 6-token row, read 5 tokens at a time: no error
  REQUIRE(losses.sums.numel() == 4);
  for (int e = 0; e < 4; ++e) {
    CAPTURE(e);
    const auto row = datasets::hellaswag_row(item, e, cfg.block_size);
    CHECK(row.tokens.size() <= static_cast<size_t>(cfg.block_size) + 1);
    CHECK(losses.counts[static_cast<size_t>(e)] == static_cast<int64_t>(item.endings[static_cast<size_t>(e)].size()));
    CHECK(losses.sums[e].item<double>() == doctest::Approx(ending_loss(m, row)).epsilon(1e-5));
  }
  CHECK(datasets::hellaswag_row(item, 0, cfg.block_size).ending_begin == 1);  // 5 ending tokens after 1 of context
}

TEST_CASE("scores: the plain per-row computation's, whatever the batching") {
  at::set_num_threads(1);
  model::GPTConfig cfg = model::GPTConfig::preset("tiny");  // context 64: many rows are cut
  model::GPT m(cfg, 3);
  m->eval();
  const auto set = datasets::load_hellaswag(kItems, 24);

  // What each item's 4 rows score alone, from full logits.
  int64_t correct = 0, correct_norm = 0;
  std::vector<int8_t> expected;
  for (const auto& it : set.items) {
    double sum[4], mean[4];
    for (int e = 0; e < 4; ++e) {
      const auto row = datasets::hellaswag_row(it, e, cfg.block_size);
      sum[e] = ending_loss(m, row);
      mean[e] = sum[e] / static_cast<double>(row.tokens.size() - row.ending_begin);
    }
    int p = 0, pn = 0;
    for (int e = 1; e < 4; ++e) {
      if (sum[e] < sum[p]) p = e;
      if (mean[e] < mean[pn]) pn = e;
    }
    expected.push_back(static_cast<int8_t>(pn));
    correct += p == it.label;
    correct_norm += pn == it.label;
  }
  for (int64_t budget : {1, 300, 1 << 20}) {  // one item a pass, a few, all at once
    CAPTURE(budget);
    const auto r = model::score_hellaswag(m, set, {.batch_tokens = budget});
    CHECK(r.n == 24);
    CHECK(r.predictions == expected);
    CHECK(r.correct == correct);
    CHECK(r.correct_norm == correct_norm);
  }
  const auto first = model::score_hellaswag(m, set, {.items = 5});
  CHECK(first.n == 5);
  CHECK(first.predictions == std::vector<int8_t>(expected.begin(), expected.begin() + 5));
  CHECK(!m->is_training());

  // A model whose context cannot hold an ending: an error naming the item's line.
  model::GPTConfig small = cfg;
  small.block_size = 4;
  model::GPT short_context(small, 3);
  CHECK(contains(error_of([&] { model::score_hellaswag(short_context, set); }), kItems.string() + ":1: ending "));
}
