// One data order whatever the world size (issue 38), as a user launches it (label e2e): `pipeline
// run` alone and under torchrun with 2, 3 and 4 CPU ranks on Gloo, the tiny model in fp32, in the
// lanes order ([data] order = "lanes", the default).
//   - Fresh runs on W = 1, 2, 3 and 4 ranks, with grad_accum = 12 / W so that every step trains
//     12 rows of 1 x 32 tokens (K = 12 lanes, auto): every step's "windows" (the hash of its set of
//     rows) in metrics.jsonl is the same for every W, and the losses agree within fp32 reduction
//     noise (kLossTolerance, below). On prepared text shards (read_shards + tokenize), llm.c .bin
//     shards (read_tokens) and Parquet (read_shards; skipped without pyarrow).
//   - The 4-rank run taken back to its step-2 checkpoint, resumed on 2 ranks, that one taken back
//     to step 4 and resumed on 3: the run's sequence of hashes is the fresh runs', step by step,
//     and so are the losses, within the same tolerance.
// The data: one corpus of documents of 3 to 60 words, so that lanes drift apart and cursors fall
// inside documents and units. Exits 77 (CTest: skipped) where set-up installed no torchrun.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "base/json.h"
#include "datasets/prepare/prepare.h"
#include "dist_harness.h"
#include "test_util.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "torchrun_harness.h"

using namespace train_harness;
using namespace torchrun_harness;
using test_util::contains;

namespace {

const bool kHaveTorchrun = require_torchrun("test_distributed_lanes");

constexpr int kRows = 12;  // rows a step: batch_size 1 x grad_accum (12 / W) x W ranks; K = 12 lanes
constexpr int kSteps = 6;

// How far the losses of one step may lie apart between world sizes, relative. The rows are the
// same (the hashes say so, exactly); what differs is the order of fp32 sums: a step's loss and
// gradients are sums over 12 micro-batches, grouped 12 x 1, 6 x 2, 4 x 3 or 3 x 4 by grad_accum
// and the all-reduce, and fp32 rounds each sum to half an ulp (6e-8 relative). Over 6 steps of
// lr 1e-3 those roundings reach the logged loss as a few ulps of it: we see at most 1.8e-7 (two
// ulps of a loss of 10.5; the test prints every step's). 1e-6, ten ulps, leaves a margin of five
// and stays ten thousand times below what other rows make (their losses differ by 1e-2 and more).
constexpr double kLossTolerance = 1e-6;

// Documents of 3 to 60 words, one a line.
fs::path write_corpus(const fs::path& root) {
  static const char* words[] = {"the", "king", "shall", "never", "speak", "of", "love", "and", "war", "my",
                                "lord", "hath", "done", "thee", "wrong", "upon", "this", "stage", "we", "play"};
  std::mt19937 rng(38);
  std::ofstream out(root / "corpus.txt");
  for (int d = 0; d < 400; ++d) {
    out << "doc " << d << ":";
    for (int w = 0, n = 3 + static_cast<int>(rng() % 58); w < n; ++w) out << ' ' << words[rng() % std::size(words)];
    out << "\n";
  }
  return root / "corpus.txt";
}

// A source of the same corpus: its dataset, its input side, and its own settings.
struct Source {
  fs::path data;
  std::string input;
  std::vector<std::string> sets;
};

std::map<std::string, Source> make_sources(const fs::path& root) {
  const fs::path corpus = write_corpus(root);
  std::map<std::string, Source> out;
  datasets::PrepareOptions o;
  o.rule = datasets::DocumentRule::lines;
  o.val_fraction = 0;
  o.threads = 1;
  o.block_bytes = 1024;  // about 45 blocks: enough units for 12 lanes
  o.out_dir = root / "text";
  datasets::prepare_dataset({corpus}, o);
  out["shards"] = {o.out_dir, kTextInput, {}};
  o.out_dir = root / "llmc";
  o.llmc = true;
  datasets::prepare_dataset({corpus}, o);
  out["llmc"] = {o.out_dir, kTokenInput, {"stages.read.llmc_unit_tokens=256"}};
  const std::string python = PIPELINE_ARROW_PYTHON;
  if (!python.empty()) {
    fs::create_directories(root / "parquet");
    const auto r = test_util::shell(
        python + " -c \"import pyarrow as pa, pyarrow.parquet as pq, sys\n"
                 "docs = [l.rstrip('\\n') for l in open(sys.argv[1])]\n"
                 "t = pa.table({'text': pa.array(docs, pa.string())})\n"
                 "pq.write_table(t, sys.argv[2], row_group_size=8)\n\" " +
        (root / "corpus.txt").string() + " " + (root / "parquet" / "corpus.parquet").string());
    if (r.code == 0) out["parquet"] = {root / "parquet", kTextInput, {}};
    else std::fprintf(stderr, "test_distributed_lanes: pyarrow could not write Parquet, its case is skipped:\n%s\n", r.out.c_str());
  }
  return out;
}

struct Step {
  std::string windows;
  double loss = 0;
};

// Every step of a run's metrics.jsonl, by step.
std::map<int64_t, Step> read_steps(const fs::path& dir) {
  std::map<int64_t, Step> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto v = json_parse(line);
    if (!v.find("loss") || !v.find("windows")) continue;
    out[static_cast<int64_t>(v.number("step"))] = {v.find("windows")->text, v.number("loss")};
  }
  return out;
}

std::vector<std::string> sets_for(const Source& src, int world) {
  std::vector<std::string> sets = {"training.steps=" + std::to_string(kSteps), "training.batch_size=1",
                                   "training.grad_accum=" + std::to_string(kRows / world), "checkpoint.every=2",
                                   "run.threads=1", "run.dist_timeout_s=120", "run.dist_heartbeat_s=20"};
  sets.insert(sets.end(), src.sets.begin(), src.sets.end());
  return sets;
}

// The corpus as every source, and each source's fresh runs on 1 to 4 ranks (made when first asked).
struct Fixture {
  fs::path root = temp_dir("lanes");
  std::map<std::string, Source> sources = make_sources(root);
  std::map<std::string, std::map<int, fs::path>> runs;

  const fs::path& fresh(const std::string& source, int world) {
    auto& dir = runs[source][world];
    if (!dir.empty()) return dir;
    const std::string name = source + "_w" + std::to_string(world);
    const Source& src = sources.at(source);
    const auto cfg = root / (name + ".toml");
    std::ofstream(cfg) << tiny_config(root / name, src.input, src.data.string());
    const auto t0 = std::chrono::steady_clock::now();
    run_torchrun(cfg, false, sets_for(src, world), root / (name + ".log"), world);
    std::printf("%s on %d rank%s: %.1f s\n", source.c_str(), world, world == 1 ? "" : "s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    dir = root / name;
    return dir;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// `got`'s steps from `from` on against `want`'s: the same hashes, the losses within the tolerance.
void check_steps(const std::map<int64_t, Step>& got, const std::map<int64_t, Step>& want, int64_t from,
                 const std::string& what) {
  REQUIRE_MESSAGE(got.size() == static_cast<size_t>(kSteps), what);
  for (int64_t s = from; s <= kSteps; ++s) {
    const Step& g = got.at(s);
    const Step& w = want.at(s);
    CHECK_MESSAGE(g.windows == w.windows, what << ", step " << s);
    const double rel = std::abs(g.loss - w.loss) / std::abs(w.loss);
    std::printf("  %s step %lld: windows %s, loss %.9g, %.2g from one process's\n", what.c_str(),
                static_cast<long long>(s), g.windows.c_str(), g.loss, rel);
    CHECK_MESSAGE(rel <= kLossTolerance, what << ", step " << s << ": loss " << g.loss << " against " << w.loss);
  }
}

void check_invariance(const std::string& source) {
  auto& f = fixture();
  if (!f.sources.count(source)) {
    MESSAGE(source << ": skipped (no Python with pyarrow to write its files)");
    return;
  }
  const auto one = read_steps(f.fresh(source, 1));
  REQUIRE(one.size() == static_cast<size_t>(kSteps));
  std::set<std::string> distinct;
  for (const auto& [s, step] : one) distinct.insert(step.windows);
  CHECK(distinct.size() == static_cast<size_t>(kSteps));  // every step trains other rows
  for (int world : {2, 3, 4}) check_steps(read_steps(f.fresh(source, world)), one, 1, source + ", " + std::to_string(world) + " ranks");
}

void check_resume(const std::string& source) {
  auto& f = fixture();
  const auto one = read_steps(f.fresh(source, 1));
  const fs::path four = f.fresh(source, 4);
  // 4 ranks to step 2, then 2 ranks to step 6 (checkpoints at 4 and 6).
  const fs::path two = stopped_copy(four, f.root / (source + "_4_to_2"), 2);
  run_torchrun(two, true, {}, f.root / (source + "_4_to_2.log"), 2);
  const auto log2 = test_util::read_file(f.root / (source + "_4_to_2.log"));
  CHECK(contains(log2, "resuming a checkpoint of 4 ranks on 2 ranks: grad_accum 6 (it was 3)"));
  check_steps(read_steps(two), one, 3, source + ", 4 -> 2 ranks");
  // That run at step 4, then 3 ranks to step 6.
  const fs::path three = stopped_copy(two, f.root / (source + "_4_to_2_to_3"), 4);
  run_torchrun(three, true, {}, f.root / (source + "_4_to_2_to_3.log"), 3);
  const auto log3 = test_util::read_file(f.root / (source + "_4_to_2_to_3.log"));
  CHECK(contains(log3, "resuming a checkpoint of 2 ranks on 3 ranks: grad_accum 4 (it was 6)"));
  check_steps(read_steps(three), one, 1, source + ", 4 -> 2 -> 3 ranks");
}

}  // namespace

TEST_CASE("1, 2, 3 and 4 ranks train every step on the same rows: prepared text shards") { check_invariance("shards"); }

TEST_CASE("1, 2, 3 and 4 ranks train every step on the same rows: llm.c shards") { check_invariance("llmc"); }

TEST_CASE("1, 2, 3 and 4 ranks train every step on the same rows: Parquet") { check_invariance("parquet"); }

TEST_CASE("a run resumed 4 -> 2 -> 3 ranks goes on with the same rows: prepared text shards") { check_resume("shards"); }

TEST_CASE("a run resumed 4 -> 2 -> 3 ranks goes on with the same rows: llm.c shards") { check_resume("llmc"); }
