// I/O faults during training, in-process: a checkpoint write that fails (file size limit)
// stops the run with a clear error or is logged and training goes on, as [checkpoint]
// on_error says; the previous checkpoint stays loadable and the run resumes from it; stale
// temporaries are pruned; a shard truncated mid-run ends the run with an error naming it and
// the byte offset (no hang); and dropout's random draws do not depend on thread timing.

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <torch/torch.h>

#include "base/atomic_file.h"
#include "model/checkpoint/checkpoint.h"
#include "train_harness.h"

// After the torch headers: c10 defines a glog-style CHECK macro that doctest must override.
#include <doctest/doctest.h>

#include "test_util.h"

namespace fs = std::filesystem;
using namespace pipeline;
using namespace train_harness;
using test_util::contains;
using test_util::error_of;
using test_util::FileSizeLimit;

namespace {

struct Threads {
  Threads() { at::set_num_threads(1); }
} threads_once;

std::vector<fs::path> files_in(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().string().size() >= suffix.size() &&
        e.path().string().compare(e.path().string().size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(e.path());
  return out;
}

model::CheckpointState small_state(int64_t step, float value) {
  model::CheckpointState s;
  s.step = step;
  s.metadata = "{\"step\":" + std::to_string(step) + "}";
  s.model.emplace_back("w", torch::full({256, 1024}, value));  // 1 MiB
  return s;
}

}  // namespace

TEST_CASE("a checkpoint write that fails leaves the previous checkpoint loadable and no temporary") {
  auto root = temp_dir("ckpt_fail");
  const auto path = (root / "step.ckpt").string();
  model::write_checkpoint(path, small_state(1, 1.0f));
  std::string err;
  {
    FileSizeLimit limit(256 << 10);
    err = error_of([&] { model::write_checkpoint(path, small_state(2, 2.0f)); });
  }
  INFO(err);
  CHECK(contains(err, path));
  CHECK(contains(err, "File too large"));
  CHECK(contains(err, "is unchanged"));
  CHECK(!fs::exists(path + ".tmp"));
  auto back = model::read_checkpoint(path);
  CHECK(back.step == 1);
  CHECK(torch::equal(back.model.at(0).second, torch::full({256, 1024}, 1.0f)));
  fs::remove_all(root);
}

TEST_CASE("a checkpoint whose shape does not fit the file is rejected before allocating") {
  auto root = temp_dir("ckpt_shape");
  const auto path = (root / "big.ckpt").string();
  model::write_checkpoint(path, small_state(1, 1.0f));
  // dims of "w" start right after the 64-byte header, the metadata, the name length, the name,
  // dtype, ndim and padding.
  const size_t dims_at = 64 + small_state(1, 1.0f).metadata.size() + 4 + 7 + 1 + 1 + 2;
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(dims_at));
    const int64_t huge[2] = {int64_t(1) << 40, int64_t(1) << 40};
    f.write(reinterpret_cast<const char*>(huge), sizeof huge);
  }
  auto err = error_of([&] { model::read_checkpoint(path); });
  INFO(err);
  CHECK(contains(err, "tensor 'model/w' of shape [1099511627776, 1099511627776]"));
  CHECK(contains(err, "overflows 64 bits"));
  CHECK(contains(err, "corrupt file"));
  fs::remove_all(root);
}

TEST_CASE("checkpoint on_error: stop ends the run with a clear error, warn trains on; both resume") {
  for (const std::string mode : {"stop", "warn"}) {
    CAPTURE(mode);
    auto root = temp_dir("on_error_" + mode);
    auto dir = root / "run";
    // 4 steps and a good checkpoint, then a resumed run to 8 whose checkpoint cannot be written.
    auto first = run(tiny_config(dir, kTextInput), dir, {"training.steps=4", "checkpoint.on_error=" + mode});
    REQUIRE(first.last_step == 4);
    const auto good = dir / "checkpoints" / "step_00000004.ckpt";
    REQUIRE(fs::exists(good));
    std::string err;
    RunResult second;
    {
      FileSizeLimit limit(4 << 20);  // the tiny model's checkpoint is ~40 MB; logs stay far below
      err = error_of([&] { second = run("", dir, {"training.steps=8"}, dir); });
    }
    if (mode == "stop") {
      INFO(err);
      CHECK(contains(err, "checkpoint"));
      CHECK(contains(err, "checkpoint of step 8 not written"));
      CHECK(contains(err, "File too large"));
      CHECK(contains(err, "the last good checkpoint is " + good.string()));
      CHECK(contains(err, "on_error = \"warn\""));
    } else {
      CHECK(err.empty());
      CHECK(second.last_step == 8);
      CHECK(second.checkpoint == good.string());  // still the newest good one
    }
    CHECK(files_in(dir / "checkpoints", ".tmp").empty());
    CHECK(model::read_checkpoint(good.string()).step == 4);
    // Without the fault the run resumes from the good checkpoint and finishes.
    auto third = run("", dir, {"training.steps=8"}, dir);
    CHECK(third.last_step == 8);
    CHECK(fs::exists(dir / "checkpoints" / "step_00000008.ckpt"));
    fs::remove_all(root);
  }
}

TEST_CASE("checkpoint pruning removes temporaries a killed writer left behind") {
  auto root = temp_dir("stale_tmp");
  auto dir = root / "run";
  fs::create_directories(dir / "checkpoints");
  std::ofstream(dir / "checkpoints" / "step_00000003.ckpt.tmp") << "half a checkpoint";
  std::ofstream(dir / "checkpoints" / "notes.tmp") << "not ours: kept";
  auto r = run(tiny_config(dir, kTextInput), dir, {"training.steps=4"});
  CHECK(r.last_step == 4);
  CHECK(!fs::exists(dir / "checkpoints" / "step_00000003.ckpt.tmp"));
  CHECK(fs::exists(dir / "checkpoints" / "notes.tmp"));
  fs::remove_all(root);
}

TEST_CASE("a shard truncated while training reads it ends the run with its name and offset") {
  auto root = temp_dir("truncated");
  fs::copy(kData + "text", root / "data");
  const auto shard = root / "data" / "train_00000.text.zst";
  REQUIRE(fs::file_size(shard) > 200'000);
  auto dir = root / "run";
  auto start = std::chrono::steady_clock::now();
  auto err = error_of([&] {
    run(tiny_config(dir, kTextInput, (root / "data").string()), dir,
        {"training.steps=100000", "checkpoint.every=0", "checkpoint.at_end=false"}, {},
        [&](graph::Engine&, stages::RunContext& ctx) {
          // The reader has opened the shard and buffered its first 128 KiB by now.
          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (ctx.last_step.load() < 1 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          fs::resize_file(shard, 140'000);
        });
  });
  INFO(err);
  CHECK(contains(err, "train_00000.text.zst"));
  // The lanes' reader checks each block's file against the size its catalogue listed before it
  // reads the block (datasets/lanes); a reader that had already begun a read sees the short file.
  const bool named = (contains(err, "the file changed after the run listed it (") && contains(err, "140000 now)")) ||
                     contains(err, "byte 140000: the file ends before its");
  CHECK(named);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::minutes(5));
  fs::remove_all(root);
}

TEST_CASE("with dropout, losses and resume do not depend on thread timing") {
  auto root = temp_dir("dropout");
  const std::string eval = "[stages.eval]\ntype = \"eval\"\ninput = \"train\"\n";
  const std::vector<std::string> sets = {"model.dropout=0.2", "eval.every=2", "eval.batches=1", "eval.sample_tokens=0"};
  auto a = run(tiny_config(root / "a", kTextInput + eval), root / "a", sets);
  auto b = run(tiny_config(root / "b", kTextInput + eval), root / "b", sets);
  REQUIRE(a.losses.size() == 8);
  CHECK(a.losses == b.losses);
  // Taken back to its step-4 checkpoint and resumed: the same dropout masks, the same losses.
  fs::remove(root / "b" / "checkpoints" / "step_00000008.ckpt");
  fs::remove(root / "b" / "metrics.jsonl");
  auto resumed = run("", root / "b", {}, root / "b");
  REQUIRE(resumed.losses.size() == 4);
  for (int64_t s = 5; s <= 8; ++s) CHECK(resumed.losses[s] == a.losses[s]);
  fs::remove_all(root);
}
