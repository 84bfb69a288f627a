// `pipeline check` as a dry run of `pipeline run`, from outside, as a new user meets it: the
// configs run refuses, check refuses too (a tokens dataset read as text, Parquet without its
// text column or without an evaluation source, in the lanes order K against the step's rows, too
// few units for the lanes and last_target recorded, init_from without its weights, a run directory
// that holds a run or cannot be made, a resume against another model, order or past its steps); the
// --set forms (a stage removed, a value given with a space) and the errors that name the --set;
// what a resumed run that has reached its steps says and exits with; run.log holding every line
// printed; and eval --predictions refused before the model is read.
#include <doctest/doctest.h>

#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

using test_util::contains;

test_util::ShellResult sh(const std::string& args) { return test_util::shell(std::string(PIPELINE_EXE) + " " + args); }

// `pipeline ARGS` fails (exit status 1) and says `message`; returns its output.
std::string refused(const std::string& args, const std::string& message) {
  auto r = sh(args);
  INFO(args << "\n" << r.out);
  CHECK(r.code == 1);
  CHECK(contains(r.out, message));
  return r.out;
}

const std::string kQuick = std::string(PIPELINE_SOURCE_DIR) + "/pipelines/quickstart.toml";

// About `kb` kB of varied English-like text, one paragraph a line.
void write_text(const fs::path& file, int kb) {
  std::ofstream out(file);
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "ROMEO", "speaks"};
  size_t n = 0;
  for (int i = 0; n < static_cast<size_t>(kb) * 1000; ++i) {
    std::string line;
    for (int w = 0; w < 40; ++w) line += std::string(words[(i * 7 + w * 3) % 12]) + (w % 9 == 8 ? ". " : " ");
    out << line << "\n";
    n += line.size() + 1;
  }
}

}  // namespace

TEST_CASE("check refuses the data a run would refuse, and passes the swap to read_tokens") {
  test_util::TempDir dir("check_data");
  write_text(dir.path / "corpus.txt", 300);
  const fs::path tokens = dir.path / "tok";
  // Blocks of 4 KiB: units enough for the lanes of the steps below.
  auto p = sh("prepare " + (dir.path / "corpus.txt").string() + " --split lines --tokens --block-bytes 4K --quiet --out " +
              tokens.string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const std::string on_tokens = kQuick + " --set data.dataset=" + tokens.string();

  // read_shards on token ids: check says so, as run does, and names the way out.
  const std::string text_reader = refused("check " + on_tokens, "stage 'read': building: " + tokens.string() +
                                          " holds token ids (prepared with --tokens), and [stages.read] (read_shards) reads text");
  CHECK(!contains(text_reader, "configuration valid"));
  refused("run " + on_tokens + " --set run.dir=" + (dir.path / "r").string(), "holds token ids (prepared with --tokens)");
  CHECK(!fs::exists(dir.path / "r"));  // a run that never started leaves no directory

  // The swap, with --set alone: read_tokens, tokenize removed, pack fed by read.
  const std::string swap = on_tokens + " --set stages.read.type=read_tokens --set stages.pack.input=read";
  const std::string leftover = refused("check " + swap, "(read's type from --set stages.read.type=read_tokens)");
  CHECK(contains(leftover, "leaves the graph with --set stages.tokenize="));
  auto swapped = sh("check " + swap + " --set stages.tokenize=");
  INFO(swapped.out);
  CHECK(swapped.code == 0);
  CHECK(contains(swapped.out, "ok: 7 stages, configuration valid"));
  CHECK(!contains(swapped.out, "stages.tokenize.workers"));
  CHECK(contains(swapped.out, "removed: [stages.tokenize] (--set stages.tokenize=)"));
  // A stage's own dataset, relative, is found beside the config as [data] dataset is (not only
  // in the working directory).
  fs::copy_file(kQuick, dir.path / "beside.toml");
  auto beside = sh("check " + (dir.path / "beside.toml").string() +
                   " --set stages.read.dataset=tok --set stages.read.type=read_tokens --set stages.tokenize= "
                   "--set stages.pack.input=read");
  INFO(beside.out);
  CHECK(beside.code == 0);
  CHECK(contains(beside.out, "configuration valid"));
  auto drawn = sh("graph " + swap + " --set stages.tokenize= --text");
  CHECK(contains(drawn.out, "read (read_tokens ×1, source)\n  │ tokens, cap 64\n  ▼\npack (pack ×1, ordered input)\n"));

  // read_tokens on text; a validation split too small for one evaluation batch; training
  // settings that cannot run on the device the config names.
  refused("check " + kQuick + " --set stages.read.type=read_tokens --set stages.tokenize= --set stages.pack.input=read",
          "holds text, and [stages.read] (read_tokens) reads token ids");
  const std::string small_val =
      refused("check " + swap + " --set stages.tokenize= --set training.batch_size=256 --set data.lanes=8",
              "stage 'eval': building: ");
  CHECK(contains(small_val, "fewer than one evaluation batch"));
  refused("check " + kQuick + " --set run.device=cpu --set training.cuda_graph=true",
          "stage 'train': building: [training] cuda_graph = true needs CUDA");
}

TEST_CASE("check settles the data order as run does, and refuses what run refuses in the lanes order") {
  test_util::TempDir dir("check_lanes");
  // K that does not divide the step's 8 rows: refused before any stage is built, by both.
  const std::string k3 = kQuick + " --set data.lanes=3";
  const std::string step = "[data] lanes = 3 does not divide the 8 rows of a step (batch_size 8 x grad_accum 1 x 1 process)";
  CHECK(!contains(refused("check " + k3, step), "configuration valid"));
  refused("run " + k3 + " --set run.dir=" + (dir.path / "k3").string(), step);

  // 64 lanes (auto: the step's rows, 8 x 8) over the bundled corpus's 62 units (blocks): the data
  // order's own sentence, from the read stage as it is built, in check as in run. The documents
  // order reads the same data and config without lanes: check passes it.
  const std::string wide = kQuick + " --set training.grad_accum=8 --set eval.every=0";
  const std::string units = refused("check " + wide, "stage 'read': building: ");
  CHECK(contains(units, "62 units for 64 lanes: every lane needs at least one unit"));
  CHECK(!contains(units, "configuration valid"));
  refused("run " + wide + " --set run.dir=" + (dir.path / "wide").string(), "62 units for 64 lanes");
  auto documents = sh("check " + wide + " --set data.order=documents");
  INFO(documents.out);
  CHECK(documents.code == 0);
  CHECK(contains(documents.out, "configuration valid"));

  // record_batches' last_target records a token stream only the documents order trains on.
  const std::string recorded = kQuick + " --set stages.rec.type=record_batches --set stages.rec.input=pack "
                               "--set stages.rec.last_target=true --set stages.h2d.input=rec";
  refused("check " + recorded,
          "stage 'rec': building: [stages.rec] last_target = true records a token stream, which only [data] order = "
          "\"documents\" trains on");
  auto in_documents = sh("check " + recorded + " --set data.order=documents");
  INFO(in_documents.out);
  CHECK(in_documents.code == 0);
}

TEST_CASE("check refuses Parquet without its text column, or without an evaluation source") {
  const std::string python = PIPELINE_ARROW_PYTHON;
  if (python.empty()) {
    MESSAGE("no Python with pyarrow configured: skipped");
    return;
  }
  test_util::TempDir dir("check_parquet");
  const fs::path file = dir.path / "docs.parquet";
  // Row groups of 25 rows: 8 units, one for each of the step's 8 lanes.
  auto w = test_util::shell(python + " -c \"import pyarrow as pa, pyarrow.parquet as pq; "
                                     "pq.write_table(pa.table({'body': ['document %d: ' % i + 'the quick brown fox ' * 20 "
                                     "for i in range(200)]}), '" + file.string() + "', row_group_size=25)\"");
  INFO(w.out);
  REQUIRE(w.code == 0);
  const std::string on_parquet = kQuick + " --set data.dataset=" + file.string();
  refused("check " + on_parquet + " --set eval.every=0",
          "stage 'read': building: " + file.string() + ": no column \"text\" (the file has: body)");
  auto ok = sh("check " + on_parquet + " --set eval.every=0 --set stages.read.column=body");
  INFO(ok.out);
  CHECK(ok.code == 0);
  refused("check " + on_parquet + " --set stages.read.column=body",
          "stage 'eval': building: " + file.string() + ": Parquet has no validation split");
}

TEST_CASE("--set: a value after a space, and errors that name the --set that caused them") {
  refused("check " + kQuick + " --set training.steps 7",
          "error: --set training.steps: expected section.key=value, with '=' and no space (write --set training.steps=7)");
  refused("graph " + kQuick + " --set stages.tokenize.workers 2", "(write --set stages.tokenize.workers=2)");
  refused("check " + kQuick + " --set stages.pack.input=nope",
          "error: --set stages.pack.input=nope: [stages.pack] input: no stage named 'nope'");
  refused("check " + kQuick + " --set model.preset=huge",
          "error: --set model.preset=huge: [model] preset: unknown model preset 'huge'");
  refused("check " + kQuick + " --set training.seq_len=256",
          "error: --set training.seq_len=256: [training] seq_len: 256 exceeds the model's context, block_size 128 "
          "(the preset \"small-cpu\"'s, " + kQuick + ":11)");
  refused("check " + kQuick + " --set model.block_size=64",
          "error: " + kQuick + ":19: [training] seq_len: 128 exceeds the model's context, block_size 64 "
          "([model] block_size, --set model.block_size=64)");
  refused("check " + kQuick + " --set model.n_head=3",
          "error: --set model.n_head=3: [model] GPTConfig: n_embd must be divisible by n_head");
  refused("check " + kQuick + " --set stages.nope=", "--set stages.nope=: there is no table [stages.nope] to remove");
}

TEST_CASE("a run directory that holds a run, or cannot be made, and resumes that train nothing") {
  test_util::TempDir dir("check_resume");
  const fs::path run_dir = dir.path / "r";
  const std::string tiny = kQuick + " --set model.preset=tiny --set training.seq_len=32 --set eval.every=0 "
                           "--set logging.live=off --set logging.every=1 ";
  // stdout alone: every line the run prints there is in run.log (the settings table, the final
  // tables and the verdict included), in the order printed.
  auto r = test_util::shell("(" + std::string(PIPELINE_EXE) + " run " + tiny + "--set training.steps=2 --set run.dir=" +
                            run_dir.string() + " 2>" + (dir.path / "stderr.txt").string() + ")");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string log = test_util::read_file(run_dir / "run.log");
  std::istringstream printed(r.out);
  size_t from = 0, lines = 0;
  for (std::string line; std::getline(printed, line); ++lines) {
    INFO(line);
    const size_t at = log.find(line, from);
    REQUIRE(at != std::string::npos);
    from = at + line.size();
  }
  CHECK(lines > 30);
  for (const char* part : {"| training.steps", "queue (consumer <- from)", "bottleneck", "done: 2 steps"})
    CHECK(contains(log, part));

  // A fresh run in that directory, and one under a file: check refuses both, as run would.
  refused("check " + tiny + "--set run.dir=" + run_dir.string(),
          run_dir.string() + " already holds a run with checkpoints; continue it with --resume");
  refused("check " + tiny + "--set run.dir=" + (run_dir / "run.log" / "x").string(),
          "cannot create the run directory " + (run_dir / "run.log" / "x").string());

  // Resumes: complete (exit 0, nothing trained), past its steps (exit 1), another model (refused).
  const std::string ckpt = (run_dir / "checkpoints" / "step_00000002.ckpt").string();
  auto complete = sh("run --resume " + run_dir.string());
  INFO(complete.out);
  CHECK(complete.code == 0);
  CHECK(contains(complete.out, "nothing to train: the run is complete, " + ckpt + " is at step 2 of [training] steps = 2"));
  CHECK(!contains(complete.out, "stopped at step"));
  const std::string past = refused("run --resume " + run_dir.string() + " --set training.steps=1",
                                   "error: " + ckpt + " is at step 2, past [training] steps = 1 (--set training.steps=1): "
                                   "the run cannot stop at a step it has passed, and nothing was trained");
  CHECK(!contains(past, "stopped at step 0"));
  refused("check --resume " + run_dir.string() + " --set training.steps=1", "past [training] steps = 1 (--set training.steps=1)");
  auto check_complete = sh("check --resume " + run_dir.string());
  CHECK(check_complete.code == 0);
  CHECK(contains(check_complete.out, "nothing to train: the run is complete"));
  auto check_more = sh("check --resume " + run_dir.string() + " --set training.steps=4");
  CHECK(check_more.code == 0);
  CHECK(contains(check_more.out, "configuration valid"));
  refused("check --resume " + run_dir.string() + " --set training.steps=4 --set model.n_layer=3", ckpt + " holds the model");
  // The order it was written in (the lanes order, K = the 8 rows of its steps) is the resume's.
  refused("check --resume " + run_dir.string() + " --set training.steps=4 --set data.order=documents",
          ckpt + " was written in the lanes order with 8 lanes, and --set data.order asks for \"documents\"");

  // [model] init_from whose weights are gone: check opens the files train would load.
  const fs::path hf = dir.path / "hf";
  auto exported = sh("export " + run_dir.string() + " --out " + hf.string());
  INFO(exported.out);
  REQUIRE(exported.code == 0);
  auto from_hf = sh("check " + tiny + "--set model.init_from=" + hf.string());
  INFO(from_hf.out);
  CHECK(from_hf.code == 0);
  fs::remove(hf / "model.safetensors");
  refused("check " + tiny + "--set model.init_from=" + hf.string(),
          "stage 'train': building: " + hf.string() + ": no model.safetensors or model.safetensors.index.json");

  // eval --predictions to a path that cannot be written: refused before the model is read.
  const fs::path items = dir.path / "items.jsonl", nowhere = dir.path / "no" / "such" / "preds.txt";
  test_util::write_file(items, "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}\n");
  const std::string eval = "eval " + run_dir.string() + " --hellaswag " + items.string() + " --predictions ";
  const std::string preds = refused(eval + nowhere.string(), "--predictions: " + nowhere.string());
  CHECK(!contains(preds, "loaded in"));  // the model was never read
  CHECK(!contains(preds, "hellaswag acc_norm"));
  refused(eval + dir.path.string(), "a directory; give the file to write");
}
