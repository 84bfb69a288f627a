// `pipeline check` as a dry run of `pipeline run`, from outside, as a new user meets it: the
// configs run refuses, check refuses too (a tokens dataset read as text, Parquet without its
// text column or without an evaluation source, a run directory that holds a run or cannot be
// made, a resume against another model or past its steps); the --set forms (a stage removed, a
// value given with a space) and the errors that name the --set; and what a resumed run that
// has reached its steps says and exits with.
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
  auto p = sh("prepare " + (dir.path / "corpus.txt").string() + " --split lines --tokens --quiet --out " + tokens.string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const std::string on_tokens = kQuick + " --set data.dataset=" + tokens.string();

  // read_shards on token ids: check says so, as run does, and names the way out.
  auto text_reader = sh("check " + on_tokens);
  INFO(text_reader.out);
  CHECK(text_reader.code == 1);
  CHECK(contains(text_reader.out, "stage 'read': building: " + tokens.string() +
                                      " holds token ids (prepared with --tokens), and [stages.read] (read_shards) reads text"));
  CHECK(!contains(text_reader.out, "configuration valid"));
  auto run = sh("run " + on_tokens + " --set run.dir=" + (dir.path / "r").string());
  CHECK(run.code == 1);
  CHECK(contains(run.out, "holds token ids (prepared with --tokens)"));
  CHECK(!fs::exists(dir.path / "r"));

  // The swap, with --set alone: read_tokens, tokenize removed, pack fed by read.
  const std::string swap = on_tokens + " --set stages.read.type=read_tokens --set stages.pack.input=read";
  auto leftover = sh("check " + swap);
  CHECK(leftover.code == 1);
  CHECK(contains(leftover.out, "(read's type from --set stages.read.type=read_tokens)"));
  CHECK(contains(leftover.out, "leaves the graph with --set stages.tokenize="));
  auto swapped = sh("check " + swap + " --set stages.tokenize=");
  INFO(swapped.out);
  CHECK(swapped.code == 0);
  CHECK(contains(swapped.out, "ok: 7 stages, configuration valid"));
  CHECK(!contains(swapped.out, "stages.tokenize.workers"));
  auto drawn = sh("graph " + swap + " --set stages.tokenize= --text");
  CHECK(contains(drawn.out, "read (read_tokens ×1, source)\n  │ tokens, cap 64\n  ▼\npack (pack ×1, ordered input)\n"));

  // read_tokens on text, and a validation split too small for one evaluation batch.
  auto token_reader = sh("check " + kQuick + " --set stages.read.type=read_tokens --set stages.tokenize= "
                         "--set stages.pack.input=read");
  CHECK(token_reader.code == 1);
  CHECK(contains(token_reader.out, "holds text, and [stages.read] (read_tokens) reads token ids"));
  auto small_val = sh("check " + swap + " --set stages.tokenize= --set training.batch_size=256");
  CHECK(small_val.code == 1);
  CHECK(contains(small_val.out, "stage 'eval': building: "));
  CHECK(contains(small_val.out, "fewer than one evaluation batch"));
  // Training settings that cannot run on the device the config names.
  auto graphs = sh("check " + kQuick + " --set run.device=cpu --set training.cuda_graph=true");
  CHECK(graphs.code == 1);
  CHECK(contains(graphs.out, "stage 'train': building: [training] cuda_graph = true needs CUDA"));
}

TEST_CASE("check refuses Parquet without its text column, or without an evaluation source") {
  const std::string python = PIPELINE_ARROW_PYTHON;
  if (python.empty()) {
    MESSAGE("no Python with pyarrow configured: skipped");
    return;
  }
  test_util::TempDir dir("check_parquet");
  const fs::path file = dir.path / "docs.parquet";
  auto w = test_util::shell(python + " -c \"import pyarrow as pa, pyarrow.parquet as pq; "
                                     "pq.write_table(pa.table({'body': ['document %d: ' % i + 'the quick brown fox ' * 20 "
                                     "for i in range(200)]}), '" + file.string() + "', row_group_size=50)\"");
  INFO(w.out);
  REQUIRE(w.code == 0);
  const std::string on_parquet = kQuick + " --set data.dataset=" + file.string();
  auto column = sh("check " + on_parquet + " --set eval.every=0");
  INFO(column.out);
  CHECK(column.code == 1);
  CHECK(contains(column.out, "stage 'read': building: "));
  CHECK(contains(column.out, "docs.parquet: no column \"text\" (the file has: body)"));
  auto ok = sh("check " + on_parquet + " --set eval.every=0 --set stages.read.column=body");
  INFO(ok.out);
  CHECK(ok.code == 0);
  auto no_val = sh("check " + on_parquet + " --set stages.read.column=body");
  CHECK(no_val.code == 1);
  CHECK(contains(no_val.out, "stage 'eval': building: " + file.string() + ": Parquet has no validation split"));
}

TEST_CASE("--set: a value after a space, and errors that name the --set that caused them") {
  auto space = sh("check " + kQuick + " --set training.steps 7");
  CHECK(space.code == 1);
  CHECK(contains(space.out, "--set training.steps: expected section.key=value, with '=' and no space "
                            "(write --set training.steps=7)"));
  auto input = sh("check " + kQuick + " --set stages.pack.input=nope");
  CHECK(contains(input.out, "error: --set stages.pack.input=nope: [stages.pack] input: no stage named 'nope'"));
  auto preset = sh("check " + kQuick + " --set model.preset=huge");
  CHECK(contains(preset.out, "error: --set model.preset=huge: [model] preset: unknown model preset 'huge'"));
  auto seq = sh("check " + kQuick + " --set training.seq_len=256");
  CHECK(contains(seq.out, "error: --set training.seq_len=256: [training] seq_len: 256 exceeds the model's context, "
                          "block_size 128 (the preset \"small-cpu\"'s, " + kQuick + ":11)"));
  auto block = sh("check " + kQuick + " --set model.block_size=64");
  CHECK(contains(block.out, "error: " + kQuick + ":19: [training] seq_len: 128 exceeds the model's context, "
                            "block_size 64 ([model] block_size, --set model.block_size=64)"));
  auto heads = sh("check " + kQuick + " --set model.n_head=3");
  CHECK(contains(heads.out, "error: --set model.n_head=3: [model] GPTConfig: n_embd must be divisible by n_head"));
  auto nothing = sh("check " + kQuick + " --set stages.nope=");
  CHECK(contains(nothing.out, "--set stages.nope=: there is no table [stages.nope] to remove"));
  // graph takes --set as check does.
  auto graph = sh("graph " + kQuick + " --set stages.tokenize.workers 2");
  CHECK(graph.code == 1);
  CHECK(contains(graph.out, "(write --set stages.tokenize.workers=2)"));
}

TEST_CASE("a run directory that holds a run, or cannot be made, and resumes that train nothing") {
  test_util::TempDir dir("check_resume");
  const fs::path run_dir = dir.path / "r";
  const std::string tiny = kQuick + " --set model.preset=tiny --set training.seq_len=32 --set eval.every=0 "
                           "--set logging.live=off --set logging.every=1 ";
  // stdout alone: every line the run prints there is in run.log (the settings table, the final
  // tables and the verdict included).
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
    REQUIRE(at != std::string::npos);  // in run.log, in the order printed
    from = at + line.size();
  }
  CHECK(lines > 30);
  for (const char* part : {"| training.steps", "queue (consumer <- from)", "bottleneck", "done: 2 steps"})
    CHECK(contains(log, part));

  // A fresh run in that directory, and one under a file: both refused by check, as run would.
  auto again = sh("check " + tiny + "--set run.dir=" + run_dir.string());
  CHECK(again.code == 1);
  CHECK(contains(again.out, run_dir.string() + " already holds a run with checkpoints; continue it with --resume"));
  auto under_file = sh("check " + tiny + "--set run.dir=" + (run_dir / "run.log" / "x").string());
  CHECK(under_file.code == 1);
  CHECK(contains(under_file.out, "cannot create the run directory " + (run_dir / "run.log" / "x").string()));

  // Resumes: complete (exit 0, nothing trained), past its steps (exit 1), another model (refused).
  const std::string ckpt = (run_dir / "checkpoints" / "step_00000002.ckpt").string();
  auto complete = sh("run --resume " + run_dir.string());
  INFO(complete.out);
  CHECK(complete.code == 0);
  CHECK(contains(complete.out, "nothing to train: the run is complete, " + ckpt + " is at step 2 of [training] steps = 2"));
  CHECK(!contains(complete.out, "stopped at step"));
  auto past = sh("run --resume " + run_dir.string() + " --set training.steps=1");
  CHECK(past.code == 1);
  CHECK(contains(past.out, "error: " + ckpt + " is at step 2, past [training] steps = 1 (--set training.steps=1): the "
                           "run cannot stop at a step it has passed, and nothing was trained"));
  CHECK(!contains(past.out, "stopped at step 0"));
  auto check_past = sh("check --resume " + run_dir.string() + " --set training.steps=1");
  CHECK(check_past.code == 1);
  CHECK(contains(check_past.out, "past [training] steps = 1 (--set training.steps=1)"));
  auto check_complete = sh("check --resume " + run_dir.string());
  CHECK(check_complete.code == 0);
  CHECK(contains(check_complete.out, "nothing to train: the run is complete"));
  auto check_more = sh("check --resume " + run_dir.string() + " --set training.steps=4");
  CHECK(check_more.code == 0);
  CHECK(contains(check_more.out, "configuration valid"));
  auto other_model = sh("check --resume " + run_dir.string() + " --set training.steps=4 --set model.n_layer=3");
  CHECK(other_model.code == 1);
  CHECK(contains(other_model.out, ckpt + " holds the model"));

  // eval --predictions to a path that cannot be written: refused before the model is read.
  test_util::write_file(dir.path / "items.jsonl", "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 0}\n");
  const fs::path nowhere = dir.path / "no" / "such" / "preds.txt";
  auto preds = sh("eval " + run_dir.string() + " --hellaswag " + (dir.path / "items.jsonl").string() +
                  " --predictions " + nowhere.string());
  INFO(preds.out);
  CHECK(preds.code == 1);
  CHECK(contains(preds.out, "--predictions: " + nowhere.string()));
  CHECK(!contains(preds.out, "loaded in"));  // the model was never read
  CHECK(!contains(preds.out, "hellaswag acc_norm"));
  auto into_dir = sh("eval " + run_dir.string() + " --hellaswag " + (dir.path / "items.jsonl").string() +
                     " --predictions " + dir.path.string());
  CHECK(contains(into_dir.out, "a directory; give the file to write"));
}
