// `pipeline run` reading remote sources (issue 37 in the run, label e2e): the tiny model in fp32 on
// the CPU, in the lanes order, trained from the same data served locally, by rclone's S3 (and
// moto's, where installed) and by nginx's HTTPS, started here on loopback:
//   - the same losses, bit for bit, and the same "windows" hash every step, for prepared block
//     shards (with an evaluation on the remote validation split: the same val loss), llm.c .bin
//     shards (over HTTPS from a list file of presigned-looking URLs) and Parquet;
//   - through a proxy that resets connections mid-body, answers bursts of 503 and goes away for a
//     second in the middle of the run: the same losses;
//   - taken back to a checkpoint and resumed from S3: the uninterrupted run's steps after it;
//   - two ranks under torchrun from S3: the local two-rank run's losses and hashes;
//   - planted secrets (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, the signature in a presigned URL's
//     query) in no file of the run directory and no line printed;
//   - the cache directory never holds more than [stages.fetch] cache_bytes plus one unit;
//   - the fetch stage's figures in stats.jsonl and `pipeline stats`.
// A server that is not installed skips its cases, saying why.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "base/json.h"
#include "datasets/prepare/prepare.h"
#include "test_util.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "remote_servers.h"
#include "torchrun_harness.h"

using namespace train_harness;
using test_util::contains;
namespace fs = std::filesystem;

namespace {

constexpr int kRows = 12;  // rows a step: batch_size 1 x grad_accum (12 / W) x W ranks; K = 12 lanes
constexpr int kSteps = 6;
constexpr int kUnitTokens = 64;  // the corpus's llm.c units: 128 bytes, so that each lane reads several
// The cap's case: llm.c shards of random tokens in units of 32768 tokens (64 KiB), fetched up to
// 48 units ahead under the least cap the fetch stage takes (1 MiB: 16 units): the fetch threads
// want more than the cap holds, so the cap binds.
constexpr uint64_t kBigUnitBytes = 32768 * 2, kCacheBytes = 1 << 20;

// Planted: what no file of a run directory and no printed line may hold.
const std::string kKey = "AKIDREMOTERUN", kSecret = "PLANTEDsecretKEY4242", kToken = "PLANTEDsessionTOKEN4242",
                  kSignature = "PLANTEDsignature4242";

// A source: where it lies locally, over S3 and over HTTPS, its input side and its own settings.
struct Source {
  std::string local, s3, https;
  std::string input;
  std::vector<std::string> sets;
  std::string missing;  // why it cannot run here ("" : it runs)
};

const std::string kEval = "[stages.eval]\ntype = \"eval\"\ninput = \"train\"\ncapacity = 4\n";
const std::string kFetch = "[stages.fetch]\ntype = \"fetch\"\nconnections = 2\nretry_for = 60\n";

struct Step {
  std::string windows, loss;  // as logged (the loss at %.9g: exact for fp32)
};

// Every step of a run's metrics.jsonl, and its evaluations' val loss, by step.
struct Record {
  std::map<int64_t, Step> steps;
  std::map<int64_t, std::string> val;
};

Record read_record(const fs::path& dir) {
  Record r;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto v = pipeline::json_parse(line);
    const auto step = static_cast<int64_t>(v.number("step"));
    if (v.find("loss") && v.find("windows")) r.steps[step] = {v.find("windows")->text, v.find("loss")->text};
    if (const auto* val = v.find("val_loss")) r.val[step] = val->text;
  }
  return r;
}

// The bytes of a cache directory's entries (downloads in progress included; its bookkeeping not).
uint64_t cache_dir_bytes(const fs::path& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "usage" || name == "users" || name.ends_with(".lock")) continue;
    const auto size = fs::is_regular_file(it->path(), ec) ? fs::file_size(it->path(), ec) : 0;
    if (!ec) bytes += size;
    ec.clear();
  }
  return bytes;
}

struct Fixture {
  fs::path root = temp_dir("remote_run");
  fs::path srv = root / "srv";  // each folder a bucket ("data"), and nginx's root
  std::map<std::string, Source> sources;
  remote_test::RcloneS3 rclone{srv, root / "rclone.log", kKey, kSecret};
  remote_test::NginxHttps nginx{srv, root / "nginx"};
  remote_test::MotoS3 moto{root / "moto.log"};  // found through HOME's cache, before HOME changes
  std::map<std::string, fs::path> runs;
  std::map<std::string, uint64_t> cache_peak;  // a run's cache directory at its fullest

  Fixture() {
    const fs::path data = srv / "data";
    fs::create_directories(data);
    const fs::path corpus = torchrun_harness::write_line_corpus(root, 600, 37);
    pipeline::datasets::PrepareOptions o;
    o.rule = pipeline::datasets::DocumentRule::lines;
    o.val_fraction = 0.1;  // a validation split for the evaluation
    o.threads = 1;
    o.block_bytes = 1024;  // about 60 blocks: enough units for 12 lanes
    o.out_dir = data / "shards";
    pipeline::datasets::prepare_dataset({corpus}, o);
    sources["shards"] = {o.out_dir.string(), "s3://data/shards", "", kTextInput + kEval,
                         {"eval.every=3", "eval.batches=2"}, ""};
    o.val_fraction = 0;
    o.out_dir = data / "llmc";
    o.llmc = true;
    o.llmc_prefix = "corpus";
    o.shard_size = 8 << 10;  // several files
    pipeline::datasets::prepare_dataset({corpus}, o);
    sources["llmc"] = {o.out_dir.string(), "s3://data/llmc", "", kTokenInput,
                       {"stages.read.llmc_unit_tokens=" + std::to_string(kUnitTokens)}, ""};
    const std::string python = PIPELINE_ARROW_PYTHON;
    Source& pq = sources["parquet"];
    pq = {(data / "pq").string(), "s3://data/pq", "", kTextInput, {}, ""};
    if (python.empty()) {
      pq.missing = "a build without Parquet (PIPELINE_WITH_PARQUET=OFF)";
    } else {
      fs::create_directories(data / "pq");
      const auto r = test_util::shell(
          python + " -c \"import pyarrow as pa, pyarrow.parquet as pq, sys\n"
                   "docs = [l.rstrip('\\n') for l in open(sys.argv[1])]\n"
                   "pq.write_table(pa.table({'text': pa.array(docs, pa.string())}), sys.argv[2], row_group_size=8)\n\" " +
          corpus.string() + " " + (data / "pq" / "corpus.parquet").string() + " 2>&1");
      if (r.code != 0) pq.missing = "pyarrow could not write the Parquet file: " + r.out;
    }
    // Random token ids as llm.c shards (header: magic, version 1, count), 4 files of 600,000.
    fs::create_directories(data / "big");
    std::mt19937 rng(4242);
    for (int file = 0; file < 4; ++file) {
      std::vector<int32_t> header(256, 0);
      header[0] = 20240520, header[1] = 1, header[2] = 600000;
      std::vector<uint16_t> tokens(600000);
      for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 50257);
      std::ofstream out(data / "big" / ("big_train_00000" + std::to_string(file) + ".bin"), std::ios::binary);
      out.write(reinterpret_cast<const char*>(header.data()), 1024);
      out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
    }
    sources["big"] = {(data / "big").string(), "s3://data/big", "", kTokenInput, {}, ""};
    if (nginx.missing.empty()) {
      sources["shards"].https = nginx.base() + "/data/shards/";  // its manifest names the shards
      pq.https = nginx.base() + "/redirect/data/pq/corpus.parquet";
      // llm.c over HTTPS from a list file of presigned URLs: the signature in each query string is
      // a credential that must stay out of everything the run writes and prints.
      std::string list = "# presigned, as a bucket's owner hands them out\n";
      for (const auto& e : fs::directory_iterator(data / "llmc"))
        if (e.path().extension() == ".bin")
          list += nginx.base() + "/data/llmc/" + e.path().filename().string() +
                  "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=3600&X-Amz-Signature=" + kSignature + "\n";
      fs::create_directories(data / "lists");
      test_util::write_file(data / "lists" / "llmc.txt", list);
      sources["llmc"].https = nginx.base() + "/data/lists/llmc.txt";
    }
    // The keys every remote run reads from its environment (set after the servers found their
    // tools through HOME): S3's, a session token, nginx's CA.
    fs::create_directories(root / "home");
    ::setenv("HOME", (root / "home").c_str(), 1);
    ::setenv("AWS_ACCESS_KEY_ID", kKey.c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", kSecret.c_str(), 1);
    ::setenv("AWS_SESSION_TOKEN", kToken.c_str(), 1);
    if (nginx.missing.empty()) ::setenv("SSL_CERT_FILE", nginx.ca_file.c_str(), 1);
  }

  // Runs `name` (once) on `world` ranks from `dataset` (a source's local path or URL), its cache
  // directory watched for its peak; `endpoint`: S3's. Returns the run directory.
  const fs::path& run(const std::string& name, const std::string& source, const std::string& dataset, int world = 1,
                      const std::string& endpoint = "", std::vector<std::string> extra = {}) {
    auto& dir = runs[name];
    if (!dir.empty()) return dir;
    const Source& src = sources.at(source);
    const bool remote = dataset.find("://") != std::string::npos;
    const fs::path cache = root / (name + "_cache");
    std::string input = src.input;
    if (remote)
      input += kFetch + (source == "big" ? "cache_bytes = " + std::to_string(kCacheBytes) + "\nprefetch = 48\n" : "");
    std::ofstream(root / (name + ".toml")) << tiny_config(root / name, input, dataset);
    std::vector<std::string> sets = {"training.steps=" + std::to_string(kSteps), "training.batch_size=1",
                                     "training.grad_accum=" + std::to_string(kRows / world), "checkpoint.every=2",
                                     "run.threads=1", "run.dist_timeout_s=120", "run.dist_heartbeat_s=20"};
    sets.insert(sets.end(), src.sets.begin(), src.sets.end());
    if (remote) sets.insert(sets.end(), {"data.allow_http=true", "data.cache_dir=" + cache.string()});
    if (!endpoint.empty()) sets.push_back("data.endpoint=" + endpoint);
    sets.insert(sets.end(), extra.begin(), extra.end());
    launch(root / (name + ".toml"), false, sets, root / (name + ".log"), world, cache, name);
    dir = root / name;
    return dir;
  }

  // One launch (torchrun_harness), the cache directory polled while it runs.
  void launch(const fs::path& cfg_or_dir, bool resume, const std::vector<std::string>& sets, const fs::path& log,
              int world, const fs::path& cache, const std::string& name) {
    std::atomic<bool> done{false};
    uint64_t peak = 0;
    std::thread watch([&] {
      while (!done) {
        peak = std::max(peak, cache_dir_bytes(cache));
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    int code = -1;
    try {
      code = test_util::wait_exit(torchrun_harness::torchrun(cfg_or_dir, resume, sets, log, world).pid,
                                  std::chrono::seconds(300));
    } catch (...) {
      done = true;
      watch.join();
      throw;
    }
    done = true;
    watch.join();
    cache_peak[name] = peak;
    std::printf("%s on %d rank%s: %.1f s, cache peak %llu bytes\n", name.c_str(), world, world == 1 ? "" : "s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                static_cast<unsigned long long>(peak));
    INFO("output of " << name << ":\n" << test_util::read_file(log));
    REQUIRE(code == 0);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// No planted secret in any file under `dir` nor in the printed lines of `log`.
void check_no_secrets(const fs::path& dir, const fs::path& log) {
  std::vector<fs::path> files{log};
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  CHECK(files.size() > 3);
  for (const auto& f : files) {
    const std::string bytes = test_util::read_file(f);
    for (const std::string& s : {kSecret, kToken, kSignature}) CHECK_MESSAGE(!contains(bytes, s), f.string() << " holds " << s);
  }
}

// `got`'s steps from `from` on are `want`'s, bit for bit, and so are its evaluations.
void check_same(const fs::path& got_dir, const fs::path& want_dir, int64_t from, const std::string& what) {
  const Record got = read_record(got_dir), want = read_record(want_dir);
  REQUIRE_MESSAGE(got.steps.size() == static_cast<size_t>(kSteps), what);
  REQUIRE(want.steps.size() == static_cast<size_t>(kSteps));
  for (int64_t s = from; s <= kSteps; ++s) {
    CHECK_MESSAGE(got.steps.at(s).windows == want.steps.at(s).windows, what << ", step " << s);
    CHECK_MESSAGE(got.steps.at(s).loss == want.steps.at(s).loss, what << ", step " << s);
  }
  for (const auto& [step, loss] : want.val)
    if (step >= from) CHECK_MESSAGE((got.val.count(step) && got.val.at(step) == loss), what << ", val loss at step " << step);
}

// The run's fetch stage reported its figures: in stats.jsonl and in `pipeline stats`.
void check_fetch_figures(const fs::path& dir) {
  const std::string stats = test_util::read_file(dir / "stats.jsonl");
  CHECK(contains(stats, "\"name\":\"fetch\""));
  CHECK(contains(stats, "\"cache_bytes\":"));
  CHECK(contains(stats, "\"hit_rate\":"));
  const auto shown = test_util::shell(std::string(PIPELINE_EXE) + " stats " + dir.string() + " 2>&1");
  INFO(shown.out);
  CHECK(shown.code == 0);
  CHECK(contains(shown.out, "fetch (beside the graph):"));
}

void check_source(const std::string& source) {
  auto& f = fixture();
  const Source& src = f.sources.at(source);
  if (!src.missing.empty()) {
    MESSAGE(source << ": skipped (" << src.missing << ")");
    return;
  }
  const fs::path& local = f.run(source + "_local", source, src.local);
  const Record want = read_record(local);
  REQUIRE(want.steps.size() == static_cast<size_t>(kSteps));
  if (source == "shards") CHECK(want.val.size() == 2);  // steps 3 and 6
  if (f.rclone.missing.empty()) {
    const fs::path& s3 = f.run(source + "_s3", source, src.s3, 1, f.rclone.endpoint());
    check_same(s3, local, 1, source + " from S3 (rclone)");
    check_no_secrets(s3, f.root / (source + "_s3.log"));
    check_fetch_figures(s3);
    CHECK(f.cache_peak.at(source + "_s3") > 0);  // the run read through the cache
  } else {
    MESSAGE(source << " from S3: skipped (" << f.rclone.missing << ")");
  }
  if (f.nginx.missing.empty() && !src.https.empty()) {
    const fs::path& https = f.run(source + "_https", source, src.https);
    check_same(https, local, 1, source + " over HTTPS (nginx)");
    check_no_secrets(https, f.root / (source + "_https.log"));
  } else {
    MESSAGE(source << " over HTTPS: skipped (" << f.nginx.missing << ")");
  }
}

}  // namespace

TEST_CASE("a run from S3 and HTTPS trains as from the local copy: prepared block shards, with evaluation") {
  check_source("shards");
}

TEST_CASE("a run from S3 and HTTPS trains as from the local copy: llm.c shards (HTTPS: presigned URLs in a list)") {
  check_source("llmc");
}

TEST_CASE("a run from S3 and HTTPS trains as from the local copy: Parquet") { check_source("parquet"); }

TEST_CASE("a run from moto's S3 trains as from the local copy") {
  auto& f = fixture();
  SKIP_UNLESS(f.moto);
  REQUIRE(f.moto.upload("data", f.srv / "data"));
  const fs::path& run = f.run("shards_moto", "shards", "s3://data/shards", 1, f.moto.endpoint());
  check_same(run, f.run("shards_local", "shards", f.sources.at("shards").local), 1, "shards from S3 (moto)");
  check_no_secrets(run, f.root / "shards_moto.log");
}

TEST_CASE("faults between the run and S3 (resets mid-body, 503 bursts, an outage) change no loss") {
  auto& f = fixture();
  SKIP_UNLESS(f.rclone);
  remote_test::FaultProxy proxy(f.rclone.port);
  proxy.reset_next = 6;
  proxy.reset_after_bytes = 300;
  proxy.fail_next_503 = 4;
  // A second-long outage once the run is reading (its tenth connection), its open connections cut.
  std::atomic<bool> stop{false};
  std::thread outage([&] {
    while (!stop && proxy.connections.load() < 10) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    proxy.outage_until_ms = remote_test::FaultProxy::now_ms() + 1000;
    proxy.cut_all();
  });
  struct Joined {  // also when the run fails (REQUIRE throws)
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joined() {
      stop = true;
      t.join();
    }
  } joined{stop, outage};
  const fs::path& run =
      f.run("llmc_faults", "llmc", "s3://data/llmc", 1, "http://127.0.0.1:" + std::to_string(proxy.port()));
  CHECK(proxy.faulted.load() >= 10);
  check_same(run, f.run("llmc_local", "llmc", f.sources.at("llmc").local), 1, "llm.c from S3 through faults");
  check_no_secrets(run, f.root / "llmc_faults.log");
}

TEST_CASE("a run from S3 taken back to a checkpoint resumes as the uninterrupted one") {
  auto& f = fixture();
  SKIP_UNLESS(f.rclone);
  const fs::path& whole = f.run("shards_s3", "shards", "s3://data/shards", 1, f.rclone.endpoint());
  const fs::path part = torchrun_harness::stopped_copy(whole, f.root / "shards_s3_resumed", 2);
  f.launch(part, true, {}, f.root / "shards_s3_resumed.log", 1, f.root / "shards_s3_resumed_cache", "shards_s3_resumed");
  CHECK(contains(test_util::read_file(f.root / "shards_s3_resumed.log"), "s3://data/shards"));
  check_same(part, whole, 3, "shards from S3, resumed at step 2");
  check_no_secrets(part, f.root / "shards_s3_resumed.log");
}

TEST_CASE("two ranks under torchrun from S3 train as two ranks from the local copy") {
  auto& f = fixture();
  SKIP_UNLESS(f.rclone);
  if (torchrun_harness::kTorchrun.empty() || !fs::exists(torchrun_harness::kTorchrun)) {
    MESSAGE("skipped: no torchrun (set-up's torch venv)");
    return;
  }
  const fs::path& local = f.run("shards_local_w2", "shards", f.sources.at("shards").local, 2);
  const fs::path& s3 = f.run("shards_s3_w2", "shards", "s3://data/shards", 2, f.rclone.endpoint());
  check_same(s3, local, 1, "shards from S3 on 2 ranks");
  // The same rows as one process (the lanes order), whatever the reduction's rounding.
  const Record one = read_record(f.run("shards_local", "shards", f.sources.at("shards").local));
  const Record two = read_record(s3);
  for (int64_t s = 1; s <= kSteps; ++s) CHECK(two.steps.at(s).windows == one.steps.at(s).windows);
  check_no_secrets(s3, f.root / "shards_s3_w2.log");
}

TEST_CASE("the cache directory never holds more than cache_bytes plus one unit, and the run trains as from disk") {
  auto& f = fixture();
  SKIP_UNLESS(f.rclone);
  const fs::path& local = f.run("big_local", "big", f.sources.at("big").local);
  const fs::path& s3 = f.run("big_s3", "big", "s3://data/big", 1, f.rclone.endpoint());
  check_same(s3, local, 1, "llm.c shards of 64 KiB units from S3 under a 1 MiB cap");
  const uint64_t peak = f.cache_peak.at("big_s3");
  MESSAGE("cache peak " << peak << " bytes, cap " << kCacheBytes << ", a unit " << kBigUnitBytes);
  CHECK(peak <= kCacheBytes + kBigUnitBytes);
  CHECK(peak >= kCacheBytes * 3 / 4);  // the fetch threads, wanting 60 units, filled it to the cap
  check_no_secrets(s3, f.root / "big_s3.log");
}
