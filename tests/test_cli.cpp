// Tests of the `pipeline` command as a user runs it: help and version, `check` and its errors,
// `tokenize` parity from outside, a short `run` then `generate` and `eval`, and checkpoint atomicity when the
// process is killed with SIGKILL while it writes checkpoints, and the live server (--serve).
#include <doctest/doctest.h>

#include "graph/stage.h"
#include "test_util.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

using test_util::contains;

test_util::ShellResult sh(const std::string& args) { return test_util::shell(std::string(PIPELINE_EXE) + " " + args); }

fs::path temp_dir(const std::string& tag) { return test_util::fresh_dir("cli", tag); }

const std::string kQuick = std::string(PIPELINE_SOURCE_DIR) + "/pipelines/quickstart.toml";

// A tmpfs at `dir` for the test's scope (mounting needs CAP_SYS_ADMIN: root in CI and here);
// `ok` false where it could not be mounted (errno says why).
struct TmpfsMount {
  fs::path dir;
  bool ok;
  TmpfsMount(fs::path d, unsigned long flags, const char* options)
      : dir(std::move(d)), ok(::mount("tmpfs", dir.c_str(), "tmpfs", flags, options) == 0) {}
  ~TmpfsMount() {
    if (ok) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

}  // namespace

TEST_CASE("version, help and unknown commands") {
  auto v = sh("--version");
  CHECK(v.code == 0);
  CHECK(contains(v.out, "pipeline 0."));
  auto h = sh("--help");
  CHECK(h.code == 0);
  for (const char* c : {"run", "check", "stages", "graph", "stats", "prepare", "tokenize", "generate", "eval"})
    CHECK(contains(h.out, c));
  auto rh = sh("run --help");
  CHECK(rh.code == 0);
  CHECK(contains(rh.out, "--resume"));
  auto u = sh("frobnicate");
  CHECK(u.code == 2);
  CHECK(contains(u.out, "unknown command 'frobnicate'"));
}

TEST_CASE("check prints the resolved settings, and every error names its key") {
  auto ok = sh("check " + kQuick + " --set training.steps=7");
  CHECK(ok.code == 0);
  CHECK(contains(ok.out, "training.steps"));
  CHECK(contains(ok.out, "--set"));
  CHECK(contains(ok.out, "stages.tokenize.workers"));
  CHECK(contains(ok.out, "ok:"));

  auto bare = sh("check quickstart.toml");  // a bare name is looked up in pipelines/
  CHECK(bare.code == 0);

  auto range = sh("check " + kQuick + " --set training.steps=0");
  CHECK(range.code != 0);
  CHECK(contains(range.out, "training.steps"));
  CHECK(contains(range.out, "got 0"));

  auto key = sh("check " + kQuick + " --set optimizer.learning_rate=1");
  CHECK(key.code != 0);
  CHECK(contains(key.out, "unknown key 'learning_rate'"));

  auto dir = temp_dir("check");
  std::ofstream(dir / "bad.toml") << test_util::read_file(kQuick) << "\n[stages.spin]\ntype = \"spin\"\ninput = \"pack\"\nmsec = 3\n";
  auto opt = sh("check " + (dir / "bad.toml").string());
  CHECK(opt.code != 0);
  CHECK(contains(opt.out, "bad.toml:"));
  CHECK(contains(opt.out, "msec"));

  auto missing = sh("check nosuch.toml");
  CHECK(missing.code != 0);
  CHECK(contains(missing.out, "nosuch.toml: config file not found"));
  fs::remove_all(dir);
}

TEST_CASE("commands that need no tensors never load LibTorch or CUDA, and still know every stage type") {
  // LD_DEBUG=files makes the dynamic loader name, on stderr, every object it loads. Nor do they
  // load Arrow: it is loaded only when a Parquet file is read (the test below).
  auto dir = temp_dir("light");
  const std::string data = PIPELINE_REFERENCE_DATA_DIR;
  auto loads_torch = [](const std::string& out) {
    return contains(out, "libtorch") || contains(out, "libc10") || contains(out, "libcuda") || contains(out, "libcudart");
  };
  for (const std::string& args :
       {std::string("--version"), std::string("--help"), std::string("run --help"), std::string("stages"),
        std::string("check gpt2.toml"), std::string("check quickstart.toml --set model.preset=gpt2-xl"),
        std::string("graph quickstart.toml"), "tokenize " + data + "/edge_cases.txt --out " + (dir / "ids.u16").string(),
        "prepare " + data + "/edge_cases.txt --quiet --out " + (dir / "ds").string(),
        "stats " + (dir / "no_such_run").string()}) {
    auto r = test_util::shell("LD_DEBUG=files " + std::string(PIPELINE_EXE) + " " + args);
    INFO(args);
    CHECK(contains(r.out, "file="));  // the loader did report (else the check below proves nothing)
    CHECK(!loads_torch(r.out));
    CHECK(!contains(r.out, "libarrow"));
    CHECK(!contains(r.out, "libparquet"));
  }
  // The control: a command that needs tensors loads them, and the check above sees it.
  auto g = test_util::shell("LD_DEBUG=files " + std::string(PIPELINE_EXE) + " generate --checkpoint " +
                            (dir / "nothing.ckpt").string());
  CHECK(loads_torch(g.out));

  // The executable knows the training stages from their declarations alone; this test links their
  // implementations, and the two lists must be the same, every type implemented.
  auto listed = sh("stages --brief");
  REQUIRE(listed.code == 0);
  std::set<std::string> names;
  std::istringstream lines(listed.out);
  for (std::string line; std::getline(lines, line);) names.insert(line);
  // (the test_* types are graph/'s built-in test stages, and this program's own)
  std::set<std::string> linked;
  for (const auto* t : pipeline::graph::stage_types()) {
    INFO(t->name);
    CHECK(t->factory);
    if (t->name.rfind("test_", 0) != 0) linked.insert(t->name);
  }
  std::erase_if(names, [](const std::string& n) { return n.rfind("test_", 0) == 0; });
  CHECK(linked.count("train") == 1);
  CHECK(names == linked);
  fs::remove_all(dir);
}

TEST_CASE("Parquet input: prepare and a short run read it, loading Arrow's module only then") {
  const std::string python = PIPELINE_ARROW_PYTHON;
  if (python.empty()) {
    MESSAGE("no Python with pyarrow configured: skipped");
    return;
  }
  auto dir = temp_dir("parquet");
  const fs::path file = dir / "docs.parquet";
  // Row groups of 20: 10 units, enough for the quick start's 8 lanes (docs/data_order.md).
  auto w = test_util::shell(python +
                            " -c \"import pyarrow as pa, pyarrow.parquet as pq; "
                            "pq.write_table(pa.table({'text': ['document %d: ' % i + 'the quick brown fox ' * 20 "
                            "for i in range(200)]}), '" + file.string() + "', row_group_size=20)\"");
  INFO(w.out);
  REQUIRE(w.code == 0);
  // `prepare` in the executable, with the loader watched: Arrow comes in through the module.
  auto p = test_util::shell("LD_DEBUG=files " + std::string(PIPELINE_EXE) + " prepare " + file.string() +
                            " --quiet --out " + (dir / "ds").string());
  CHECK(p.code == 0);
  CHECK(contains(p.out, "libpipeline_parquet.so"));
  CHECK(contains(p.out, "libarrow"));
  CHECK(fs::exists(dir / "ds" / "manifest.json"));
  // `run` in the LibTorch half, which loads the same module through its own copy of the reader.
  auto r = sh("run " + kQuick + " --set data.dataset=" + file.string() +
              " --set model.preset=tiny --set training.steps=2 --set training.seq_len=32 --set eval.every=0" +
              " --set checkpoint.at_end=false --set run.dir=" + (dir / "r").string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "done: 2 steps"));
  fs::remove_all(dir);
}

TEST_CASE("tokenize matches the reference ids from outside, and decodes back") {
  auto dir = temp_dir("tok");
  const std::string data = PIPELINE_REFERENCE_DATA_DIR;
  auto enc = sh("tokenize " + data + "/edge_cases.txt --out " + (dir / "ids.u16").string());
  REQUIRE(enc.code == 0);
  CHECK(test_util::read_file(dir / "ids.u16") == test_util::read_file(data + "/edge_cases.gpt2.u16"));
  auto dec = sh("tokenize --decode " + (dir / "ids.u16").string() + " --out " + (dir / "back.txt").string());
  REQUIRE(dec.code == 0);
  CHECK(test_util::read_file(dir / "back.txt") == test_util::read_file(data + "/edge_cases.txt"));
  auto none = sh("tokenize " + (dir / "missing.txt").string());
  CHECK(none.code != 0);
  CHECK(contains(none.out, "missing.txt"));
  fs::remove_all(dir);
}

TEST_CASE("a short run, its stats, and generate and eval from its checkpoint") {
  auto dir = temp_dir("run");
  auto run_dir = dir / "r";
  auto r = sh("run " + kQuick + " --set model.preset=tiny --set training.steps=4 --set training.seq_len=32 " +
              "--set eval.every=2 --set eval.batches=1 --set eval.sample_tokens=4 --set run.dir=" + run_dir.string() +
              " --set logging.every=1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(contains(r.out, "step      4/4"));
  CHECK(contains(r.out, "val loss"));
  CHECK(contains(r.out, "bottleneck"));
  CHECK(contains(r.out, "done: 4 steps"));
  CHECK(!contains(r.out, "estimate:"));  // a small model on the CPU is what the quick start does
  for (const char* f : {"config.toml", "metrics.jsonl", "stats.jsonl", "stats_summary.json", "trace.json"})
    CHECK(fs::exists(run_dir / f));
  auto st = sh("stats " + run_dir.string());
  CHECK(st.code == 0);
  CHECK(contains(st.out, "train"));
  auto g = sh("generate --checkpoint " + run_dir.string() + " --prompt 'ROMEO:' --tokens 5 --temperature 0");
  INFO(g.out);
  CHECK(g.code == 0);
  CHECK(contains(g.out, "ROMEO:"));
  auto bad = sh("generate --checkpoint " + (dir / "nothing.ckpt").string());
  CHECK(bad.code != 0);
  CHECK(contains(bad.out, "nothing.ckpt"));
  // The checkpoint may come first without its flag (as export takes it); options are checked.
  auto positional = sh("generate " + run_dir.string() + " --prompt 'ROMEO:' --tokens 5 --temperature 0");
  CHECK(positional.code == 0);
  CHECK(positional.out == g.out);  // greedy: the same continuation
  for (const char* opt : {"--temperature -1", "--temperature nan", "--tokens 2.5", "--top-k -3"}) {
    auto r = sh("generate " + run_dir.string() + " " + opt);
    INFO(opt << ": " << r.out);
    CHECK(r.code != 0);
    CHECK(contains(r.out, std::string(opt).substr(0, std::string(opt).find(' ')) + ": expected "));
  }

  // eval --val: the loss over every whole window of the split, the same whatever the batch size
  // (windows are cut as pack cuts them, the last target carried into the next batch).
  const std::string val = std::string(PIPELINE_SOURCE_DIR) + "/datasets/data/tinyshakespeare/text";
  // One thread: on a loaded machine, two OpenMP threads that wait for each other at every small
  // operation of the tiny model took 8 times as long.
  auto loss_of = [&](const std::string& args) {
    auto e = sh("eval " + run_dir.string() + " --val " + val + " --threads 1 " + args);
    INFO(args << ": " << e.out);
    REQUIRE(e.code == 0);
    double loss = 0;
    long long tokens = 0;
    REQUIRE(std::sscanf(e.out.substr(e.out.find("val loss ")).c_str(), "val loss %lf tokens %lld", &loss, &tokens) == 2);
    return std::pair(loss, tokens);
  };
  const auto [loss8, tokens8] = loss_of("--batch-size 8");
  const auto [loss3, tokens3] = loss_of("--batch-size 3 --seq-len 64");  // 64: the default, given
  CHECK(tokens8 == tokens3);
  CHECK(tokens8 % 64 == 0);  // windows of the model's context (the tiny preset's 64)
  CHECK(tokens8 > 30000);    // the whole split (33,6xx tokens), not a few batches
  CHECK(std::abs(loss8 - loss3) < 1e-4);
  CHECK(loss8 > 5);
  CHECK(loss8 < 12);

  // eval's errors: what is missing or malformed is named, before any model is read.
  auto none = sh("eval " + run_dir.string());
  CHECK(none.code != 0);
  CHECK(contains(none.out, "nothing to evaluate: give --hellaswag FILE and/or --val DATASET"));
  const fs::path bad_items = dir / "items.jsonl";
  test_util::write_file(bad_items, "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}\n"
                                   "{\"ctx\": \"c\", \"endings\": [\"a\"], \"label\": 0}\n");
  auto malformed = sh("eval " + (dir / "no-model").string() + " --hellaswag " + bad_items.string());
  CHECK(malformed.code == 1);
  CHECK(contains(malformed.out, bad_items.string() + ":2: field 'endings': expected an array of 4 strings"));
  auto missing = sh("eval " + run_dir.string() + " --hellaswag " + (dir / "none.jsonl").string());
  CHECK(contains(missing.out, (dir / "none.jsonl").string() + ": cannot open"));
  // The tiny preset's context (64) cannot hold every ending of the test items whole.
  auto too_long = sh("eval " + run_dir.string() + " --hellaswag " + std::string(PIPELINE_SOURCE_DIR) +
                     "/tests/data/hellaswag/val_every50.jsonl");
  CHECK(too_long.code == 1);
  CHECK(contains(too_long.out, "val_every50.jsonl:120: ending 3 has 70 tokens; a model with a context of 64 tokens scores endings of up to 64"));
  auto options = sh("eval " + run_dir.string() + " --val " + val + " --items 3");
  CHECK(contains(options.out, "--items and --predictions need --hellaswag FILE"));
  fs::remove_all(dir);
}

TEST_CASE("[eval] hellaswag: a missing or malformed file is an error before the run trains") {
  auto dir = temp_dir("hellaswag");
  const std::string base = "run " + kQuick + " --set training.steps=4 --set training.seq_len=32 --set eval.every=2 " +
                           "--set eval.batches=1 --set eval.sample_tokens=0 --set run.dir=";
  // The path is checked with the config (pipeline check says it too), naming the key.
  auto missing = sh("check " + kQuick + " --set eval.hellaswag=\"" + (dir / "none.jsonl").string() + "\"");
  CHECK(missing.code != 0);
  CHECK(contains(missing.out, "[eval] hellaswag"));
  CHECK(contains(missing.out, "no file at '" + (dir / "none.jsonl").string() + "'"));
  const fs::path items = dir / "items.jsonl";
  test_util::write_file(items, "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}\n");
  auto never = sh("check " + kQuick + " --set eval.every=0 --set eval.hellaswag=\"" + items.string() + "\"");
  CHECK(never.code != 0);
  CHECK(contains(never.out, "nothing says when to score it"));
  // The items are read and checked while the graph is built: no step is trained.
  test_util::write_file(items, "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}\n"
                               "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 7}\n");
  auto bad = sh(base + (dir / "bad").string() + " --set eval.hellaswag=\"" + items.string() + "\"");
  INFO(bad.out);
  CHECK(bad.code != 0);
  CHECK(contains(bad.out, items.string() + ":2: field 'label': expected 0, 1, 2 or 3, got the number 7"));
  CHECK(!contains(bad.out, "step      1/4"));
  // A good file: scored with every evaluation, HellaSwag alone every hellaswag_every steps.
  test_util::write_file(items, "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}\n"
                               "{\"ctx\": \"The cat\", \"endings\": [\"sat.\", \"ran.\", \"flew.\", \"slept.\"], \"label\": \"3\"}\n");
  auto good = sh(base + (dir / "good").string() + " --set model.preset=tiny --set eval.every=4 --set eval.hellaswag_every=1 " +
                 "--set eval.hellaswag=\"" + items.string() + "\"");
  INFO(good.out);
  REQUIRE(good.code == 0);
  CHECK(contains(good.out, "eval  step 1 | hellaswag acc_norm "));
  CHECK(contains(good.out, "eval  step 4 | val loss "));
  const std::string metrics = test_util::read_file(dir / "good" / "metrics.jsonl");
  CHECK(contains(metrics, "{\"step\":2,\"hellaswag_acc_norm\":"));
  CHECK(contains(metrics, ",\"hellaswag_items\":2"));
  auto st = sh("stats " + (dir / "good").string());
  CHECK(contains(st.out, "evaluations (metrics.jsonl):"));
  CHECK(contains(st.out, "hellaswag acc_norm "));
  fs::remove_all(dir);
}

TEST_CASE("a run started with stdout and stderr closed keeps its files clean and its log whole") {
  // A closed descriptor would be the next file's number: what the run prints went into metrics.jsonl.
  auto dir = temp_dir("closed");
  auto run_dir = dir / "r";
  auto r = test_util::shell("(" + std::string(PIPELINE_EXE) + " run " + kQuick +
                            " --set model.preset=tiny --set training.steps=3 --set training.seq_len=32 --set eval.every=2 "
                            "--set eval.batches=1 --set eval.sample_tokens=4 --set logging.every=1 --set run.dir=" +
                            run_dir.string() + " >&- 2>&- <&-)");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.empty());
  for (const char* f : {"metrics.jsonl", "stats.jsonl"}) {
    std::ifstream in(run_dir / f);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      ++lines;
      CHECK_MESSAGE(line.rfind("{", 0) == 0, f << ": " << line);
    }
    CHECK(lines >= (std::string(f) == "metrics.jsonl" ? 3 : 1));  // a line per step; stats at least at the end
  }
  const auto log = test_util::read_file(run_dir / "run.log");
  CHECK(contains(log, "val loss"));
  CHECK(contains(log, "done: 3 steps"));
  fs::remove_all(dir);
}

TEST_CASE("a dataset whose validation split is empty: the error says how to get one, or to train without") {
  auto dir = temp_dir("noval");
  { std::ofstream(dir / "one.txt") << "a single short document\n"; }
  auto p = sh("prepare " + (dir / "one.txt").string() + " --out " + (dir / "ds").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  auto r = sh("run " + kQuick + " --set model.preset=tiny --set training.seq_len=32 --set training.steps=2 " +
              "--set run.dir=" + (dir / "r").string() + " --set data.dataset=\"" + (dir / "ds").string() + "\"" +
              " --set data.lanes=1");  // one block for training: one lane (with 8, read says so first)
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(contains(r.out, "stage 'eval': building: " + (dir / "ds").string() + ": the 'val' split holds no data: prepare "
                        "it with a larger --val-fraction, or turn evaluation off with [eval] every = 0"));
  CHECK(!fs::exists(dir / "r"));  // nothing left behind
}

TEST_CASE("a large model on the CPU: a warning at start-up, then an estimate of the run's length") {
  // check names the device the config asks for; a small model gets no warning.
  auto big = sh("check gpt2.toml --set run.device=cpu");
  CHECK(big.code == 0);
  CHECK(contains(big.out, "warning: this run trains a model of 124.5M parameters on the CPU"));
  CHECK(contains(big.out, "pipelines/quickstart.toml"));
  auto small = sh("check quickstart.toml --set run.device=cpu");
  CHECK(small.code == 0);
  CHECK(!contains(small.out, "warning: this run trains"));

  // A run: one wide layer puts the model over 50M parameters (the vocabulary embedding) while a
  // step of 1 x 8 tokens stays cheap. It is not refused.
  auto dir = temp_dir("cpu");
  auto r = sh("run " + kQuick + " --set model.n_layer=1 --set model.n_head=16 --set model.n_embd=1024 " +
              "--set training.batch_size=1 --set training.seq_len=8 --set training.steps=4 --set eval.every=0 " +
              "--set checkpoint.at_end=false --set logging.live=off --set logging.every=1 --set run.device=cpu --set run.dir=" +
              (dir / "r").string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "M parameters on the CPU"));
  const auto estimate = r.out.find("estimate: 4 steps at ");
  CHECK(estimate != std::string::npos);
  CHECK(r.out.find("a step on the CPU take about", estimate) != std::string::npos);
  CHECK(r.out.find("step      3/4") < estimate);  // after the first steps, once
  CHECK(r.out.find("estimate:", estimate + 1) == std::string::npos);
  CHECK(contains(r.out, "done: 4 steps"));
  fs::remove_all(dir);
}

TEST_CASE("a process killed while writing checkpoints never leaves a half-written one to load") {
  auto dir = temp_dir("kill");
  auto run_dir = dir / "r";
  // small-cpu's checkpoint is ~87 MB, so much of each step is spent writing: a kill is likely to
  // land mid-write. Whatever the moment, every .ckpt present must load.
  std::string args = "run " + kQuick + " --set model.preset=small-cpu --set training.steps=1000 " +
                     "--set training.batch_size=1 --set training.seq_len=16 --set checkpoint.every=1 " +
                     "--set checkpoint.keep=3 --set eval.every=0 --set logging.live=off --set run.dir=" + run_dir.string();
  for (int round = 0; round < 3; ++round) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::string cmd = round == 0 ? std::string(PIPELINE_EXE) + " " + args
                                   : std::string(PIPELINE_EXE) + " run --resume " + run_dir.string();
      cmd += " > /dev/null 2>&1";
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait until at least two checkpoints more exist, then kill at a moment that varies by round.
    auto count = [&] {
      int n = 0;
      if (fs::is_directory(run_dir / "checkpoints"))
        for (const auto& e : fs::directory_iterator(run_dir / "checkpoints")) n += e.path().extension() == ".ckpt";
      return n;
    };
    auto t0 = std::chrono::steady_clock::now();
    while (count() < 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(150 * round + 70));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(count() >= 1);
    for (const auto& e : fs::directory_iterator(run_dir / "checkpoints")) {
      if (e.path().extension() != ".ckpt") continue;  // a *.tmp may be left behind: never loaded
      auto g = sh("generate --checkpoint " + e.path().string() + " --tokens 1");
      INFO(e.path().string() << ": " << g.out);
      CHECK(g.code == 0);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("a run directory that cannot be made: the error names it, and says how to choose another") {
  auto dir = temp_dir("rodir");
  auto ro = dir / "ro";
  fs::create_directories(ro);
  TmpfsMount mount(ro, MS_RDONLY, nullptr);
  if (!mount.ok) {
    MESSAGE("not run: cannot mount a tmpfs here (" << std::strerror(errno) << ")");
    fs::remove_all(dir);
    return;
  }
  const std::string args = " run " + kQuick + " --set model.preset=tiny --set training.seq_len=32 --set training.steps=2";
  // The default, runs/<name>-<timestamp> under the current directory.
  auto r = test_util::shell("cd " + ro.string() + " && " + PIPELINE_EXE + args);
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(contains(r.out, "cannot create the run directory runs/quickstart-"));
  CHECK(contains(r.out, "Read-only file system (it is made under the current directory: choose another with --set run.dir=PATH)"));
  auto named = sh(args + " --set run.dir=" + (ro / "x").string());
  CHECK(named.code == 1);
  CHECK(contains(named.out, "cannot create the run directory " + (ro / "x").string() + ": Read-only file system"));
  CHECK(!contains(named.out, "choose another"));
}

TEST_CASE("a run directory in use by another process is refused, naming the holder; free again once it ends") {
  auto dir = temp_dir("locked");
  auto run_dir = dir / "r";
  fs::create_directories(run_dir);
  // This test process stands in for a run still going: it holds the directory's lock.
  const int fd = ::open((run_dir / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const std::string me = "pid " + std::to_string(::getpid()) + " on host test";
  REQUIRE(::pwrite(fd, me.data(), me.size(), 0) == static_cast<ssize_t>(me.size()));
  const std::string args = "run " + kQuick + " --set model.preset=tiny --set training.seq_len=32 --set training.steps=2 " +
                           "--set eval.every=0 --set run.dir=" + run_dir.string();
  auto refused = sh(args);
  INFO(refused.out);
  CHECK(refused.code == 1);
  CHECK(contains(refused.out, "run directory " + run_dir.string() + " is in use by another process (" + me + ")"));
  CHECK(!fs::exists(run_dir / "config.toml"));  // it wrote nothing there
  ::close(fd);  // the other run ended
  auto ran = sh(args);
  INFO(ran.out);
  CHECK(ran.code == 0);
  CHECK(contains(ran.out, "done: 2 steps"));
  // Its own lock went with it: a resume takes the directory again.
  auto resumed = sh("run --resume " + run_dir.string() + " --set training.steps=3");
  INFO(resumed.out);
  CHECK(resumed.code == 0);
  CHECK(contains(resumed.out, "done: 3 steps"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoints on a full disk, then on a read-only one: clear errors, resumable runs") {
  // run_dir/checkpoints is a small tmpfs (mounting needs CAP_SYS_ADMIN: root in CI and here): the
  // tiny model's first checkpoint fits, a second one does not.
  auto dir = temp_dir("diskfull");
  auto run_dir = dir / "r";
  auto ckpt_dir = run_dir / "checkpoints";
  fs::create_directories(ckpt_dir);
  TmpfsMount mount(ckpt_dir, 0, "size=60m");
  if (!mount.ok) {
    MESSAGE("not run: cannot mount a tmpfs here (" << std::strerror(errno) << "); test_io_faults covers the same paths with RLIMIT_FSIZE");
    fs::remove_all(dir);
    return;
  }
  const std::string common = "--set model.preset=tiny --set training.seq_len=32 --set eval.every=0 --set logging.live=off ";
  auto r = sh("run " + kQuick + " " + common + "--set training.steps=8 --set checkpoint.every=4 --set checkpoint.keep=2 " +
              "--set run.dir=" + run_dir.string());
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(contains(r.out, "checkpoint of step 8 not written"));
  CHECK(contains(r.out, "No space left on device"));
  CHECK(contains(r.out, "continue with: pipeline run --resume " + run_dir.string()));
  CHECK(!fs::exists(ckpt_dir / "step_00000008.ckpt.tmp"));
  auto g = sh("generate --checkpoint " + (ckpt_dir / "step_00000004.ckpt").string() + " --tokens 1");
  CHECK(g.code == 0);

  // Read-only now: with on_error = "warn" the resumed run trains to the end and says so.
  REQUIRE(::mount("tmpfs", ckpt_dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0);
  auto w = sh("run --resume " + run_dir.string() + " --set checkpoint.on_error=warn");
  INFO(w.out);
  CHECK(w.code == 0);
  CHECK(contains(w.out, "warning: checkpoint of step 8 not written"));
  CHECK(contains(w.out, "Read-only file system"));
  CHECK(contains(w.out, "done: 8 steps; checkpoint " + (ckpt_dir / "step_00000004.ckpt").string()));
  g = sh("generate --checkpoint " + (ckpt_dir / "step_00000004.ckpt").string() + " --tokens 1");
  CHECK(g.code == 0);
  ::umount2(ckpt_dir.c_str(), MNT_DETACH);
  fs::remove_all(dir);
}

TEST_CASE("--resume auto: starts a run, continues it from its newest checkpoint that reads back, refuses without [run] dir") {
  auto dir = temp_dir("auto");
  const auto run_dir = dir / "run";
  const std::string common = "--set model.preset=tiny --set training.seq_len=32 --set eval.every=0 --set logging.live=off "
                             "--set checkpoint.every=2 --set run.dir=" + run_dir.string() + " ";
  // No run yet: auto starts one (check says so first).
  auto c = sh("check " + kQuick + " " + common + "--resume auto");
  INFO(c.out);
  CHECK(c.code == 0);
  CHECK(contains(c.out, "holds no checkpoint yet; the run starts there"));
  // The settings table shows the resume mode the run goes by, and that the command line set it.
  auto resume_row = [](const std::string& out) {
    const auto at = out.find("| run.resume ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  CHECK(contains(resume_row(c.out), "\"auto\""));
  CHECK(contains(resume_row(c.out), "| --resume auto "));
  auto first = sh("run " + kQuick + " " + common + "--set training.steps=4 --resume auto");
  INFO(first.out);
  REQUIRE(first.code == 0);
  CHECK(contains(resume_row(first.out), "\"auto\""));
  CHECK(contains(resume_row(first.out), "| --resume auto "));
  CHECK(!contains(first.out, "resuming from"));
  CHECK(contains(first.out, "done: 4 steps"));
  // The same command with more steps continues at step 4 ([run] resume in the file works the same).
  auto second = sh("run " + kQuick + " " + common + "--set training.steps=6 --set run.resume=auto");
  INFO(second.out);
  REQUIRE(second.code == 0);
  CHECK(contains(second.out, "resuming from " + (run_dir / "checkpoints" / "step_00000004.ckpt").string() + " at step 4"));
  CHECK(contains(second.out, "done: 6 steps"));
  // A newest checkpoint that does not read back whole (a disk error) is named and passed over.
  const auto newest = run_dir / "checkpoints" / "step_00000006.ckpt";
  REQUIRE(fs::exists(newest));
  fs::resize_file(newest, fs::file_size(newest) / 2);
  // An explicit --resume names this run: the damaged newest is an error, which offers the older one.
  auto named = sh("run --resume " + run_dir.string());
  INFO(named.out);
  CHECK(named.code == 1);
  CHECK(contains(named.out, newest.string() + "': header promises"));
  CHECK(contains(named.out, "The run holds an older checkpoint, " + (run_dir / "checkpoints" / "step_00000004.ckpt").string()));
  CHECK(contains(named.out, "mv " + newest.string() + " " + newest.string() + ".damaged"));
  auto third = sh("run " + kQuick + " " + common + "--set training.steps=8 --resume auto");
  INFO(third.out);
  CHECK(third.code == 0);
  CHECK(contains(third.out, "passing over " + newest.string()));
  CHECK(contains(third.out, "resuming from " + (run_dir / "checkpoints" / "step_00000004.ckpt").string() + " at step 4"));
  CHECK(contains(third.out, "done: 8 steps"));
  // Without [run] dir there is nothing to find again; without a config there is no [run] dir.
  auto nodir = sh("run " + kQuick + " --set model.preset=tiny --set training.seq_len=32 --resume auto");
  CHECK(nodir.code != 0);
  CHECK(contains(nodir.out, "--resume auto needs [run] dir"));
  auto keynodir = sh("check " + kQuick + " --set run.resume=auto");
  CHECK(keynodir.code != 0);
  CHECK(contains(keynodir.out, "[run] resume: \"auto\" needs [run] dir"));
  auto noconfig = sh("run --resume auto");
  CHECK(noconfig.code != 0);
  CHECK(contains(noconfig.out, "--resume auto needs a CONFIG"));
  // Without auto, a [run] dir with checkpoints is still refused, and auto is offered.
  auto refused = sh("run " + kQuick + " " + common + "--set training.steps=8");
  CHECK(refused.code != 0);
  CHECK(contains(refused.out, "already holds a run with checkpoints"));
  CHECK(contains(refused.out, "--resume auto"));
  fs::remove_all(dir);
}

namespace {

// A listening socket on a free loopback port, held while alive: a port in use.
struct HeldPort {
  int fd = -1, port = 0;
  HeldPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~HeldPort() { ::close(fd); }
};

// GET path from 127.0.0.1:port, the body of a 200 answer or "" (every wait bounded).
std::string http_body(int port, const std::string& path) {
  auto r = test_util::shell("timeout 20 python3 -c \"import urllib.request,sys; "
                            "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:" +
                            std::to_string(port) + path + "', timeout=10).read().decode())\"");
  return r.code == 0 ? r.out : "";
}

}  // namespace

TEST_CASE("--serve: the live server of a run, a port in use, and the finished run's page") {
  auto dir = temp_dir("serve");
  const std::string common = kQuick + " --set model.preset=tiny --set training.seq_len=32 --set eval.every=0 " +
                             "--set logging.live=off --set checkpoint.at_end=false ";
  for (const char* bad : {"99999", "abc", "1.2.3.4:"}) {  // refused as an argument: nothing planned, nothing made
    auto r = sh("run " + common + "--set run.dir=" + (dir / "bad").string() + " --serve " + bad);
    INFO(r.out);
    CHECK(r.code != 0);
    CHECK(contains(r.out, std::string("pipeline run: error: --serve: '") + bad + "'"));
    CHECK(!contains(r.out, "run.dir"));  // no settings table
    CHECK(!fs::exists(dir / "bad"));
  }
  {
    HeldPort busy;
    auto r = sh("run " + common + "--set training.steps=4 --set run.dir=" + (dir / "busy").string() + " --serve " +
                std::to_string(busy.port));
    INFO(r.out);
    CHECK(r.code != 0);
    CHECK(contains(r.out, "cannot serve the live page on 127.0.0.1:" + std::to_string(busy.port)));
    CHECK_FALSE(fs::exists(dir / "busy"));  // stopped before the run started
  }
  {
    // Another address is explicit, and warned about (this one is not on the machine: no bind).
    auto r = sh("run " + common + "--set training.steps=4 --set run.dir=" + (dir / "far").string() +
                " --serve 192.0.2.1:0");
    INFO(r.out);
    CHECK(r.code != 0);
    CHECK(contains(r.out, "warning: the live server listens on 192.0.2.1:0"));
    CHECK(contains(r.out, "cannot serve the live page on 192.0.2.1:0"));
    auto bad = sh("run " + common + "--serve 80800");
    CHECK(bad.code != 0);
    CHECK(contains(bad.out, "--serve: '80800': the port must be a number from 0 to 65535"));
    auto cfg = sh("check " + common + "--set logging.http=nowhere:1");
    CHECK(cfg.code != 0);
    CHECK(contains(cfg.out, "http"));
  }
  // A run serving on a free port: its page, snapshots with the training figures, /metrics.
  const auto run_dir = dir / "r";
  const auto log = dir / "out.txt";
  std::atomic<bool> finished{false};
  std::thread run([&] {
    test_util::shell(std::string(PIPELINE_EXE) + " run " + common + "--set training.steps=300 --set run.dir=" +
                     run_dir.string() + " --serve 0 > " + log.string() + " 2>&1");
    finished = true;
  });
  int port = 0;
  std::string snapshot, metrics, page;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (std::chrono::steady_clock::now() < end) {
    std::string out = test_util::read_file(log);
    if (auto at = out.find("live page: http://127.0.0.1:"); port == 0 && at != std::string::npos)
      port = std::atoi(out.c_str() + at + std::strlen("live page: http://127.0.0.1:"));
    if (port > 0) {
      if (page.empty()) page = http_body(port, "/");
      std::string s = http_body(port, "/api/snapshot");
      if (contains(s, "\"train\":{") && contains(s, "\"loss\":") && contains(s, "\"status\":\"running\"")) {
        snapshot = s;
        metrics = http_body(port, "/metrics");
        break;
      }
    }
    // The run's own end, not a word in its output (the settings table prints "on_error").
    if (finished) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  run.join();
  const std::string out = test_util::read_file(log);
  INFO(out);
  REQUIRE(port > 0);
  CHECK(contains(page, "<svg id=\"graph\""));
  REQUIRE_FALSE(snapshot.empty());
  CHECK(contains(metrics, "pipeline_train_loss{rank=\"0\"} "));
  CHECK(contains(metrics, "pipeline_stage_busy_seconds_total{stage=\"train\",rank=\"0\"} "));
  // What was served is what stats.jsonl holds.
  const std::string jsonl = test_util::read_file(run_dir / "stats.jsonl");
  CHECK(contains(jsonl, snapshot + "\n"));
  CHECK(contains(jsonl, "\"train\":{\"step\":300,"));
  CHECK(contains(out, "done: 300 steps"));
  // The finished run's page, standing alone.
  auto st = sh("stats " + run_dir.string() + " --html " + (dir / "run.html").string());
  INFO(st.out);
  CHECK(st.code == 0);
  const std::string html = test_util::read_file(dir / "run.html");
  CHECK(contains(html, "<script id=\"run-data\" type=\"application/json\">{\"title\":\"r\",\"series\":[{"));
  CHECK(contains(html, "\"name\":\"train\""));
  const std::string svg = test_util::read_file(run_dir / "occupancy.svg");
  CHECK(contains(svg, "The stage graph"));
  CHECK(contains(svg, "seconds since the run started"));
  fs::remove_all(dir);
}
